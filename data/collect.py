"""Collect trajectories from any registered environment: expert, noisy expert, random and branches.

    simplan collect --env twx --fold train --policies expert,noisy_expert,random --limit 20 \\
        --out runs/data/twx-train.jsonl --workers 2
    simplan collect --config recipes/collect/twx-train.yaml

    from simplan.data.collect import CollectConfig, collect
    report = collect(CollectConfig(env="toy", limit=10, out="runs/data/toy.jsonl"))

Policies (one episode id per task, policy and attempt: "{env}/{task_id}/{policy}/{attempt}"):
``expert``, ``noisy_expert`` (the expert with real mistakes, recovered from or split off into branch
records), ``random``, and with `branches` / `losing_branches` off-path branch records for the simulator;
data/policies.py says how each one plays. Episodes run grouped by family (a TWX game switch reloads the
game). Steps keep the env's `info`, with a new goal or tool list where an observation brings one
(data/recorder.py); dataset prompts follow both from step to step.

Output is one append-only JSONL file of trajectory records (`simplan validate` checks it). Each
finished episode is appended in one write with its split-off branches, so re-running the same
command skips episode ids already in the file and resumes where a crash stopped; a torn last line
is reported, moved to `{out}.torn`, and collected again. An env that raises (a crashed JVM,
`EnvCrashed`, any exception) marks its episode `status: "errored"` with the message; the worker
then recreates its env. Episodes longer than `max_steps` end with `status: "truncated"`. Noise is
seeded from (`seed`, episode id), so the same command collects the same data.

The code: this module holds the config, the task and episode plan, resuming and the main loop;
data/collect_workers.py runs episodes (in worker processes), data/policies.py plays them,
data/recorder.py records them and data/mistakes.py makes the noisy expert's mistakes.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from simplan.core.config import comma_list
from simplan.core.errors import InputError
from simplan.core.io import append_jsonl, read_jsonl_tolerant, write_jsonl
from simplan.data.collect_workers import episode_outcomes
from simplan.data.recorder import EpisodeSpec
from simplan.envs.base import FOLDS, Env, Task
from simplan.envs.registry import make_env

POLICIES: tuple[str, ...] = ("expert", "noisy_expert", "random")


# ---------------------------------------------------------------------------------------------
# Configuration
# ---------------------------------------------------------------------------------------------
@dataclass
class CollectConfig:
    """What to collect, how, and where to write it (`simplan collect --help` lists every field)."""

    env: str = field(default="toy", metadata={"help": "registered environment name (simplan envs list)"})
    fold: str = field(default="train", metadata={"help": "task fold: train, dev or test"})
    families: list[str] | None = field(
        default=None, metadata={"help": "only these families (TWX games, ScienceWorld task types, BFCL categories)"}
    )
    limit: int | None = field(default=None, metadata={"help": "tasks per family (first N in the env's order)"})
    skip: int = field(
        default=0,
        metadata={
            "help": "tasks per family passed over before `limit` counts, e.g. to hold out an evaluation's seeds"
        },
    )
    family_limits: dict[str, int] = field(
        default_factory=dict,
        metadata={
            "help": "tasks per family for the named families, overriding `limit` (YAML mapping, e.g. {twc: 96})"
        },
    )
    max_tasks: int | None = field(
        default=None, metadata={"help": "tasks in total after `limit`, taken round-robin across families"}
    )
    policies: list[str] = field(
        default_factory=lambda: ["expert", "noisy_expert"],
        metadata={"help": f"policies to run, any of {', '.join(POLICIES)}"},
    )
    attempts: int = field(
        default=1, metadata={"help": "episodes per task for noisy_expert and random (expert runs once per task)"}
    )
    branches: int = field(
        default=0, metadata={"help": "off-path branch transitions per task (simulator coverage), 0 for none"}
    )
    losing_branches: int = field(
        default=0,
        metadata={"help": "branches per task into an action that loses the episode (done, not won), 0 for none"},
    )
    losing_tries: int = field(
        default=30, metadata={"help": "losing branches: actions tried (each from a reset) before giving up"}
    )
    noise_rate: float = field(default=0.2, metadata={"help": "noisy_expert: chance of a mistake before a plan step"})
    invalid_share: float = field(
        default=0.5, metadata={"help": "noisy_expert: share of mistakes that are invalid actions (rest: wrong valid)"}
    )
    min_mistakes: int = field(default=1, metadata={"help": "noisy_expert: mistakes kept per episode at least"})
    max_steps: int = field(default=100, metadata={"help": "step cap of an episode; hitting it -> status truncated"})
    random_steps: int = field(default=20, metadata={"help": "length of a random-policy episode"})
    workers: int = field(default=1, metadata={"help": "worker processes, each with its own env (JVM)"})
    out: str = field(default="runs/data/trajectories.jsonl", metadata={"help": "append-only JSONL output"})
    seed: int = field(default=0, metadata={"help": "base seed; noise is seeded from (seed, episode id)"})
    env_kwargs: dict[str, Any] = field(
        default_factory=dict, metadata={"help": "keyword arguments for the env's constructor (YAML mapping)"}
    )
    retry_errored: bool = field(
        default=False, metadata={"help": "drop errored episodes already in `out` and collect them again"}
    )
    progress: bool = field(default=True, metadata={"help": "show a progress bar"})

    def __post_init__(self) -> None:
        self.policies = comma_list(self.policies)
        if self.families is not None:
            self.families = comma_list(self.families)
        if not self.env:
            raise ValueError("env: give a registered environment name (see `simplan envs list`)")
        if self.skip < 0:
            raise ValueError(f"skip: must be >= 0, got {self.skip}")
        if self.fold not in FOLDS:
            raise ValueError(f"fold: {self.fold!r} is not one of {FOLDS}")
        bad = [p for p in self.policies if p not in POLICIES]
        if bad or not self.policies:
            raise ValueError(f"policies: {bad or self.policies!r}; choose from {', '.join(POLICIES)}")
        if len(set(self.policies)) != len(self.policies):
            raise ValueError(f"policies: {self.policies!r} lists a policy twice")
        for name in ("limit", "max_tasks"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name}: {value} must be at least 1 (or null for all)")
        for name in ("attempts", "max_steps", "random_steps", "workers", "losing_tries"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: {getattr(self, name)} must be at least 1")
        for name in ("branches", "losing_branches", "min_mistakes"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}: {getattr(self, name)} must be 0 or more")
        for name in ("noise_rate", "invalid_share"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name}: {getattr(self, name)} must be between 0 and 1")
        if not isinstance(self.family_limits, dict):
            raise ValueError(f"family_limits: expected a mapping of family to task count, got {self.family_limits!r}")
        bad_limits = {f: n for f, n in self.family_limits.items() if not isinstance(n, int) or n < 1}
        if bad_limits:
            raise ValueError(f"family_limits: {bad_limits} must be whole numbers of at least 1")
        if not isinstance(self.env_kwargs, dict):
            raise ValueError(f"env_kwargs: expected a mapping, got {self.env_kwargs!r}")
        if not self.out:
            raise ValueError("out: give the output JSONL path")


# ---------------------------------------------------------------------------------------------
# Task and episode planning
# ---------------------------------------------------------------------------------------------
def select_tasks(env: Env, cfg: CollectConfig) -> list[Task]:
    """The fold's tasks, `limit` per family (`family_limits` for those it names) after the first `skip` of each,
    then `max_tasks` in total taken round-robin by family."""
    tasks = env.tasks(cfg.fold, families=cfg.families, limit=None)
    by_family: dict[str, list[Task]] = {}
    for task in tasks:
        by_family.setdefault(task.family, []).append(task)
    if cfg.families:
        missing = [f for f in cfg.families if f not in by_family]
        if missing:
            known = sorted({t.family for t in env.tasks(cfg.fold)})
            raise InputError(f"families: {missing} have no {cfg.fold} tasks in {cfg.env}; known: {known}")
    unknown = sorted(set(cfg.family_limits) - set(by_family))
    if unknown:
        raise InputError(f"family_limits: {unknown} have no {cfg.fold} tasks here; families: {sorted(by_family)}")
    groups = []
    for family, group in by_family.items():
        n = cfg.family_limits.get(family, cfg.limit)
        groups.append(group[cfg.skip : cfg.skip + n if n else None])
    picked: list[Task] = []
    for i in range(max((len(g) for g in groups), default=0)):
        picked += [g[i] for g in groups if i < len(g)]
    if cfg.max_tasks is not None:
        picked = picked[: cfg.max_tasks]
    order = {id(t): n for n, t in enumerate(tasks)}
    return sorted(picked, key=lambda t: order[id(t)])


def plan_episodes(tasks: list[Task], cfg: CollectConfig) -> list[EpisodeSpec]:
    """Episodes grouped by family: envs like TWX reload their game (~0.2 s) when the family changes."""
    first_seen = {f: n for n, f in reversed(list(enumerate(t.family for t in tasks)))}
    specs = []
    for task in sorted(tasks, key=lambda t: first_seen[t.family]):
        for policy in cfg.policies:
            n = 1 if policy == "expert" else cfg.attempts
            specs += [EpisodeSpec(task, policy, str(a)) for a in range(n)]
        specs += [EpisodeSpec(task, "random", f"branch{k}") for k in range(cfg.branches)]
        specs += [EpisodeSpec(task, "random", f"lose{k}") for k in range(cfg.losing_branches)]
    return specs


# ---------------------------------------------------------------------------------------------
# Resume and the main loop
# ---------------------------------------------------------------------------------------------
@dataclass
class CollectReport:
    out: str
    planned: int = 0
    skipped: int = 0
    written: int = 0
    records: int = 0
    transitions: int = 0
    env_steps: int = 0
    elapsed_s: float = 0.0
    statuses: Counter = field(default_factory=Counter)
    success: Counter = field(default_factory=Counter)  # policy -> successful main episodes
    episodes: Counter = field(default_factory=Counter)  # policy -> main episodes written
    problems: list[str] = field(default_factory=list)  # torn lines, unfinished episodes
    unfinished: int = 0
    losing: Counter = field(default_factory=Counter)  # losing branches written: "found" (lost the game) or "not"

    @property
    def transitions_per_s(self) -> float:
        return self.transitions / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def summary(self) -> str:
        lines = [
            f"collect -> {self.out}",
            f"  episodes: {self.planned} planned, {self.skipped} already there, {self.written} written "
            f"({self.records} records with branches), {self.unfinished} unfinished",
            f"  status: {dict(self.statuses) or {}}",
            f"  transitions: {self.transitions} in {self.elapsed_s:.1f} s ({self.transitions_per_s:.1f}/s); "
            f"env steps incl. replays: {self.env_steps}",
        ]
        for policy, n in sorted(self.episodes.items()):
            lines.append(f"  {policy}: {self.success[policy]}/{n} succeeded")
        if self.losing:
            found, total = self.losing["found"], self.losing["found"] + self.losing["not"]
            lines.append(f"  losing branches: {found}/{total} lost the game (the rest are ordinary branches)")
        lines += [f"  ! {p}" for p in self.problems]
        return "\n".join(lines)


def _repair_tail(path: Path, problems: list[str]) -> list[str]:
    """Move a torn last line (a crash mid-append) to `{out}.torn` so appending can continue."""
    if not path.exists() or path.stat().st_size == 0:
        return problems
    data = path.read_bytes()
    if data.endswith(b"\n"):
        return problems
    cut = data.rfind(b"\n") + 1
    tail = data[cut:]
    try:
        json.loads(tail)
        with open(path, "ab") as f:  # a whole record that only lacks its newline
            f.write(b"\n")
        return problems
    except ValueError:
        pass
    with open(f"{path}.torn", "ab") as f:
        f.write(tail + b"\n")
    with open(path, "r+b") as f:
        f.truncate(cut)
    lineno = data[:cut].count(b"\n") + 1
    return [
        p if not p.startswith(f"{path}:{lineno}:") else f"{p}; moved to {path}.torn and collected again"
        for p in problems
    ]


def load_done(path: Path, retry_errored: bool) -> tuple[set[str], list[str]]:
    """Episode ids already in `path` (and problems found reading it)."""
    records, problems = read_jsonl_tolerant(path)
    problems = _repair_tail(path, problems)
    if retry_errored:
        errored = {r.get("id") for r in records if isinstance(r, dict) and r.get("status") == "errored"}
        if errored:
            keep = [
                r
                for r in records
                if not (
                    isinstance(r, dict) and (r.get("id") in errored or (r.get("meta") or {}).get("parent") in errored)
                )
            ]
            if not problems:  # never rewrite a file with unreadable lines: they would be lost
                write_jsonl(path, keep)
                records = keep
            else:
                problems.append(f"{path}: not retrying errored episodes while the file has unreadable lines")
    done = {r["id"] for r in records if isinstance(r, dict) and isinstance(r.get("id"), str)}
    return done, problems


def collect(cfg: CollectConfig) -> CollectReport:
    """Collect every planned episode not yet in `cfg.out`; returns counts (see `CollectReport.summary`)."""
    from tqdm.auto import tqdm

    out = Path(cfg.out)
    report = CollectReport(out=str(out))
    env = make_env(cfg.env, **cfg.env_kwargs)
    try:
        tasks = select_tasks(env, cfg)
    finally:
        env.close()
    if not tasks:
        raise InputError(f"no {cfg.fold} tasks in {cfg.env} for families={cfg.families}; check --families/--fold")
    specs = plan_episodes(tasks, cfg)
    done, report.problems = load_done(out, cfg.retry_errored)
    todo = [s for s in specs if s.id not in done]
    report.planned, report.skipped = len(specs), len(specs) - len(todo)
    t0 = time.perf_counter()
    bar = tqdm(total=len(todo), unit="ep", desc=f"collect {cfg.env}/{cfg.fold}", disable=not cfg.progress)
    try:
        for outcome in episode_outcomes(cfg, todo) if todo else ():
            append_jsonl(out, outcome.records)
            main = outcome.records[0]
            report.written += 1
            report.records += len(outcome.records)
            report.transitions += outcome.transitions
            report.env_steps += outcome.env_steps
            report.statuses[outcome.status] += 1
            report.episodes[main["policy"]] += 1
            report.success[main["policy"]] += int(main["success"])
            if "losing" in main["meta"]:
                report.losing["found" if main["meta"]["losing"] else "not"] += 1
            bar.update(1)
            bar.set_postfix(trans=report.transitions, err=report.statuses["errored"], refresh=False)
    except BrokenProcessPool as e:
        report.problems.append(f"a worker process died ({e}); re-run the same command to resume")
    finally:
        bar.close()
        report.elapsed_s = time.perf_counter() - t0
        report.unfinished = len(todo) - report.written
    return report
