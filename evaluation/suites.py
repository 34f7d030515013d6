"""Evaluation suites: named sets of (env, fold, families, tasks, step cap, faults) defined in YAML.

    simplan eval --suite twx-dev --arms reactive,plan,simplan ...      # recipes/suites/twx-dev.yaml
    simplan eval --suite path/to/my-suite.yaml ...

    from simplan.evaluation.suites import load_suite, suite_tasks
    suite = load_suite("toy-dev")
    for entry, tasks in suite_tasks(suite):
        ...

A suite file (flat keys at the top apply to every entry unless the entry sets its own):

    # comment with the command to run it
    name: twx-dev
    description: every TextWorld-Express game, dev fold
    max_steps: 50                                  # a flat cap on real steps per episode, or
    step_cap: {factor: 2, plus: 10}                # per task: 2 x the expert's path length + 10
    faults: {transient: 0.0, perturb: 0.0}
    entries:
      - env: twx
        fold: dev
        families: [cookingworld, twc, coin, ...]   # omit for all of the env's families
        tasks_per_family: 3                          # first N of each family, in the env's order
      - env: toy
        task_ids: [corridor-100, corridor-101]       # or explicit task ids

Suites live in recipes/suites/ (found from the repo root or $SIMPLAN_SUITES); a path works too.

Every arm of an evaluation runs the same tasks with the same step cap (evaluation/runner.py
`plan_episodes`), so the arms' outcomes pair task by task (evaluation/paired.py). With `step_cap`
the cap of each task is read from the expert's path (`env.expert_plan()` after a reset while the
episodes are planned): a flat cap cut cookingworld's longer gold paths short while giving the
3-step games room to wander. A task whose expert plan is unavailable keeps `max_steps`.
"""

from __future__ import annotations

import math
import os
import typing
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from simplan.core.config import coerce, yaml_problem
from simplan.core.errors import InputError, MissingInputError
from simplan.envs.base import FOLDS, Env, Task, env_extra
from simplan.envs.registry import make_env
from simplan.evaluation.faults import FaultConfig

SUITES_DIR = Path(__file__).resolve().parents[1] / "recipes" / "suites"
_ENTRY_KEYS = {
    "env",
    "fold",
    "families",
    "tasks_per_family",
    "task_ids",
    "max_steps",
    "step_cap",
    "env_kwargs",
    "faults",
}
_TYPED_KEYS = {"env", "fold", "families", "tasks_per_family", "task_ids", "max_steps", "env_kwargs"}
_SUITE_KEYS = {"name", "description", "max_steps", "step_cap", "faults", "entries", "tasks_per_family"}
_DEFAULT_KEYS = ("max_steps", "step_cap", "faults", "tasks_per_family")


@dataclass(frozen=True)
class StepCap:
    """A task's step cap from its expert path: ceil(factor x expert steps) + plus."""

    factor: float = 2.0
    plus: int = 10

    def __post_init__(self) -> None:
        if not self.factor >= 1.0:
            raise ValueError(f"step_cap.factor: must be >= 1 (the expert's own path must fit), got {self.factor!r}")
        if self.plus < 0:
            raise ValueError(f"step_cap.plus: must be >= 0, got {self.plus!r}")

    def cap(self, expert_steps: int) -> int:
        return math.ceil(self.factor * expert_steps) + self.plus

    def to_dict(self) -> dict[str, Any]:
        return {"factor": self.factor, "plus": self.plus}

    @staticmethod
    def from_dict(d: dict[str, Any] | StepCap | None) -> StepCap | None:
        """None (no step_cap: the flat max_steps) or {factor, plus}; unknown keys are an error."""
        if d is None or isinstance(d, StepCap):
            return d
        if not isinstance(d, dict):
            raise ValueError(f"step_cap: expected a mapping like {{factor: 2, plus: 10}}, got {d!r}")
        bad = sorted(set(d) - {"factor", "plus"})
        if bad:
            raise ValueError(f"step_cap: unknown key(s) {bad}; valid: factor, plus")
        return StepCap(**d)


