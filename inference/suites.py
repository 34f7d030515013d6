"""Evaluation suites: named sets of (env, fold, families, tasks, step cap, faults) defined in YAML.

    simplan eval --suite twx-dev --arms reactive,plan,simplan ...      # recipes/suites/twx-dev.yaml
    simplan eval --suite path/to/my-suite.yaml ...

    from simplan.inference.suites import load_suite, suite_tasks
    suite = load_suite("toy-dev")
    for entry, tasks in suite_tasks(suite):
        ...

A suite file (flat keys at the top apply to every entry unless the entry sets its own):

    # comment with the command to run it
    name: twx-dev
    description: every TextWorld-Express game, dev fold
    max_steps: 50
    faults: {transient: 0.0, perturb: 0.0}
    entries:
      - env: twx
        fold: dev
        families: [cookingworld, twc, coin, ...]   # omit for all of the env's families
        tasks_per_family: 3                          # first N of each family, in the env's order
      - env: toy
        task_ids: [corridor-100, corridor-101]       # or explicit task ids

Suites live in recipes/suites/ (found from the repo root or $SIMPLAN_SUITES); a path works too.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from simplan.envs.base import FOLDS, Env, Task
from simplan.envs.registry import make_env
from simplan.inference.faults import FaultConfig

SUITES_DIR = Path(__file__).resolve().parents[1] / "recipes" / "suites"
_ENTRY_KEYS = {"env", "fold", "families", "tasks_per_family", "task_ids", "max_steps", "env_kwargs", "faults"}
_SUITE_KEYS = {"name", "description", "max_steps", "faults", "entries", "tasks_per_family"}


@dataclass
class SuiteEntry:
    """One group of tasks of one environment."""

    env: str
    fold: str = "dev"
    families: list[str] | None = None  # None: every family of the env
    tasks_per_family: int | None = None  # None: all (explicit task_ids ignore it)
    task_ids: list[str] | None = None
    max_steps: int = 50
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
            "entries": [
                {
                    "env": e.env,
                    "fold": e.fold,
                    "families": e.families,
                    "tasks_per_family": e.tasks_per_family,
                    "task_ids": e.task_ids,
                    "max_steps": e.max_steps,
                    "env_kwargs": e.env_kwargs,
                    "faults": e.faults.to_dict(),
                }
                for e in self.entries
            ],
        }


def suites_dir() -> Path:
    return Path(os.environ["SIMPLAN_SUITES"]) if os.environ.get("SIMPLAN_SUITES") else SUITES_DIR


def list_suites() -> list[str]:
    folder = suites_dir()
    return sorted(p.stem for p in folder.glob("*.yaml")) if folder.is_dir() else []


def suite_path(name_or_path: str) -> Path:
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml") or p.exists():
        if not p.exists():
            raise FileNotFoundError(f"suite file {p} does not exist")
        return p
    candidate = suites_dir() / f"{name_or_path}.yaml"
    if not candidate.exists():
        known = ", ".join(list_suites()) or "none"
        raise FileNotFoundError(
            f"suite {name_or_path!r}: no {candidate}; known suites: {known} (or pass a path to a suite YAML file)"
        )
    return candidate


def load_suite(name_or_path: str) -> Suite:
    """Read a suite by name (recipes/suites/NAME.yaml) or path; errors name the file and the key."""
    import yaml

    path = suite_path(name_or_path)
    data = yaml.safe_load(path.read_text()) or {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a suite is a mapping with `entries`, got {type(data).__name__}")
    unknown = sorted(set(data) - _SUITE_KEYS)
    if unknown:
        raise ValueError(f"{path}: unknown key(s) {unknown}; valid: {sorted(_SUITE_KEYS)}")
    entries_raw = data.get("entries")
    if not entries_raw or not isinstance(entries_raw, list):
        raise ValueError(f"{path}: `entries` must be a non-empty list of {{env, fold, families, ...}}")
    defaults = {k: data[k] for k in ("max_steps", "faults", "tasks_per_family") if k in data}
    entries = []
    for i, raw in enumerate(entries_raw):
        if not isinstance(raw, dict) or "env" not in raw:
            raise ValueError(f"{path}: entries[{i}] must be a mapping with at least `env`")
        bad = sorted(set(raw) - _ENTRY_KEYS)
        if bad:
            raise ValueError(f"{path}: entries[{i}]: unknown key(s) {bad}; valid: {sorted(_ENTRY_KEYS)}")
        merged = {**defaults, **raw}
        try:
            merged["faults"] = FaultConfig.from_dict(merged.get("faults"))
            entries.append(SuiteEntry(**merged))
        except (TypeError, ValueError) as e:
            raise ValueError(f"{path}: entries[{i}]: {e}") from None
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
                raise ValueError(
                    f"suite entry {entry.env}/{entry.fold}: task id(s) {missing[:5]} are not in the fold "
                    f"(e.g. {', '.join(list(every)[:3])})"
                )
            return [every[t] for t in entry.task_ids]
        families = entry.families or list(getattr(env, "families", []) or [])
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
