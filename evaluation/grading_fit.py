"""Fit the request grader on expert trajectories, and measure how often it grades a request as its expert needed.

    simplan fit-grader --train runs/pipeline/shop/data/train.jsonl --dev runs/pipeline/shop/data/dev.jsonl \\
        --out runs/fit-grader/shop

Each task's expert trajectory (policy "expert", the first one per task) is one labelled request: its grade is what
the expert's path needed (data/grades.py `expert_grade`: ambiguous when it asked the user, else trivial,
single-step or multi-step by its commands and tool calls), its words those of the goal and the first observation
(`request_words`). The grader (inference/planning/grading.py RequestGrader) is fitted on the train files and
measured on the dev files: accuracy, per grade (recall, precision) and per task family, the confusion table, and,
where the env declares a `grade_request` rule, the rule's accuracy on the same requests. Written to `out`:
grader.json (what `--grading.grader` reads), metrics.json and metrics.md.

With `routes_from` (eval run folders of the same tasks, each with the route it ran: `{runs/off: {}, runs/noask:
{ask: false}}`), the routes are fitted too: every task all the runs played is graded by the grader, and each grade
gets the route of the run that won the most of its tasks, then spent the fewest tokens per success; they go into
grader.json, where the planner reads them unless `grading.routes` is given.

The env of a trajectory is made once per (env, env_kwargs) to read its ask tool and rule (EnvDefaults.ask_tool,
grade_request); `ask_tool` names the tool instead where the env cannot be made here.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from simplan.core.errors import InputError
from simplan.core.io import write_json, write_text
from simplan.data.build_inputs import expand_inputs, load_trajectories
from simplan.data.grades import expert_grade, request_words
from simplan.data.trajectory import Trajectory
from simplan.envs.base import GRADES, env_extra
from simplan.inference.planning.grading import GRADER_FILE, RequestGrader, check_routes


def _help(text: str) -> dict[str, str]:
    return {"help": text}


@dataclass
class FitGraderConfig:
    train: list[str] = field(default_factory=list, metadata=_help("trajectory JSONL files (their experts' paths)"))
    dev: list[str] = field(default_factory=list, metadata=_help("trajectory JSONL files the accuracy is measured on"))
    out: str = field(default="runs/fit-grader", metadata=_help(f"folder for {GRADER_FILE}, metrics.json, metrics.md"))
    ask_tool: str = field(
        default="", metadata=_help("the env's ask tool ('' = each env's own, made with the trajectory's env_kwargs)")
    )
    routes_from: dict = field(
        default_factory=dict,
        metadata=_help(
            "eval run folders of the same tasks, each with the route it ran, e.g. '{runs/off: {}, runs/noask: "
            "{ask: false}}': each grade gets the route whose run won the most of its tasks, then the fewest tokens "
            "per success, saved in the grader file"
        ),
    )

    def __post_init__(self) -> None:
        if not self.train:
            raise ValueError("train: give the trajectories to fit on (`simplan collect --out`, policy expert)")
        if len(self.routes_from) == 1:
            raise ValueError("routes_from: give at least two runs to choose between, or none")
        for run, route in self.routes_from.items():
            check_routes({"multi-step": route}, f"routes_from[{run!r}]")


@dataclass
class Request:
    """One task's request, the grade its expert's path needed, and the env's own grade of it (None: no rule)."""

    task_id: str
    family: str
    words: list[str]
    grade: str
    env_grade: str | None = None


class EnvLookup:
    """Each (env, env_kwargs) of the trajectories made once: its ask tool and its grade_request rule."""

    def __init__(self, ask_tool: str) -> None:
        self.ask_tool, self.envs = ask_tool, {}

    def env(self, t: Trajectory) -> Any:
        kwargs = t.meta.get("env_kwargs") or {}
        key = (t.env, json.dumps(kwargs, sort_keys=True))
        if key not in self.envs:
            from simplan.envs.registry import make_env

            try:
                self.envs[key] = make_env(t.env, **kwargs)
            except Exception as e:  # an env this machine cannot make: the ask tool must be named
                if not self.ask_tool:
                    raise InputError(
                        f"env {t.env!r} (env_kwargs {kwargs}) cannot be made here ({type(e).__name__}: "
                        f"{e}); name its ask tool with --ask_tool NAME (or --ask_tool none)"
                    ) from None
                self.envs[key] = None
        return self.envs[key]

    def request(self, t: Trajectory) -> Request:
        env = self.env(t)
        ask = self.ask_tool or (env_extra(env, "ask_tool") if env is not None else None)
        rule = env_extra(env, "grade_request") if env is not None else None
        env_grade = rule(t.goal, t.initial_observation) if callable(rule) else None
        needed = expert_grade(t, ask if ask != "none" else None)
        return Request(t.task.task_id, t.task.family, request_words(t.goal, t.initial_observation), needed, env_grade)

    def close(self) -> None:
        for env in self.envs.values():
            if env is not None:
                env.close()


