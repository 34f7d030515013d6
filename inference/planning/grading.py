"""Grading a request before its episode, and the route its grade takes: which budgets, and whether it may ask.

    grading = Grading.from_config(config.grading, env)           # None when grading is off
    grade = grading.grade(goal, first_observation)              # GradeEvent(grade, by, probabilities, route, withheld)
    budgets = Router(config).budgets(task, grade.route)         # the route's budgets over the family's

The grades are data/grades.py's (trivial, single-step, multi-step, ambiguous: what the expert's path needed).
`grading.mode` says who grades:

    off      no grade; every episode gets the config's budgets (the default)
    fitted   the request grader fitted on expert trajectories (`simplan fit-grader`, evaluation/grading_fit.py):
             a multinomial naive Bayes over the words of the goal and the first observation (data/grades.py
             request_words), saved as grader.json
    env      the env's own rule (EnvDefaults.grade_request), where it gives one; else the fitted grader if one
             is given

`grading.routes` maps a grade to what its episodes get: budget keys (k, horizon, max_steps, max_replans,
token_budget, stall_steps; horizon 0 with k 1 acts reactively) and `ask` (false withholds the env's ask tool: it
is not shown to the decider, constrained decoding cannot name it, and a call to it is a parse failure, never
executed). Left at None, the routes are those fitted into the grader file, if any: `simplan fit-grader
--routes_from` reads eval runs of the same tasks, one route each, and gives each grade the route whose run won the
most of that grade's tasks, then spent the fewest tokens per success. Otherwise only an ambiguous request may ask
(measured on the ambiguous shop: bench/RESULTS.md "Grading requests"); a grade a table leaves out takes that
default. Each episode's grade is traced (the grade event) with the grader's probabilities and its route.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
from collections import Counter
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from simplan.core.errors import InputError
from simplan.core.io import write_json
from simplan.data.grades import request_words
from simplan.envs.actions import tool_specs
from simplan.envs.base import GRADES, Observation, env_extra
from simplan.inference.planning.router import FAMILY_BUDGET_KEYS, gives_horizon
from simplan.inference.planning.trace_events import GradeEvent

GRADING_MODES = ("off", "fitted", "env")
GRADER_FILE = "grader.json"
ROUTE_KEYS = (*FAMILY_BUDGET_KEYS, "ask")


def _help(text: str) -> dict[str, str]:
    return {"help": text}


def _default_routes() -> dict[str, dict[str, Any]]:
    # Asking costs the user a turn: only a request graded ambiguous may ask (bench/RESULTS.md "Grading requests").
    return {grade: {"ask": False} for grade in GRADES if grade != "ambiguous"}


@dataclass
class GradingConfig:
    """How a request is graded before its episode, and what each grade gets: PlannerConfig's `grading` section."""

    mode: str = field(
        default="off",
        metadata=_help(
            "off (no grade), fitted (the grader file, `simplan fit-grader`) or env (the env's grade_request rule, "
            "else the grader file where given)"
        ),
    )
    grader: str = field(default="", metadata=_help(f"the fitted request grader ({GRADER_FILE}, `simplan fit-grader`)"))
    routes: dict | None = field(
        default=None,
        metadata=_help(
            "per grade (trivial, single-step, multi-step, ambiguous): budget keys (k, horizon, max_steps, "
            "max_replans, token_budget, stall_steps) and ask (false: the env's ask tool is withheld); None: the "
            "routes fitted into the grader file (`simplan fit-grader --routes_from`), else only ambiguous requests "
            "may ask; a grade left out takes that default"
        ),
    )

    def __post_init__(self) -> None:
        if self.mode not in GRADING_MODES:
            raise ValueError(f"grading.mode: {self.mode!r} is not one of {', '.join(GRADING_MODES)}")
        if self.mode == "fitted" and not self.grader:
            raise ValueError(f"grading.grader: mode fitted needs a grader file ({GRADER_FILE}, `simplan fit-grader`)")
        if self.routes is not None:
            check_routes(self.routes, "grading.routes")


def check_routes(routes: dict, where: str) -> None:
    """ValueError naming `where` unless `routes` maps grades to route keys (ask a bool)."""
    for grade, route in routes.items():
        if grade not in GRADES:
            raise ValueError(f"{where}: {grade!r} is not a grade; use {', '.join(GRADES)}")
        bad = set(route) - set(ROUTE_KEYS) if isinstance(route, dict) else {"<not a mapping>"}
        if bad:
            raise ValueError(f"{where}[{grade!r}]: unknown keys {sorted(bad)}; use {sorted(ROUTE_KEYS)}")
        if "ask" in route and not isinstance(route["ask"], bool):
            raise ValueError(f"{where}[{grade!r}].ask: must be true or false, got {route['ask']!r}")


