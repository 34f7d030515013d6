"""The trajectory schema: dataclasses in code, one JSON object per line on disk.

Schema version 2 (`schema_version: 2`; version-1 records read as version 2 without alternatives). A Trajectory
is one episode:

    id            unique episode id ("{env}/{task_id}/{policy}/{attempt}")
    env, task     the environment name and the Task record (task_id, fold, family, params)
    goal          the task's goal text
    policy        who acted: "expert", "noisy_expert", "random", or an agent arm ("reactive", ...)
    tools         tool schemas (tool envs) or null
    initial_observation   the observation after reset
    steps         list of Step (below)
    success, final_score, status ("ok" | "truncated" | "errored"), error (message when errored)
    meta          free-form provenance (seed, noise rate, versions, timings)

A Step is one real transition:

    index, observation (text before acting), valid_actions (list or null), action (Action record),
    source ("expert" | "noise" | "random" | "recovery" | "policy": who chose the action),
    next_observation, reward, score, done, won, error (the action failed or was invalid),
    expectation (the planner's predicted observation, or null), info (env extras),
    notes (optional: lines the prompt showed with the observation, e.g. the planner's pivot reasons),
    alternatives (optional, version 2: list of Alternative, below; written only when there are some)

An Alternative is what the real env returned when another action was played instead of the step's own,
from the step's state (the state before the step; data/counterfactual.py plays them):

    action, next_observation, reward, score, done, won, error (as in a Step),
    outcome (one of data/outcomes.py OUTCOMES: "error", "no_change", "progress", "won", "lost")

Consumers that do not ask for alternatives never see them: a Step's other fields are the recorded path.
Check files with `simplan validate FILE`.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from typing import Any

from simplan.data.outcomes import OUTCOMES
from simplan.envs.base import ACTION_KINDS, FOLDS, Action, Task

SCHEMA_VERSION = 2
READ_VERSIONS = (1, 2)  # a version-1 record is a version-2 record without alternatives
STEP_SOURCES = ("expert", "noise", "random", "recovery", "policy")
STATUSES = ("ok", "truncated", "errored")


@dataclass
class Alternative:
    """What the real env returned when `action` was played instead of the step's own, from the step's state."""

    action: Action
    next_observation: str
    reward: float = 0.0
    score: float = 0.0
    done: bool = False
    won: bool = False
    error: bool = False  # the env flagged the action as failed or invalid
    outcome: str = "no_change"  # data/outcomes.py classify_outcome

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def _from_checked(d: dict[str, Any]) -> Alternative:
        return Alternative(**{**d, "action": Action.from_dict(d["action"])})


@dataclass
class Step:
    index: int
    observation: str
    action: Action
    next_observation: str
    reward: float = 0.0
    score: float = 0.0
    done: bool = False
    won: bool = False
    error: bool = False
    valid_actions: list[str] | None = None
    source: str = "expert"
    expectation: str | None = None
    info: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)  # shown with `observation` (the planner's pivot reasons)
    alternatives: list[Alternative] = field(default_factory=list)  # other actions from this step's state
    # What `observation` told as belief-state facts (envs/subgoals.py Fact.to_dict), by the env's `facts`
    # extractor; a window's snapshot shows the facts of the steps before it (PromptSettings.snapshot).
    facts: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["action"] = self.action.to_dict()
        for optional in ("alternatives", "facts"):  # a record without them reads as it did before they existed
            if not d[optional]:
                del d[optional]
        return d

    @staticmethod
    def from_dict(d: dict[str, Any]) -> Step:
        """A Step from its JSON form; raises `InvalidRecord` naming every bad field."""
        problems = step_problems(d) + _json_value_problems(d, "")
        if problems:
            raise InvalidRecord(problems)
        return Step._from_checked(d)

    @staticmethod
    def _from_checked(d: dict[str, Any]) -> Step:
        d = dict(d)
        d["action"] = Action.from_dict(d["action"])
        d["info"] = d.get("info") or {}
        d["alternatives"] = [Alternative._from_checked(a) for a in d.get("alternatives") or []]
        return Step(**d)


@dataclass
class Trajectory:
    id: str
    env: str
    task: Task
    goal: str
    policy: str
    initial_observation: str
    steps: list[Step] = field(default_factory=list)
    tools: list[dict[str, Any]] | None = None
    success: bool = False
    final_score: float = 0.0
    status: str = "ok"
    error: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    schema_version: int = SCHEMA_VERSION

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": self.schema_version,
            "id": self.id,
            "env": self.env,
            "task": self.task.to_dict(),
            "goal": self.goal,
            "policy": self.policy,
            "tools": self.tools,
            "initial_observation": self.initial_observation,
            "steps": [s.to_dict() for s in self.steps],
            "success": self.success,
            "final_score": self.final_score,
            "status": self.status,
            "error": self.error,
            "meta": self.meta,
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), ensure_ascii=False)

    @staticmethod
    def from_dict(d: dict[str, Any]) -> Trajectory:
        """A Trajectory from its JSON form; raises `InvalidRecord` naming every bad field.

        Whatever passes `validate_record` converts here (and renders in `data/format.py`), so
        `simplan validate` and `simplan build` accept the same records."""
        problems = validate_record(d)
        if problems:
            raise InvalidRecord(problems)
        return Trajectory(
            id=d["id"],
            env=d["env"],
            task=Task.from_dict(d["task"]),
            goal=d["goal"],
            policy=d["policy"],
            initial_observation=d["initial_observation"],
            steps=[Step._from_checked(s) for s in d["steps"]],
            tools=d.get("tools"),
            success=d["success"],
            final_score=d["final_score"],
            status=d["status"],
            error=d.get("error"),
            meta=d.get("meta") or {},
            schema_version=SCHEMA_VERSION,  # the one upgrade: a version-1 record is read as version 2
        )


# --------------------------------------------------------------------------------------------
# Validation: every problem is reported as "field: problem" so callers can prefix FILE:LINE.
# One check serves `simplan validate`, `simplan build` and `from_dict`: a record it passes converts
# and renders without error, so validate and build never disagree about a line.
# --------------------------------------------------------------------------------------------
class InvalidRecord(ValueError):
    """A record that does not match the schema; `problems` holds each one as 'field: problem'."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


