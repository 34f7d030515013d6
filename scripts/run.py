"""`simplan run`: one episode with the planning loop and a live view of what it imagines, does and why it pivots.

    simplan run --env toy --task corridor-100 --arm simplan --engine hf --model smollm2-135m-instruct \\
        --adapters decider=runs/adapters/decider,simulator=runs/adapters/simulator --trace runs/run/toy.jsonl
    simplan run --env twx --task cookingworld-dev-3 --arm reactive --engine openai --model smollm2 \\
        --adapters decider=x --base-url http://127.0.0.1:8000/v1     # against `simplan serve`
    simplan run --env simplan_shop.env:ShopEnv --arm reactive --engine expert   # no model: the env's expert

Every planner setting is a flag (`simplan run --help`); `--arm` fills the ones not given
(inference/planning/arms.py); an arm asks only for the adapters it uses (reactive: the decider). The trace
(JSONL, one event per line, see inference/planning/trace.py) is appended to
--trace (default runs/run/<env>-<task>-<arm>.jsonl). Exit status 0 when the episode ran (solved or
not), 1 when it errored.
"""

from __future__ import annotations

import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from simplan.core.config import parse_config
from simplan.core.errors import InputError
from simplan.core.io import check_output_file
from simplan.envs.base import FOLDS, Env, Task
from simplan.envs.registry import make_env
from simplan.inference.engines import EngineConfig, engine_from_config
from simplan.inference.engines.base import Engine
from simplan.inference.planning.planner import Planner, PlannerConfig
from simplan.inference.planning.trace import (
    ActEvent,
    EndEvent,
    ImagineEvent,
    PivotEvent,
    ReplanEvent,
    TraceEvent,
    append_trace,
    format_event,
)
from simplan.scripts.cli import command, usage_errors

VIEWS = ("rich", "plain", "none")


@dataclass
class RunConfig:
    env: str = field(default="toy", metadata={"help": "env name (simplan envs list) or package.module:Class"})
    task: str = field(default="", metadata={"help": "task id (e.g. corridor-100); empty: the first task of --fold"})
    fold: str = field(default="", metadata={"help": "fold to search for the task (empty: all folds; dev if no task)"})
    env_kwargs: dict = field(
        default_factory=dict, metadata={"help": "keyword arguments of the env's constructor (YAML mapping)"}
    )
    env_options: dict | None = field(default=None, metadata={"help": "deprecated name of --env-kwargs"})
    trace: str = field(default="", metadata={"help": "trace JSONL to append to (default runs/run/ENV-TASK-ARM.jsonl)"})
    view: str = field(default="rich", metadata={"help": f"live view: {', '.join(VIEWS)}"})

    def __post_init__(self) -> None:
        if self.env_options is not None:  # the old name: every other command calls it env_kwargs
            warnings.warn("--env-options is deprecated: use --env-kwargs", FutureWarning, stacklevel=1)
            if not isinstance(self.env_options, dict):
                raise ValueError(f"env_options: expected a YAML mapping, got {self.env_options!r}")
            self.env_kwargs = {**self.env_options, **self.env_kwargs}
            self.env_options = None
        if not isinstance(self.env_kwargs, dict):
            raise ValueError(f"env_kwargs: expected a YAML mapping, got {self.env_kwargs!r}")
        if self.view not in VIEWS:
            raise ValueError(f"view: {self.view!r} is not one of {', '.join(VIEWS)}")
        if self.fold and self.fold not in FOLDS:
            raise ValueError(f"fold: {self.fold!r} is not one of {', '.join(FOLDS)}")


def find_task(env: Env, task_id: str, fold: str = "") -> Task:
    """The task `task_id` of `env` (searching `fold`, or every fold), or the first dev task when no id is given."""
    if not task_id:
        tasks = env.tasks(fold or "dev", limit=1)
        if not tasks:
            raise InputError(f"env {env.name!r} has no tasks in fold {fold or 'dev'!r}")
        return tasks[0]
    seen: list[str] = []
    for f in [fold] if fold else list(FOLDS):
        tasks = env.tasks(f)
        for t in tasks:
            if t.task_id == task_id:
                return t
        seen += [t.task_id for t in tasks[:3]]
    where = f"fold {fold!r}" if fold else "any fold"
    raise InputError(f"task {task_id!r} is not in {where} of env {env.name!r}; task ids look like: {', '.join(seen)}")


def build_engine(cfg: EngineConfig) -> Engine:
    """The engine for `cfg` (a seam: tests replace it with a scripted engine)."""
    return engine_from_config(cfg)


def make_view(kind: str) -> Any:
    """A trace sink that prints events as they happen (rich colours when available)."""
    if kind == "none":
        return None
    if kind == "rich":
        try:
            from rich.console import Console
            from rich.markup import escape
        except ImportError:
            kind = "plain"
    if kind == "plain":
        return lambda e: print(format_event(e), flush=True)
    console = Console(highlight=False)
    styles: dict[type, str] = {
        ImagineEvent: "cyan",
        ActEvent: "green",
        PivotEvent: "bold yellow",
        ReplanEvent: "magenta",
        EndEvent: "bold",
    }

    def show(e: TraceEvent) -> None:
        style = styles.get(type(e), "")
        if isinstance(e, ActEvent) and e.error:
            style = "red"
        if isinstance(e, PivotEvent) and e.fired and e.severity == "error":
            style = "bold red"
        text = escape(format_event(e))
        console.print(f"[{style}]{text}[/]" if style else text)

    return show


@command("simplan run")
def main(argv: list[str] | None = None) -> int:
    run_cfg, engine_cfg, planner_cfg = parse_config(
        [RunConfig, EngineConfig, PlannerConfig], argv, description=__doc__.split("\n")[0], prog="simplan run"
    )
    if run_cfg.trace:
        check_output_file(run_cfg.trace, "--trace")  # before the engine loads, not after the episode ran
    with usage_errors(ImportError):  # an env whose package is not installed
        env = make_env(run_cfg.env, **run_cfg.env_kwargs)
    try:  # no such task, or an arm the engine cannot serve, is an InputError: nothing ran, nothing written
        task = find_task(env, run_cfg.task, run_cfg.fold)
        engine = build_engine(engine_cfg)
        try:
            planner = Planner(engine, env, planner_cfg, sink=make_view(run_cfg.view))
            result = planner.run(task)
        finally:
            engine.close()
    finally:
        env.close()
    # env.name, not --env: a module:Class spec is no file name
    out = Path(run_cfg.trace or f"runs/run/{env.name}-{task.task_id}-{planner_cfg.arm}.jsonl")
    append_trace(out, result.trace)
    s = result.summary
    print(
        f"{task.task_id} [{planner_cfg.arm}] {s.status}: success={s.success} score={s.score:g} steps={s.steps} "
        f"invalid={s.invalid_actions} pivots={s.pivots} replans={s.replans} model calls={s.model_calls} "
        f"tokens={s.total_tokens} wall={s.wall_seconds:.2f}s planning={s.planning_share:.0%}\ntrace: {out}"
    )
    if s.status == "errored":
        end = result.trace.end
        print(f"episode errored: {end.error if end else 'unknown error'}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