@dataclass
class SuiteEntry:
    """One group of tasks of one environment."""

    env: str
    fold: str = "dev"
    families: list[str] | None = None  # None: every family of the env
    tasks_per_family: int | None = None  # None: all (explicit task_ids ignore it)
    task_ids: list[str] | None = None
    max_steps: int = 50  # the flat cap, and the cap of tasks without an expert plan when step_cap is set
    step_cap: StepCap | None = None  # None: every task gets max_steps
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    faults: FaultConfig = field(default_factory=FaultConfig)

    def __post_init__(self) -> None:
        if self.fold not in FOLDS:
            raise ValueError(f"suite entry {self.env}: fold {self.fold!r} is not one of {FOLDS}")
        if self.tasks_per_family is not None and self.tasks_per_family < 1:
            raise ValueError(f"suite entry {self.env}: tasks_per_family must be >= 1, got {self.tasks_per_family}")
        if self.max_steps < 1:
            raise ValueError(f"suite entry {self.env}: max_steps must be >= 1, got {self.max_steps}")

    def env_key(self) -> str:
        """Entries with the same key can share env instances."""
        return f"{self.env}:{sorted(self.env_kwargs.items())!r}"


@dataclass
class Suite:
    name: str
    entries: list[SuiteEntry]
    description: str = ""
    path: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": self.description,
            "path": self.path,
            "entries": [_entry_dict(e) for e in self.entries],
        }


def _entry_dict(e: SuiteEntry) -> dict[str, Any]:
    d = {
        "env": e.env,
        "fold": e.fold,
        "families": e.families,
        "tasks_per_family": e.tasks_per_family,
        "task_ids": e.task_ids,
        "max_steps": e.max_steps,
        "env_kwargs": e.env_kwargs,
        "faults": e.faults.to_dict(),
    }
    if e.step_cap is not None:  # only when set: a flat-cap suite's identity has no step_cap key (its folders resume)
        d["step_cap"] = e.step_cap.to_dict()
    return d


_ENTRY_HINTS = typing.get_type_hints(SuiteEntry)


def suites_dir() -> Path:
    return Path(os.environ["SIMPLAN_SUITES"]) if os.environ.get("SIMPLAN_SUITES") else SUITES_DIR


def list_suites() -> list[str]:
    folder = suites_dir()
    return sorted(p.stem for p in folder.glob("*.yaml")) if folder.is_dir() else []


def suite_path(name_or_path: str) -> Path:
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml") or p.exists():
        if not p.exists():
            raise MissingInputError(f"suite file {p} does not exist")
        return p
    candidate = suites_dir() / f"{name_or_path}.yaml"
    if not candidate.exists():
        known = ", ".join(list_suites()) or "none"
        raise MissingInputError(
            f"suite {name_or_path!r}: no {candidate}; known suites: {known} (or pass a path to a suite YAML file)"
        )
    return candidate