_TOP: dict[str, tuple[type, ...]] = {
    "schema_version": (int,),
    "id": (str,),
    "env": (str,),
    "task": (dict,),
    "goal": (str,),
    "policy": (str,),
    "initial_observation": (str,),
    "steps": (list,),
    "success": (bool,),
    "final_score": (int, float),
    "status": (str,),
}
_TRANSITION: dict[str, tuple[type, ...]] = {  # what a step and an alternative both record of a transition
    "action": (dict,),
    "next_observation": (str,),
    "reward": (int, float),
    "score": (int, float),
    "done": (bool,),
    "won": (bool,),
    "error": (bool,),
}
_STEP: dict[str, tuple[type, ...]] = {"index": (int,), "observation": (str,), **_TRANSITION, "source": (str,)}
_STEP_FIELDS = frozenset(Step.__dataclass_fields__)
_ALTERNATIVE: dict[str, tuple[type, ...]] = {**_TRANSITION, "outcome": (str,)}
_ALTERNATIVE_FIELDS = frozenset(Alternative.__dataclass_fields__)


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _type_problems(obj: dict[str, Any], spec: dict[str, tuple[type, ...]], prefix: str) -> list[str]:
    out = []
    for key, types in spec.items():
        if key not in obj:
            out.append(f"{prefix}{key}: missing")
        elif isinstance(obj[key], bool) and bool not in types:
            out.append(f"{prefix}{key}: expected {types[0].__name__}, got bool")
        elif not isinstance(obj[key], types):
            out.append(f"{prefix}{key}: expected {types[0].__name__}, got {_kind(obj[key])}")
    return out


def _optional_problems(obj: dict[str, Any], key: str, types: tuple[type, ...], what: str, prefix: str) -> list[str]:
    """A field that may be missing or null, else must be one of `types` (`what` names them in the message)."""
    value = obj.get(key)
    if value is None or isinstance(value, types):
        return []
    return [f"{prefix}{key}: expected {what} or null, got {_kind(value)}"]


