"""The trajectory schema: dataclasses in code, one JSON object per line on disk.

Schema version 1 (`schema_version: 1`). A Trajectory is one episode:

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
    notes (optional: lines the prompt showed with the observation, e.g. the planner's pivot reasons)

Check files with `simplan validate FILE`.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from simplan.envs.base import ACTION_KINDS, FOLDS, Action, Task

SCHEMA_VERSION = 1
STEP_SOURCES = ("expert", "noise", "random", "recovery", "policy")
STATUSES = ("ok", "truncated", "errored")


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

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["action"] = self.action.to_dict()
        return d

    @staticmethod
    def from_dict(d: dict[str, Any]) -> Step:
        d = dict(d)
        d["action"] = Action.from_dict(d["action"])
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
        problems = validate_record(d)
        if problems:
            raise ValueError("; ".join(problems))
        return Trajectory(
            id=d["id"],
            env=d["env"],
            task=Task.from_dict(d["task"]),
            goal=d["goal"],
            policy=d["policy"],
            initial_observation=d["initial_observation"],
            steps=[Step.from_dict(s) for s in d["steps"]],
            tools=d.get("tools"),
            success=d["success"],
            final_score=d["final_score"],
            status=d["status"],
            error=d.get("error"),
            meta=d.get("meta") or {},
            schema_version=d["schema_version"],
        )


# --------------------------------------------------------------------------------------------
# Validation: every problem is reported as "field: problem" so callers can prefix FILE:LINE.
# --------------------------------------------------------------------------------------------
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
_STEP: dict[str, tuple[type, ...]] = {
    "index": (int,),
    "observation": (str,),
    "action": (dict,),
    "next_observation": (str,),
    "reward": (int, float),
    "score": (int, float),
    "done": (bool,),
    "won": (bool,),
    "error": (bool,),
    "source": (str,),
}


def _type_problems(obj: dict[str, Any], spec: dict[str, tuple[type, ...]], prefix: str) -> list[str]:
    out = []
    for key, types in spec.items():
        if key not in obj:
            out.append(f"{prefix}{key}: missing")
        elif isinstance(obj[key], bool) and bool not in types:
            out.append(f"{prefix}{key}: expected {types[0].__name__}, got bool")
        elif not isinstance(obj[key], types):
            out.append(f"{prefix}{key}: expected {types[0].__name__}, got {type(obj[key]).__name__}")
    return out


def validate_record(d: Any) -> list[str]:
    """All schema problems of one decoded JSON line, as 'field: problem' strings (empty if valid)."""
    if not isinstance(d, dict):
        return [f"(record): expected a JSON object, got {type(d).__name__}"]
    problems = _type_problems(d, _TOP, "")
    if problems:
        return problems
    if d["schema_version"] != SCHEMA_VERSION:
        problems.append(f"schema_version: {d['schema_version']} is not supported (expected {SCHEMA_VERSION})")
    if d["status"] not in STATUSES:
        problems.append(f"status: {d['status']!r} is not one of {STATUSES}")
    task = d["task"]
    for key in ("env", "task_id", "fold"):
        if not isinstance(task.get(key), str):
            problems.append(f"task.{key}: missing or not a string")
    if isinstance(task.get("fold"), str) and task["fold"] not in FOLDS:
        problems.append(f"task.fold: {task['fold']!r} is not one of {FOLDS}")
    if d.get("tools") is not None and not isinstance(d["tools"], list):
        problems.append("tools: expected a list or null")
    for i, step in enumerate(d["steps"]):
        prefix = f"steps[{i}]."
        if not isinstance(step, dict):
            problems.append(f"steps[{i}]: expected an object")
            continue
        step_problems = _type_problems(step, _STEP, prefix)
        problems += step_problems
        if step_problems:
            continue
        if step["index"] != i:
            problems.append(f"{prefix}index: {step['index']} but it is step {i}")
        if step["source"] not in STEP_SOURCES:
            problems.append(f"{prefix}source: {step['source']!r} is not one of {STEP_SOURCES}")
        action = step["action"]
        if action.get("kind") not in ACTION_KINDS:
            problems.append(f"{prefix}action.kind: {action.get('kind')!r} is not one of {ACTION_KINDS}")
        elif action["kind"] == "tool_call" and not action.get("name"):
            problems.append(f"{prefix}action.name: a tool_call needs a name")
        elif action["kind"] == "command" and not str(action.get("text", "")).strip():
            problems.append(f"{prefix}action.text: a command needs text")
        va = step.get("valid_actions")
        if va is not None and not (isinstance(va, list) and all(isinstance(a, str) for a in va)):
            problems.append(f"{prefix}valid_actions: expected a list of strings or null")
        if step.get("expectation") is not None and not isinstance(step["expectation"], str):
            problems.append(f"{prefix}expectation: expected a string or null")
        notes = step.get("notes", [])
        if not (isinstance(notes, list) and all(isinstance(n, str) for n in notes)):
            problems.append(f"{prefix}notes: expected a list of strings")
    return problems