def load_suite(name_or_path: str) -> Suite:
    """Read a suite by name (recipes/suites/NAME.yaml) or path; errors name the file and the key."""
    import yaml

    path = suite_path(name_or_path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8-sig")) or {}
    except yaml.YAMLError as e:  # (a description with ": " in it, unquoted)
        raise InputError(f"{path}: not valid YAML ({yaml_problem(e)}); fix the suite file") from None
    if not isinstance(data, dict):
        raise InputError(f"{path}: a suite is a mapping with `entries`, got {type(data).__name__}")
    unknown = sorted(set(data) - _SUITE_KEYS)
    if unknown:
        raise InputError(f"{path}: unknown key(s) {unknown}; valid: {sorted(_SUITE_KEYS)}")
    entries_raw = data.get("entries")
    if not entries_raw or not isinstance(entries_raw, list):
        raise InputError(f"{path}: `entries` must be a non-empty list of {{env, fold, families, ...}}")
    defaults = {k: data[k] for k in _DEFAULT_KEYS if k in data}
    entries = []
    for i, raw in enumerate(entries_raw):
        if not isinstance(raw, dict) or "env" not in raw:
            raise InputError(f"{path}: entries[{i}] must be a mapping with at least `env`")
        bad = sorted(set(raw) - _ENTRY_KEYS)
        if bad:
            raise InputError(f"{path}: entries[{i}]: unknown key(s) {bad}; valid: {sorted(_ENTRY_KEYS)}")
        merged = {**defaults, **raw}
        try:
            merged["faults"] = FaultConfig.from_dict(merged.get("faults"))
            merged["step_cap"] = StepCap.from_dict(merged.get("step_cap"))
            for key in _TYPED_KEYS & set(merged):  # `families: twc` is one family, not three letters
                merged[key] = coerce(merged[key], _ENTRY_HINTS[key], key)
            entries.append(SuiteEntry(**merged))
        except (TypeError, ValueError) as e:
            raise InputError(f"{path}: entries[{i}]: {e}") from None
    return Suite(
        name=str(data.get("name") or path.stem),
        entries=entries,
        description=data.get("description", ""),
        path=str(path),
    )


def entry_tasks(entry: SuiteEntry, env: Env | None = None) -> list[Task]:
    """The entry's tasks in a stable order; `env` (else a temporary one) lists them."""
    own = env is None
    env = env or make_env(entry.env, **entry.env_kwargs)
    try:
        if entry.task_ids:
            every = {t.task_id: t for t in env.tasks(entry.fold, families=entry.families)}
            missing = [t for t in entry.task_ids if t not in every]
            if missing:
                raise InputError(
                    f"suite entry {entry.env}/{entry.fold}: task id(s) {missing[:5]} are not in the fold "
                    f"(e.g. {', '.join(list(every)[:3])})"
                )
            return [every[t] for t in entry.task_ids]
        families = entry.families or list(env_extra(env, "families") or [])
        if families:
            out: list[Task] = []
            for fam in families:
                out.extend(env.tasks(entry.fold, families=[fam], limit=entry.tasks_per_family))
            return out
        tasks = env.tasks(entry.fold)
        if entry.tasks_per_family is None:
            return tasks
        seen: dict[str, int] = {}
        out = []
        for t in tasks:
            seen[t.family] = seen.get(t.family, 0) + 1
            if seen[t.family] <= entry.tasks_per_family:
                out.append(t)
        return out
    finally:
        if own:
            env.close()


def suite_tasks(suite: Suite) -> list[tuple[SuiteEntry, list[Task]]]:
    return [(e, entry_tasks(e)) for e in suite.entries]


def expert_steps(env: Env, task: Task) -> int | None:
    """The length of the expert's path of `task` (a reset, then `env.expert_plan()`); None when the env
    cannot give one (no gold path, a failed reset): the caller falls back to the flat cap."""
    try:
        env.reset(task)
        return len(env.expert_plan())
    except Exception as e:  # noqa: BLE001 - any env failure means "no expert length", said in the warning
        warnings.warn(f"task {task.env}/{task.task_id}: no expert plan ({type(e).__name__}: {e})", stacklevel=2)
        return None


def task_step_caps(entry: SuiteEntry, tasks: list[Task], env: Env | None = None) -> dict[str, int]:
    """Each task's step cap by task id: `entry.max_steps`, or from the expert's path with `step_cap`."""
    if entry.step_cap is None or not tasks:
        return {t.task_id: entry.max_steps for t in tasks}
    own = env is None
    env = env or make_env(entry.env, **entry.env_kwargs)
    try:
        caps = {}
        for t in tasks:
            n = expert_steps(env, t)
            caps[t.task_id] = entry.max_steps if n is None else entry.step_cap.cap(n)
        return caps
    finally:
        if own:
            env.close()


def entry_tasks_with_caps(entry: SuiteEntry) -> list[tuple[Task, int]]:
    """The entry's tasks and their step caps, listed and measured with one env instance."""
    env = make_env(entry.env, **entry.env_kwargs)
    try:
        tasks = entry_tasks(entry, env)
        caps = task_step_caps(entry, tasks, env)
        return [(t, caps[t.task_id]) for t in tasks]
    finally:
        env.close()