def expert_requests(files: list[str], lookup: EnvLookup) -> list[Request]:
    """One request per task: its first expert trajectory that ran to its end."""
    loaded = load_trajectories(expand_inputs(files))
    seen: set[tuple[str, str]] = set()
    out = []
    for t in loaded.trajectories:
        key = (t.env, t.task.task_id)
        if t.policy != "expert" or t.status != "ok" or key in seen:
            continue
        seen.add(key)
        out.append(lookup.request(t))
    if not out:
        bad = (
            f"; {len(loaded.problems)} problem(s) reading them, the first: {loaded.problems[0]}"
            if loaded.problems
            else ""
        )
        raise InputError(f"train/dev: no expert trajectory in {files}{bad}; collect with --policies expert")
    return out


def accuracy(requests: list[Request], predicted: list[str]) -> dict[str, Any]:
    """Accuracy, per grade recall and precision, per family, and the confusion table (true -> predicted -> n)."""
    right = [p == r.grade for r, p in zip(requests, predicted)]
    confusion: dict[str, Counter] = defaultdict(Counter)
    families: dict[str, list[bool]] = defaultdict(list)
    for r, p, ok in zip(requests, predicted, right):
        confusion[r.grade][p] += 1
        families[r.family].append(ok)
    grades = {}
    for g in GRADES:
        true = sum(confusion[g].values())
        said = sum(c[g] for c in confusion.values())
        if true or said:
            hit = confusion[g][g]
            grades[g] = {"n": true, "recall": hit / true if true else None, "precision": hit / said if said else None}
    return {
        "n": len(requests),
        "accuracy": sum(right) / len(right) if right else None,
        "grades": grades,
        "families": {f: {"n": len(v), "accuracy": sum(v) / len(v)} for f, v in sorted(families.items())},
        "confusion": {g: dict(c) for g, c in confusion.items()},
    }


def run_episodes(run: str, grader: RequestGrader) -> dict[tuple[str, str], tuple[str, bool, int]]:
    """(env, task id) -> (the request's grade by `grader`, won, tokens) of each episode of one eval run's arm."""
    from simplan.evaluation.metrics import trace_files
    from simplan.inference.planning.trace import read_traces, summarize

    out, arms = {}, set()
    for path in trace_files(run):
        for trace in read_traces(path):
            start, s = trace.events[0], summarize(trace)
            arms.add(trace.arm)
            grade = grader.grade(request_words(start.goal, start.observation))[0]
            out[(trace.env, s.task_id)] = (grade, s.success, s.total_tokens)
    if len(arms) > 1:
        raise InputError(f"routes_from: {run} holds the arms {sorted(arms)}; give one run folder per route and arm")
    return out