def _facts_problems(value: Any, where: str) -> list[str]:
    """Belief-state facts: a list of {"collection": str, "key": str or null, "fields": object, "drop"?: bool}."""
    if not isinstance(value, list):
        return [f"{where}: expected a list of facts, got {_kind(value)}"]
    problems = []
    for j, fact in enumerate(value):
        ok = (
            isinstance(fact, dict)
            and isinstance(fact.get("collection"), str)
            and (fact.get("key") is None or isinstance(fact.get("key"), str))
            and isinstance(fact.get("fields", {}), dict)
            and isinstance(fact.get("drop", False), bool)
            and set(fact) <= {"collection", "key", "fields", "drop"}
        )
        if not ok:
            problems.append(
                f"{where}[{j}]: expected {{collection: string, key: string or null, fields: object, drop: bool}}, "
                f"got {fact!r:.80}"
            )
    return problems


def _objects_problems(value: Any, where: str) -> list[str]:
    """Tool schemas: null or a list of JSON objects."""
    if value is None:
        return []
    if not isinstance(value, list):
        return [f"{where}: expected a list of objects or null, got {_kind(value)}"]
    return [
        f"{where}[{i}]: expected an object, got {_kind(t)}" for i, t in enumerate(value) if not isinstance(t, dict)
    ]


def _json_value_problems(value: Any, path: str) -> list[str]:
    """NaN/infinity and text that is not valid Unicode (lone surrogates), anywhere below `path`.

    Python's json reads both, but neither survives the way out: NaN is not JSON, poisons a score
    mean, and a lone surrogate cannot be encoded as UTF-8 or tokenized. Iterative, so a deeply
    nested record cannot exhaust the stack."""
    problems: list[str] = []
    stack: list[tuple[str, Any]] = [(path, value)]
    while stack:
        where, v = stack.pop()
        if isinstance(v, float):
            if not math.isfinite(v):
                problems.append(f"{where}: {v} is not a finite number")
        elif isinstance(v, str):
            if (at := _lone_surrogate_at(v)) is not None:
                problems.append(f"{where}: not valid Unicode (a lone surrogate at character {at + 1})")
        elif isinstance(v, dict):
            for k in v:
                if isinstance(k, str) and _lone_surrogate_at(k) is not None:
                    problems.append(f"{where or '(record)'}: the key {k!a} is not valid Unicode")
            stack.extend(reversed([(f"{where}.{k}" if where else str(k), x) for k, x in v.items()]))
        elif isinstance(v, list):
            stack.extend(reversed([(f"{where}[{i}]", x) for i, x in enumerate(v)]))
    return problems


def _lone_surrogate_at(text: str) -> int | None:
    """Index of the first character UTF-8 cannot encode (a lone surrogate), or None."""
    if text.isascii():
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        return e.start
    return None


def action_problems(action: Any, prefix: str = "action.") -> list[str]:
    """Problems of one action record (see `envs.base.Action`), field names prefixed by `prefix`."""
    if not isinstance(action, dict):
        return [f"{prefix[:-1]}: expected an object, got {_kind(action)}"]
    problems = _optional_problems(action, "text", (str,), "a string", prefix)
    problems += _optional_problems(action, "name", (str,), "a string", prefix)
    if "arguments" in action and not isinstance(action["arguments"], dict | None):
        problems.append(
            f"{prefix}arguments: expected an object of argument names to values, got {_kind(action['arguments'])}"
        )
    if problems:
        return problems
    kind = action.get("kind")
    if kind not in ACTION_KINDS:
        problems.append(f"{prefix}kind: {kind!r} is not one of {ACTION_KINDS}")
    elif kind == "tool_call" and not action.get("name"):
        problems.append(f"{prefix}name: a tool_call needs a name")
    elif kind == "command" and not (action.get("text") or "").strip():
        problems.append(f"{prefix}text: a command needs text")
    return problems


def alternative_problems(alt: Any, prefix: str = "") -> list[str]:
    """Problems of one alternative record, field names prefixed by `prefix` (e.g. 'steps[3].alternatives[0].').

    Its outcome must agree with what the env said: an ending is "won" or "lost" by `won`, a flagged failure
    that did not end the episode is "error"."""
    if not isinstance(alt, dict):
        return [f"{prefix[:-1] or '(alternative)'}: expected an object, got {_kind(alt)}"]
    problems = _type_problems(alt, _ALTERNATIVE, prefix)
    problems += [f"{prefix}{key}: not an alternative field" for key in alt if key not in _ALTERNATIVE_FIELDS]
    if problems:
        return problems
    problems += action_problems(alt["action"], f"{prefix}action.")
    outcome = alt["outcome"]
    if outcome not in OUTCOMES:
        return [*problems, f"{prefix}outcome: {outcome!r} is not one of {OUTCOMES}"]
    if alt["done"]:
        expected = "won" if alt["won"] else "lost"
        if outcome != expected:
            problems.append(f"{prefix}outcome: {outcome!r} but done is true and won {alt['won']} ({expected!r})")
    elif outcome in ("won", "lost"):
        problems.append(f"{prefix}outcome: {outcome!r} but done is false")
    elif alt["error"] and outcome != "error":
        problems.append(f"{prefix}outcome: {outcome!r} but error is true ('error')")
    return problems