@dataclass
class RequestGrader:
    """Multinomial naive Bayes of a request's grade on its words (data/grades.py request_words), with add-one
    smoothing: small, exact to refit, and readable (`top_words` says what it learned)."""

    grades: list[str]
    counts: dict[str, dict[str, int]]  # grade -> word -> count over its requests
    requests: dict[str, int]  # grade -> requests seen (the prior)
    routes: dict[str, dict[str, Any]] | None = None  # fitted per grade from paired runs (`fit-grader --routes_from`)

    @classmethod
    def fit(cls, requests: list[list[str]], grades: list[str]) -> RequestGrader:
        if not requests or len(requests) != len(grades):
            raise ValueError(f"RequestGrader.fit: {len(requests)} requests and {len(grades)} grades")
        seen = [g for g in GRADES if g in set(grades)]
        counts: dict[str, Counter] = {g: Counter() for g in seen}
        for words, grade in zip(requests, grades):
            counts[grade].update(words)
        return cls(seen, {g: dict(c) for g, c in counts.items()}, dict(Counter(grades)))

    @functools.cached_property
    def vocabulary(self) -> frozenset[str]:
        """Every word the grader saw, in any grade."""
        return frozenset(w for c in self.counts.values() for w in c)

    def probabilities(self, words: list[str]) -> dict[str, float]:
        """P(grade | words) for each grade the grader saw, summing to 1; words it never saw are left out."""
        vocabulary = self.vocabulary
        total = sum(self.requests.values())
        scores = {}
        for g in self.grades:
            c = self.counts[g]
            denominator = sum(c.values()) + len(vocabulary)
            scores[g] = math.log(self.requests[g] / total) + sum(
                math.log((c.get(w, 0) + 1) / denominator) for w in words if w in vocabulary
            )
        top = max(scores.values())
        exp = {g: math.exp(s - top) for g, s in scores.items()}
        norm = sum(exp.values())
        return {g: exp[g] / norm for g in self.grades}

    def grade(self, words: list[str]) -> tuple[str, dict[str, float]]:
        probs = self.probabilities(words)
        return max(self.grades, key=lambda g: (probs[g], -self.grades.index(g))), probs

    def top_words(self, n: int = 8) -> dict[str, list[str]]:
        """Per grade, the words that most raise it over the others (log-ratio of smoothed frequencies)."""
        vocabulary = self.vocabulary
        out = {}
        for g in self.grades:
            mine = self.counts[g]
            rest: Counter = Counter()
            for other in self.grades:
                if other != g:
                    rest.update(self.counts[other])
            m, r = sum(mine.values()) + len(vocabulary), sum(rest.values()) + len(vocabulary)
            ratio = {w: math.log((mine.get(w, 0) + 1) / m) - math.log((rest.get(w, 0) + 1) / r) for w in mine}
            out[g] = sorted(ratio, key=lambda w: (-ratio[w], w))[:n]
        return out

    def to_dict(self) -> dict[str, Any]:
        fitted = {"routes": self.routes} if self.routes is not None else {}
        return {
            "model": "naive_bayes",
            "grades": self.grades,
            "requests": self.requests,
            "counts": self.counts,
            **fitted,
        }

    def save(self, path: str | Path) -> Path:
        write_json(path, self.to_dict())
        return Path(path)

    @classmethod
    def load(cls, path: str | Path) -> RequestGrader:
        p = Path(path)
        try:
            d = json.loads(p.read_text())
            grader = cls(list(d["grades"]), {g: dict(c) for g, c in d["counts"].items()}, dict(d["requests"]))
            if d.get("routes") is not None:
                check_routes(d["routes"], f"{p} routes")
                grader.routes = {g: dict(r) for g, r in d["routes"].items()}
        except FileNotFoundError:
            raise InputError(f"grading.grader: {p} does not exist; fit one with `simplan fit-grader`") from None
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise InputError(f"grading.grader: {p} is not a request grader ({type(e).__name__}: {e})") from None
        unknown = set(grader.grades) - set(GRADES)
        if unknown or set(grader.counts) != set(grader.grades):
            raise InputError(f"grading.grader: {p} has grades {sorted(grader.counts)}; expected some of {GRADES}")
        return grader


class Grading:
    """The grader of one planner: the env's rule and/or the fitted grader, and the routes."""

    def __init__(self, config: GradingConfig, env: object, grader: RequestGrader | None) -> None:
        self.config, self.grader = config, grader
        # The config's routes, else the grader file's fitted ones, else only an ambiguous request may ask.
        fitted = grader.routes if grader is not None else None
        self.routes = (
            config.routes if config.routes is not None else fitted if fitted is not None else _default_routes()
        )
        rule = env_extra(env, "grade_request")
        self.rule = rule if config.mode == "env" and callable(rule) else None
        self.ask_tool = env_extra(env, "ask_tool")
        if self.rule is None and self.grader is None:
            raise InputError(
                "grading.mode: env, but the env declares no grade_request rule and no grader file is given; "
                "fit one with `simplan fit-grader` and pass --grading.grader PATH, or use --grading.mode off"
            )

    def simulates(self) -> bool:
        """Whether a route gives a horizon (the planner then needs the simulator adapter)."""
        return gives_horizon(self.routes.values())

    @classmethod
    def from_config(cls, config: GradingConfig, env: object) -> Grading | None:
        if config.mode == "off":
            return None
        return cls(config, env, RequestGrader.load(config.grader) if config.grader else None)

    def grade(self, goal: str, observation: str) -> GradeEvent:
        """The request's grade, who gave it and the route it takes, as the trace records it."""
        grade, by, probs = None, "env", {}
        if self.rule is not None:
            grade = self.rule(goal, observation)
            if grade is not None and grade not in GRADES:
                raise ValueError(f"the env's grade_request returned {grade!r}, not one of {', '.join(GRADES)}")
        if grade is None:
            if self.grader is None:
                raise ValueError("the env's grade_request gave no grade and no grader file is given")
            grade, probs = self.grader.grade(request_words(goal, observation))
            by, probs = "fitted", {g: round(p, 4) for g, p in probs.items()}
        route = dict(self.routes[grade] if grade in self.routes else _default_routes().get(grade, {}))
        ask = route.pop("ask", True)
        withheld = [self.ask_tool] if self.ask_tool and not ask else []
        return GradeEvent(grade=grade, by=by, probabilities=probs, route=route, withheld=withheld)


def withhold(obs: Observation, names: Collection[str]) -> Observation:
    """`obs` without the tools named in `names` (as the episode's decider sees it and its calls are checked)."""
    if not names or not obs.tools:
        return obs
    kept = [t for t in obs.tools if not any(spec.get("name") in names for spec in tool_specs([t]))]
    return dataclasses.replace(obs, tools=kept)