def fit_routes(routes_from: dict[str, dict], grader: RequestGrader) -> dict[str, Any]:
    """Per grade, the route of the run that won the most of that grade's tasks (those every run played), then spent
    the fewest tokens per success; a grade no run won gets no fitted route (the default applies)."""
    runs = {run: run_episodes(run, grader) for run in routes_from}
    shared = set.intersection(*(set(eps) for eps in runs.values()))
    if not shared:
        raise InputError(f"routes_from: the runs {sorted(runs)} share no task; give runs of the same suite")
    table: dict[str, Any] = {}
    for grade in GRADES:
        tasks = sorted(t for t in shared if next(iter(runs.values()))[t][0] == grade)
        if not tasks:
            continue
        rows = {}
        for run, eps in runs.items():
            won = sum(eps[t][1] for t in tasks)
            tokens = sum(eps[t][2] for t in tasks)
            rows[run] = {"tasks": len(tasks), "won": won, "tokens_per_success": tokens / won if won else None}
        best = max(rows, key=lambda r: (rows[r]["won"], -(rows[r]["tokens_per_success"] or float("inf"))))
        table[grade] = {"runs": rows, "chosen": best if rows[best]["won"] else None}
        if rows[best]["won"]:
            table[grade]["route"] = dict(routes_from[best])
    return table


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def markdown(metrics: dict[str, Any]) -> str:
    lines = ["# Request grader", ""]
    train = metrics["train"]
    lines += [f"Fitted on {train['n']} expert requests: " + ", ".join(f"{g} {n}" for g, n in train["grades"].items())]
    if len(train["grades"]) == 1:
        only = next(iter(train["grades"]))
        note = f"Every train request needed {only}: the grader gives it to every request, and its accuracy says"
        lines += ["", f"{note} only how many dev requests need it too."]
    lines += ["", "Words that most raise each grade:"]
    lines += [f"- {g}: {', '.join(words)}" for g, words in metrics["top_words"].items()]
    for name in ("dev", "env_rule"):
        m = metrics.get(name)
        if not m:
            continue
        title = "The fitted grader on dev" if name == "dev" else "The env's grade_request rule on the same requests"
        lines += ["", f"## {title}", "", f"Accuracy {_pct(m['accuracy'])} on {m['n']} requests.", ""]
        lines += ["| grade | requests | recall | precision |", "|---|---:|---:|---:|"]
        lines += [f"| {g} | {v['n']} | {_pct(v['recall'])} | {_pct(v['precision'])} |" for g, v in m["grades"].items()]
        lines += ["", "| family | requests | accuracy |", "|---|---:|---:|"]
        lines += [f"| {f} | {v['n']} | {_pct(v['accuracy'])} |" for f, v in m["families"].items()]
        shown = [g for g in GRADES if g in m["grades"]]
        lines += ["", "| needed \\ graded | " + " | ".join(shown) + " |", "|---|" + "---:|" * len(shown)]
        for t in shown:
            lines.append(f"| {t} | " + " | ".join(str(m["confusion"].get(t, {}).get(p, 0)) for p in shown) + " |")
    if metrics.get("routes"):
        lines += ["", "## Routes fitted from paired runs", ""]
        lines += ["The tasks every run played, graded by the grader; per grade the route of the run that won the",
                  "most, then spent the fewest tokens per success.", ""]  # fmt: skip
        lines += [
            "| grade | run | route | tasks | won | tokens per success | chosen |",
            "|---|---|---|---:|---:|---:|---|",
        ]
        for grade, fit in metrics["routes"].items():
            for run, row in fit["runs"].items():
                tps = "-" if row["tokens_per_success"] is None else f"{row['tokens_per_success']:,.0f}"
                route = json.dumps(metrics["config"]["routes_from"][run])
                chosen = "yes" if fit["chosen"] == run else ""
                lines.append(f"| {grade} | {run} | `{route}` | {row['tasks']} | {row['won']} | {tps} | {chosen} |")
    return "\n".join(lines) + "\n"


def fit_grader(cfg: FitGraderConfig) -> dict[str, Any]:
    """Fit on `train`, measure on `dev`, write grader.json, metrics.json and metrics.md to `out`."""
    lookup = EnvLookup(cfg.ask_tool)
    try:
        train = expert_requests(cfg.train, lookup)
        dev = expert_requests(cfg.dev, lookup) if cfg.dev else []
    finally:
        lookup.close()
    grader = RequestGrader.fit([r.words for r in train], [r.grade for r in train])
    metrics: dict[str, Any] = {
        "config": asdict(cfg),
        "train": {"n": len(train), "grades": dict(Counter(r.grade for r in train))},
        "top_words": grader.top_words(),
    }
    if cfg.routes_from:
        metrics["routes"] = fit_routes(cfg.routes_from, grader)
        grader.routes = {g: fit["route"] for g, fit in metrics["routes"].items() if "route" in fit}
    if dev:
        metrics["dev"] = accuracy(dev, [grader.grade(r.words)[0] for r in dev])
        ruled = [r for r in dev if r.env_grade is not None]
        if ruled:
            metrics["env_rule"] = accuracy(ruled, [r.env_grade for r in ruled])
    out = Path(cfg.out)
    grader.save(out / GRADER_FILE)
    write_json(out / "metrics.json", metrics)
    write_text(out / "metrics.md", markdown(metrics))
    return {"out": out, "grader": grader, "metrics": metrics}