def step_problems(step: Any, prefix: str = "") -> list[str]:
    """Problems of one step record, field names prefixed by `prefix` (e.g. 'steps[3].')."""
    if not isinstance(step, dict):
        return [f"{prefix[:-1] or '(step)'}: expected an object, got {_kind(step)}"]
    problems = _type_problems(step, _STEP, prefix)
    problems += [f"{prefix}{key}: not a step field" for key in step if key not in _STEP_FIELDS]
    if problems:
        return problems
    if step["source"] not in STEP_SOURCES:
        problems.append(f"{prefix}source: {step['source']!r} is not one of {STEP_SOURCES}")
    problems += action_problems(step["action"], f"{prefix}action.")
    va = step.get("valid_actions")
    if va is not None and not (isinstance(va, list) and all(isinstance(a, str) for a in va)):
        problems.append(f"{prefix}valid_actions: expected a list of strings or null")
    problems += _optional_problems(step, "expectation", (str,), "a string", prefix)
    notes = step.get("notes", [])
    if not (isinstance(notes, list) and all(isinstance(n, str) for n in notes)):
        problems.append(f"{prefix}notes: expected a list of strings")
    info = step.get("info")
    if info is not None and not isinstance(info, dict):
        problems.append(f"{prefix}info: expected an object or null, got {_kind(info)}")
    elif info:  # read by the prompt builder: a new user turn's goal and tools (BFCL)
        problems += _optional_problems(info, "goal", (str,), "a string", f"{prefix}info.")
        problems += _objects_problems(info.get("tools"), f"{prefix}info.tools")
    problems += _facts_problems(step.get("facts", []), f"{prefix}facts")
    alternatives = step.get("alternatives", [])
    if not isinstance(alternatives, list):
        problems.append(f"{prefix}alternatives: expected a list of objects, got {_kind(alternatives)}")
    else:
        for j, alt in enumerate(alternatives):
            problems += alternative_problems(alt, f"{prefix}alternatives[{j}].")
    return problems


def validate_record(d: Any) -> list[str]:
    """All schema problems of one decoded JSON line, as 'field: problem' strings (empty if valid)."""
    if not isinstance(d, dict):
        return [f"(record): expected a JSON object, got {_kind(d)}"]
    problems = _type_problems(d, _TOP, "")
    if problems:
        return problems
    version = d["schema_version"]
    if version not in READ_VERSIONS:
        problems.append(f"schema_version: {version} is not supported (expected one of {READ_VERSIONS})")
    if not d["id"].strip():
        problems.append("id: empty")
    if d["status"] not in STATUSES:
        problems.append(f"status: {d['status']!r} is not one of {STATUSES}")
    problems += _optional_problems(d, "error", (str,), "a string", "")
    problems += _optional_problems(d, "meta", (dict,), "an object", "")
    problems += _objects_problems(d.get("tools"), "tools")
    task = d["task"]
    for key in ("env", "task_id", "fold"):
        if not isinstance(task.get(key), str):
            problems.append(f"task.{key}: missing or not a string")
    if isinstance(task.get("fold"), str) and task["fold"] not in FOLDS:
        problems.append(f"task.fold: {task['fold']!r} is not one of {FOLDS}")
    if "family" in task and not isinstance(task["family"], str):
        problems.append(f"task.family: expected a string, got {_kind(task['family'])}")
    problems += _optional_problems(task, "params", (dict,), "an object", "task.")
    for i, step in enumerate(d["steps"]):
        prefix = f"steps[{i}]."
        found = step_problems(step, prefix)
        if not found and step["index"] != i:
            found.append(f"{prefix}index: {step['index']} but it is step {i}")
        if not found and version == 1 and "alternatives" in step:
            found.append(f"{prefix}alternatives: a version-2 field in a version-1 record; set schema_version to 2")
        problems += found
    return problems + _json_value_problems(d, "")
