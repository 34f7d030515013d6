"""Evaluate agent arms on a suite: every (task, arm, repeat) episode, concurrently, against ONE engine.

    simplan eval --suite twx-dev --arms reactive,plan,simplan --episodes 3 --engine hf \\
        --adapters decider=runs/train/decider/adapter,simulator=runs/train/simulator/adapter \\
        --out runs/eval/twx-dev --concurrency 8

    from simplan.evaluation.runner import EvalConfig, evaluate
    outcome = evaluate(EvalConfig(suite="toy-dev", out="runs/eval/toy"), engine, concurrency=4)

`evaluate` runs in phases: prepare the folder (its lock, its identity), plan and validate the episodes,
resume, run them, record the invocation. This module holds the configuration, the plan of episodes and
what a run folder's episodes depend on; evaluation/folder_lock.py the lock, evaluation/resume.py the
repair of the logs and the finished episodes, evaluation/episode_threads.py the env slots and threads.

How it runs:
- Episodes of all arms run at once in `concurrency` threads, task-major (the arms of one task side
  by side), sharing one `BatchingEngine` (inference/engines/batching.py): their model calls merge into
  batched engine calls. With engine lanes (inference/engines/lanes.py: the engine in N processes, `lanes`),
  each episode runs on the lane with the fewest episodes and its calls merge with that lane's. Each thread
  slot owns its env instances, created on first use and reused (one JVM per slot for TextWorld-Express /
  ScienceWorld), wrapped by the suite's fault injection (evaluation/faults.py) when it has any.
- Episode ids are "{suite}/{env}/{task_id}/{arm}/{repeat}". Each finished episode is appended in
  one write to `out/traces.jsonl` (its whole trace, inference/planning/trace.py) and then to
  `out/results.jsonl` (its `EpisodeSummary`). Re-running the same command resumes: an episode
  whose trace has an end event is never run again, unless it ended "errored" (a crash inside the
  planner, env or engine: it has no valid result, so its events move to `traces.jsonl.errored`, its
  result line is dropped, and it runs again); a torn last line is moved to `FILE.torn`, the
  events of an episode cut short are moved to `traces.jsonl.partial`, a second finished run of an
  episode (only a file written by two runs at once has one) to `traces.jsonl.duplicate`, and a
  result line missing for a finished trace is rebuilt from the trace. The traces are the source of
  every metric (evaluation/metrics.py); results.jsonl is a convenience copy.
- Errored episodes are named in `EvalOutcome.errors`; `errored_message` words them for the user
  (`simplan eval` and the pipeline's eval stage fail with it rather than report crashes as scores).
- One run at a time per folder: `out/eval.lock` is locked (flock) for the run's duration, so a
  second `simplan eval` on the same --out refuses at once, naming the pid that holds it. The OS
  drops the lock when its process dies, so a crashed run never leaves a stale lock behind.
- `out/eval_config.json` records what the episodes depend on (suite, planner settings, faults,
  model and adapters); resuming with different values is refused (use another --out or --fresh).
  `out/run.json` records each invocation's wall time, concurrency and batching statistics.
- The fault schedule of an episode is keyed without the arm, so every arm meets the same faults.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from simplan.core.config import build, flatten, merge, upgrade_keys
from simplan.core.errors import InputError
from simplan.core.io import append_jsonl, write_json
from simplan.envs.base import Task
from simplan.evaluation.episode_threads import EnvSlot, locked_token_counter, run_episode, run_in_slots
from simplan.evaluation.faults import FaultConfig, FaultyEnv
from simplan.evaluation.folder_lock import lock_folder
from simplan.evaluation.resume import RESULTS, TRACES, finished_traces, sync_results
from simplan.evaluation.suites import StepCap, Suite, SuiteEntry, entry_tasks_with_caps, load_suite
from simplan.inference.engines.base import Engine, EnvBoundEngine
from simplan.inference.engines.batching import batcher_for
from simplan.inference.planning.arms import ARM_PRESETS
from simplan.inference.planning.config import PlannerConfig
from simplan.inference.planning.trace import append_trace

# The default comparison; every preset of inference/planning/arms.py may be asked for.
ARMS = ("reactive", "plan", "simplan")
# The first arms of --arms are the paired comparison a time budget completes first (evaluation/paired.py).
COMPARED_ARMS = 2


def _help(text: str) -> dict[str, str]:
    return {"help": text}


@dataclass
class EvalConfig:
    """What to evaluate and where to write it. The engine comes from EngineConfig (same command line)."""

    suite: str = field(default="toy-dev", metadata=_help("suite name (recipes/suites/NAME.yaml) or a YAML path"))
    arms: list[str] = field(
        default_factory=lambda: list(ARMS),
        metadata=_help(
            "arms to compare: reactive,plan,simplan (also reactive-pivots, simplan-oracle, simplan-always, "
            "simplan-router)"
        ),
    )
    episodes: int = field(default=0, metadata=_help("tasks per family (0: the suite's tasks_per_family)"))
    repeats: int = field(default=1, metadata=_help("episodes per (task, arm); >1 only differs with sampling"))
    out: str = field(default="runs/eval/default", metadata=_help("run folder: traces.jsonl, results.jsonl, ..."))
    max_steps: int = field(
        default=0, metadata=_help("a flat cap of real steps per episode, replacing the suite's caps (0: the suite's)")
    )
    step_cap: dict | None = field(
        default=None,
        metadata=_help("per-task cap from the expert's path, e.g. '{factor: 2, plus: 10}' (default: the suite's)"),
    )
    faults: dict | None = field(
        default=None, metadata=_help("fault rates for every entry, e.g. '{transient: 0.1}' (default: the suite's)")
    )
    planner: dict = field(
        default_factory=dict, metadata=_help("PlannerConfig fields for every arm, e.g. '{horizon: 2, k: 3}'")
    )
    arm_overrides: dict = field(
        default_factory=dict, metadata=_help("per-arm PlannerConfig fields, e.g. '{plan: {horizon: 4}}'")
    )
    concurrency: int = field(
        default=16,
        metadata=_help("episodes run at once; their model calls are merged into batched engine calls"),
    )
    batch_window_ms: float = field(
        default=20.0, metadata=_help("batching: wait at most this long for other episodes' requests")
    )
    batching: bool = field(default=True, metadata=_help("merge concurrent episodes' engine calls"))
    limit: int = field(default=0, metadata=_help("run at most this many new episodes (0: all); a smoke test"))
    max_minutes: float = field(
        default=0.0,
        metadata=_help(
            "time budget: no task starts after this many minutes of the run (0: none); a started task's compared "
            "arms complete its pair; a later arm's episode starts only if its step cap fits in the time left at "
            "that arm's pace so far, and those still running then are stopped (they run on the next run); "
            "episodes are ordered for a budget: games in turn, the compared arms of every task before later arms"
        ),
    )
    compared_arms: int = field(
        default=COMPARED_ARMS,
        metadata=_help(
            "the first N of --arms are the compared ones: a time budget plays them on every task it starts, before "
            "any later arm (a bound such as simplan-oracle runs on the tasks the time left allows); N >= 1"
        ),
    )
    fresh: bool = field(default=False, metadata=_help("delete the run folder's previous results first"))
    progress: bool = field(default=True, metadata=_help("show a progress bar"))

    def __post_init__(self) -> None:
        bad = [a for a in self.arms if a not in ARM_PRESETS]
        if bad or not self.arms:
            raise ValueError(f"arms: {bad or self.arms!r} not valid; choose from {', '.join(ARM_PRESETS)}")
        for name in ("episodes", "max_steps", "limit", "max_minutes"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}: must be >= 0, got {getattr(self, name)}")
        if self.compared_arms < 1:
            raise ValueError(f"compared_arms: must be >= 1 (all arms when more than given), got {self.compared_arms}")
        if self.repeats < 1:
            raise ValueError(f"repeats: must be >= 1, got {self.repeats}")
        if self.concurrency < 1:
            raise ValueError(f"concurrency: must be >= 1, got {self.concurrency}")
        if self.batch_window_ms < 0:
            raise ValueError(f"batch_window_ms: must be >= 0, got {self.batch_window_ms}")
        if self.faults is not None:
            FaultConfig.from_dict(self.faults)
        if self.step_cap is not None:
            StepCap.from_dict(self.step_cap)
            if self.max_steps:
                raise ValueError("max_steps and step_cap: give one step cap, a flat one or one from the expert's path")
        unknown_arms = sorted(set(self.arm_overrides) - set(ARM_PRESETS))
        if unknown_arms:
            raise ValueError(f"arm_overrides: unknown arm(s) {unknown_arms}; arms are {', '.join(ARM_PRESETS)}")


@dataclass
class EpisodeSpec:
    entry: SuiteEntry
    task: Task
    arm: str
    repeat: int
    episode_id: str
    fault_key: str  # the fault schedule's identity: no arm, so all arms meet the same faults
    max_steps: int  # the task's step cap, the same in every arm


@dataclass
class EpisodeError:
    """An episode of this invocation that ended "errored": it has no valid result (a re-run plays it again)."""

    episode_id: str
    arm: str
    error: str  # the end event's message: the exception and its traceback


@dataclass
class EvalOutcome:
    out: Path
    planned: int
    skipped: int  # already done before this invocation
    ran: int
    errored: int
    seconds: float
    batch: dict[str, Any]
    traces: Path
    results: Path
    errors: list[EpisodeError] = field(default_factory=list)  # in episode order; len(errors) == errored
    not_started: int = 0  # episodes the time budget (max_minutes) left for a later run
    stopped: int = 0  # episodes of later arms the time budget stopped while running (they run on a later run)

    @property
    def left(self) -> int:
        """Episodes the time budget left for a later run: not started or stopped."""
        return self.not_started + self.stopped


def budget_message(outcome: EvalOutcome, minutes: float, rerun: str = "") -> str | None:
    """What the user is told when the time budget left episodes unplayed (None when it left none); `rerun`: how
    to play the rest (default: the same `simplan eval` command)."""
    if not outcome.left:
        return None
    stopped = f" and {outcome.stopped} stopped while running" if outcome.stopped else ""
    rerun = rerun or (
        "Re-run the same command to play the rest (finished episodes are kept), or give --max_minutes 0 to play "
        "them all"
    )
    return (
        f"eval: the time budget ({minutes:g} min) ran out: {outcome.not_started} of {outcome.planned} episode(s) not "
        f"started{stopped}; paired comparisons count the tasks both arms finished. {rerun}"
    )


def errored_message(outcome: EvalOutcome) -> str | None:
    """What the user must be told when episodes of this invocation errored (None when none did).

    An errored episode crashed (planner, env or engine): it has no result, so counting it as a failure
    would report the crash as the method's score.
    """
    if not outcome.errors:
        return None
    per_arm = Counter(e.arm for e in outcome.errors)
    first = outcome.errors[0]
    lines = [line.strip() for line in first.error.splitlines() if line.strip()]
    return (
        f"{len(outcome.errors)} of {outcome.planned} episode(s) errored "
        f"({', '.join(f'{arm} {n}' for arm, n in per_arm.items())}): they crashed and have no result, so success "
        f"rates over them are not scores. First: {first.episode_id}: {lines[-1] if lines else 'no message'}. "
        f"Full tracebacks: the 'error' field of their end events in {outcome.traces}. Fix the cause and re-run the "
        "same command: it runs only the errored and unfinished episodes again (finished ones are kept; the errored "
        f"runs move to {TRACES}.errored)"
    )


# ---------------------------------------------------------------------------------------------
# Planning: which episodes
# ---------------------------------------------------------------------------------------------
def resolve_suite(cfg: EvalConfig) -> Suite:
    """The suite with this command's overrides (tasks per family, step cap, faults) applied."""
    suite = load_suite(cfg.suite)
    for e in suite.entries:
        if cfg.episodes:
            e.tasks_per_family = cfg.episodes
        if cfg.max_steps:
            e.max_steps, e.step_cap = cfg.max_steps, None
        if cfg.step_cap is not None:
            e.step_cap = StepCap.from_dict(cfg.step_cap)
        if cfg.faults is not None:
            e.faults = FaultConfig.from_dict(cfg.faults)
    return suite


def plan_episodes(suite: Suite, arms: list[str], repeats: int) -> list[EpisodeSpec]:
    """Task-major order: the arms of one task run side by side (so their calls batch together).

    Paired by construction: every arm gets every (task, repeat) with the same step cap and fault key,
    so arms compare task by task (evaluation/paired.py).
    """
    specs = []
    for entry in suite.entries:
        for task, cap in entry_tasks_with_caps(entry):
            for r in range(repeats):
                base = f"{suite.name}/{task.env}/{task.task_id}"
                for arm in arms:
                    specs.append(EpisodeSpec(entry, task, arm, r, f"{base}/{arm}/{r}", f"{base}/{r}", cap))
    return specs


def budget_order(specs: list[EpisodeSpec], arms: list[str], compared_arms: int = COMPARED_ARMS) -> list[EpisodeSpec]:
    """The episodes in the order a time budget should cut them: every task's compared arms (the first
    `compared_arms` of `arms`) before any later arm, and within each the games in turn (the first task of every
    game, then the second, ...), so a run cut short holds complete pairs from every game."""
    compared = set(arms[:compared_arms])
    games: dict[tuple[int, str], int] = {}  # (suite entry, family) -> its index
    place: dict[str, tuple[int, int]] = {}  # task (fault key) -> (its position within its game, the game's index)
    seen: Counter[int] = Counter()
    for s in specs:
        if s.fault_key not in place:
            game = games.setdefault((id(s.entry), s.task.family), len(games))
            place[s.fault_key] = (seen[game], game)
            seen[game] += 1
    order = sorted(range(len(specs)), key=lambda i: (specs[i].arm not in compared, *place[specs[i].fault_key], i))
    return [specs[i] for i in order]


class TimeBudget:
    """Which episodes may still start under `EvalConfig.max_minutes`: any compared arm before the deadline; after
    it, only a compared arm of a task whose other compared arm started (so pairs complete). A later arm's episode
    (the bound) starts only if it can finish before the deadline: its step cap at the arm's pace so far (seconds
    per step over its finished episodes, `finished_episode`; before any, the slowest arm's) fits in the time
    left. Refused episodes are counted (`refused`). At the deadline, later arms' episodes still running are
    stopped (`expire`): each `running` one's cancel is called and its id kept in `stopped`, so the budget bounds
    the run's time while the pairs finish. `finished`: the episodes an earlier run finished (their tasks count as
    begun)."""

    STOP_REASON = "the eval time budget (max_minutes) ran out: the episode runs again on the next run"

    def __init__(
        self, minutes: float, arms: list[str], finished: list[EpisodeSpec], compared_arms: int = COMPARED_ARMS
    ) -> None:
        self.deadline = time.perf_counter() + 60.0 * minutes if minutes > 0 else None
        self.compared = set(arms[:compared_arms])
        self.begun = {s.fault_key for s in finished if s.arm in self.compared}  # tasks with a compared arm begun
        self.refused = 0
        self.stopped: set[str] = set()  # episode ids of later arms stopped at the deadline
        self._expired = False
        self._running: dict[str, Callable[[str], None]] = {}  # later arms' episodes: id -> cancel
        self._pace: dict[str, list[float]] = {}  # arm -> [seconds, steps] of its finished episodes
        self._lock = threading.Lock()

    def admit(self, spec: EpisodeSpec) -> bool:
        with self._lock:
            compared = spec.arm in self.compared
            if self.deadline is None:
                return True
            left = self.deadline - time.perf_counter()
            if compared and (left > 0 or spec.fault_key in self.begun):
                self.begun.add(spec.fault_key)
                return True
            if not compared and left > 0 and self._fits(spec, left):
                return True
            self.refused += 1
            return False

    def _fits(self, spec: EpisodeSpec, left: float) -> bool:
        """Whether `spec`'s step cap at its arm's pace (else the slowest arm's; none yet: it fits) fits in `left`."""
        paces = {arm: seconds / steps for arm, (seconds, steps) in self._pace.items() if steps}
        pace = paces.get(spec.arm, max(paces.values(), default=0.0))
        return spec.max_steps * pace <= left

    def finished_episode(self, spec: EpisodeSpec, seconds: float, steps: int) -> None:
        """An episode of this run finished in `seconds` of wall time after `steps` real steps (its arm's pace)."""
        with self._lock:
            pace = self._pace.setdefault(spec.arm, [0.0, 0])
            pace[0] += seconds
            pace[1] += steps

    def running(self, spec: EpisodeSpec, cancel: Callable[[str], None]) -> None:
        """`spec` started; `cancel(reason)` stops it (a later arm's episode is stopped at the deadline, at once
        if the deadline passed while it was being started)."""
        if self.deadline is None or spec.arm in self.compared:
            return
        with self._lock:
            if not self._expired:
                self._running[spec.episode_id] = cancel
                return
            self.stopped.add(spec.episode_id)
        cancel(self.STOP_REASON)

    def ended(self, spec: EpisodeSpec) -> None:
        with self._lock:
            self._running.pop(spec.episode_id, None)

    def expire(self) -> None:
        """The deadline: stop the later arms' running episodes."""
        with self._lock:
            self._expired = True
            cut, self._running = self._running, {}
            self.stopped.update(cut)
        for cancel in cut.values():
            cancel(self.STOP_REASON)

    def seconds_left(self) -> float | None:
        return None if self.deadline is None else max(0.0, self.deadline - time.perf_counter())


def planner_config(cfg: EvalConfig, arm: str, entry: SuiteEntry, max_steps: int | None = None) -> Any:
    """The arm's PlannerConfig for a task of `entry`; `max_steps`: the task's cap (default: the entry's)."""
    cap = entry.max_steps if max_steps is None else max_steps
    values = merge(
        flatten(PlannerConfig, cfg.planner, "planner"),
        flatten(PlannerConfig, cfg.arm_overrides.get(arm, {}), f"arm_overrides[{arm}]"),
    )
    return build(PlannerConfig, merge(values, {"arm": arm, "budgets.max_steps": cap}), f" (arm {arm})")


def check_planner_settings(cfg: EvalConfig) -> None:
    """Build every arm's PlannerConfig for every entry of the suite once, so that a wrong `planner` or
    `arm_overrides` value (or suite) fails, naming the arm, before an engine loads or a pipeline trains; no env
    starts. The run builds them again per task cap (`_plan_and_validate`)."""
    for entry in resolve_suite(cfg).entries:
        for arm in cfg.arms:
            planner_config(cfg, arm, entry)


def canonical_planner_keys(identity: dict[str, Any]) -> dict[str, Any]:
    """An eval identity with its planner mappings in today's nested keys: a run folder written with flat keys
    (before PlannerConfig had sections) resumes under the same command."""
    out = dict(identity)
    if isinstance(out.get("planner"), dict):
        out["planner"] = upgrade_keys(PlannerConfig, out["planner"], "planner")
    if isinstance(out.get("arm_overrides"), dict):
        out["arm_overrides"] = {
            arm: upgrade_keys(PlannerConfig, over, f"arm_overrides[{arm}]") if isinstance(over, dict) else over
            for arm, over in out["arm_overrides"].items()
        }
    return out


# ---------------------------------------------------------------------------------------------
# Identity: what a run folder's episodes depend on
# ---------------------------------------------------------------------------------------------
def _identity(cfg: EvalConfig, suite: Suite, engine_info: dict[str, Any]) -> dict[str, Any]:
    """What an episode's outcome depends on (arms, episodes, repeats and limit only add episodes)."""
    s = suite.to_dict()
    s.pop("path", None)
    s.pop("description", None)
    for e in s["entries"]:
        e.pop("tasks_per_family", None)  # more tasks extend a run; they do not change finished episodes
    return {
        "suite": s,
        "planner": upgrade_keys(PlannerConfig, cfg.planner, "planner"),
        "arm_overrides": {
            arm: upgrade_keys(PlannerConfig, o, f"arm_overrides[{arm}]") for arm, o in cfg.arm_overrides.items()
        },
        "engine": {k: engine_info.get(k) for k in ("engine", "model", "adapters")},
    }


def check_identity(out: Path, identity: dict[str, Any]) -> None:
    path = out / "eval_config.json"
    if path.exists():
        old = json.loads(path.read_text()).get("identity")
        if old is not None:
            old = canonical_planner_keys(old)
        if old is not None and old != identity:
            changed = sorted(k for k in identity if old.get(k) != identity.get(k))
            raise InputError(
                f"{out}: holds episodes of a different evaluation (changed: {', '.join(changed)}; see {path}); "
                "use another --out, or --fresh to delete the old results"
            )


def check_arms_start(engine: Engine, slot: EnvSlot, specs: list[EpisodeSpec], configs: dict[Any, Any]) -> None:
    """Build the first planner of each arm (no episode runs): an arm the engine cannot serve (e.g. a missing
    simulator adapter) or an env that cannot be made raises here, before the run writes anything."""
    from simplan.inference.planning.planner import Planner

    seen: set[str] = set()
    for spec in specs:
        if spec.arm not in seen:
            seen.add(spec.arm)
            Planner(engine, slot.env_for(spec.entry), configs[_config_key(spec)]).close()


# ---------------------------------------------------------------------------------------------
# Running
# ---------------------------------------------------------------------------------------------
def evaluate(
    cfg: EvalConfig,
    engine: Engine,
    concurrency: int | None = None,
    engine_info: dict[str, Any] | None = None,
) -> EvalOutcome:
    """Run every episode of the suite not finished yet (module docstring); returns counts and paths.

    Raises FolderLockedError when another process is evaluating into the same folder.
    """
    concurrency = cfg.concurrency if concurrency is None else concurrency
    if concurrency < 1:
        raise ValueError(f"concurrency: must be >= 1, got {concurrency}")
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    with lock_folder(out):
        return _evaluate_locked(cfg, out, engine, concurrency, engine_info)


def _evaluate_locked(
    cfg: EvalConfig, out: Path, engine: Engine, concurrency: int, engine_info: dict[str, Any] | None
) -> EvalOutcome:
    engine_info = dict(engine_info or {})
    suite, identity = _prepare_folder(cfg, out, engine_info)
    specs, configs, first_slot = _plan_and_validate(cfg, out, engine, suite, identity, engine_info)
    todo, skipped = _resume(cfg, out, specs)
    if cfg.max_minutes:
        todo = budget_order(todo, cfg.arms, cfg.compared_arms)
    left = {s.episode_id for s in todo}
    budget = TimeBudget(cfg.max_minutes, cfg.arms, [s for s in specs if s.episode_id not in left], cfg.compared_arms)
    tally = _run(cfg, out, engine, todo, configs, first_slot, concurrency, len(specs), skipped, budget)
    lanes_peak = getattr(engine, "peaks_mb", None)  # engine lanes hold their memory in processes of their own
    _record_invocation(out, cfg, concurrency, tally, engine_info, budget, lanes_peak() if lanes_peak else None)
    return EvalOutcome(
        out=out,
        planned=len(specs),
        skipped=skipped,
        ran=tally.counts["ran"],
        errored=tally.counts["errored"],
        seconds=tally.seconds,
        batch=tally.batch,
        traces=out / TRACES,
        results=out / RESULTS,
        errors=[tally.errors[s.episode_id] for s in todo if s.episode_id in tally.errors],
        not_started=budget.refused,
        stopped=tally.counts["stopped"],
    )


def _prepare_folder(cfg: EvalConfig, out: Path, engine_info: dict[str, Any]) -> tuple[Suite, dict[str, Any]]:
    """--fresh deletes the folder's previous results; the suite and the identity of its episodes, checked against
    the folder's (a folder of another evaluation is refused)."""
    if cfg.fresh:
        extra = (TRACES + ".partial", TRACES + ".duplicate", TRACES + ".errored")
        for name in (TRACES, RESULTS, "eval_config.json", "run.json", *extra):
            (out / name).unlink(missing_ok=True)
    suite = resolve_suite(cfg)
    identity = _identity(cfg, suite, engine_info)
    check_identity(out, identity)
    return suite, identity


def _plan_and_validate(
    cfg: EvalConfig, out: Path, engine: Engine, suite: Suite, identity: dict[str, Any], engine_info: dict[str, Any]
) -> tuple[list[EpisodeSpec], dict[Any, Any], EnvSlot]:
    """The episodes, each arm's PlannerConfig per task cap, and the first env slot, with every arm started once;
    then eval_config.json records what the episodes depend on."""
    specs = plan_episodes(suite, cfg.arms, cfg.repeats)
    configs = {_config_key(s): planner_config(cfg, s.arm, s.entry, s.max_steps) for s in specs}  # validate now
    step_caps = {s.fault_key: s.max_steps for s in specs}  # per (task, repeat): one cap shared by the arms
    first_slot = EnvSlot()
    try:  # nothing is written before every arm can start: a refused start leaves no eval_config.json behind
        check_arms_start(engine, first_slot, specs, configs)
    except BaseException:
        first_slot.close()
        raise
    write_json(
        out / "eval_config.json",
        {
            "identity": identity,
            "eval": dataclasses.asdict(cfg),
            "suite": suite.to_dict(),
            "engine": engine_info,
            "step_caps": step_caps,
        },
    )
    return specs, configs, first_slot


def _resume(cfg: EvalConfig, out: Path, specs: list[EpisodeSpec]) -> tuple[list[EpisodeSpec], int]:
    """The episodes still to run (at most --limit of them) and how many are done, after repairing the logs."""
    done, notes = finished_traces(out)
    for n in notes:
        print(f"eval: {n}", flush=True)
    recovered = sync_results(out, done)
    if recovered:
        print(f"eval: rebuilt {recovered} result line(s) from finished traces", flush=True)
    todo = [s for s in specs if s.episode_id not in done]
    skipped = len(specs) - len(todo)
    if cfg.limit:
        todo = todo[: cfg.limit]
    return todo, skipped


@dataclass
class _Tally:
    """What this invocation's episodes came to."""

    counts: dict[str, int]  # ran, errored
    errors: dict[str, EpisodeError]  # by episode id
    seconds: float
    batch: dict[str, Any]  # the batcher's statistics ({} without one)


def _run(
    cfg: EvalConfig,
    out: Path,
    engine: Engine,
    todo: list[EpisodeSpec],
    configs: dict[Any, Any],
    first_slot: EnvSlot,
    concurrency: int,
    planned: int,
    skipped: int,
    budget: TimeBudget,
) -> _Tally:
    """Run `todo` in `concurrency` env slots sharing one batching engine, each started only if the `budget`
    admits it; each finished episode is appended to the traces, then to the results. At the budget's deadline the
    later arms' running episodes are stopped (through their batcher sessions: without a batcher they finish) and
    not recorded."""
    started = time.perf_counter()
    # A model-free engine (expert, random) has no model calls to merge, and binds itself to each episode's env.
    batching = cfg.batching and not isinstance(engine, EnvBoundEngine)  # no model calls to merge
    batcher = batcher_for(engine, cfg.batch_window_ms / 1000.0) if batching else None
    shared: Any = batcher if batcher is not None else engine
    count_tokens = locked_token_counter(engine)
    all_slots = [first_slot] + [EnvSlot() for _ in range(min(concurrency, max(1, len(todo))) - 1)]
    counts = {"ran": 0, "errored": 0, "stopped": 0}
    errors: dict[str, EpisodeError] = {}
    wins: dict[str, list[int]] = {a: [0, 0] for a in cfg.arms}
    bar = _progress(cfg, planned, skipped)

    def leave_out() -> None:
        """The bar ends at the episodes the time budget let finish: one fewer (not started or stopped)."""
        if bar is None:
            return
        bar.total -= 1
        cut = [f"{budget.refused} not started"] + ([f"{counts['stopped']} stopped"] if counts["stopped"] else [])
        bar.set_description_str(f"eval {Path(cfg.out).name} ({', '.join(cut)}: time budget)")

    def play(spec: EpisodeSpec, slot: EnvSlot) -> Any:
        env = slot.env_for(spec.entry)
        if isinstance(env, FaultyEnv):
            env.begin_episode(spec.fault_key)
        pcfg = configs[_config_key(spec)]
        if batcher is None:
            return run_episode(shared, env, spec.task, pcfg, spec.episode_id, count_tokens)
        with batcher.session() as session:
            budget.running(spec, session.cancel)
            try:
                return run_episode(shared, env, spec.task, pcfg, spec.episode_id, count_tokens)
            finally:
                budget.ended(spec)

    def record(spec: EpisodeSpec, result: Any) -> None:
        if spec.episode_id in budget.stopped and result.summary.status == "errored":  # cut: runs again next time
            counts["stopped"] += 1
            leave_out()
            return
        append_trace(out / TRACES, result.trace)
        append_jsonl(out / RESULTS, [result.summary.to_dict()])
        counts["ran"] += 1
        budget.finished_episode(spec, result.summary.wall_seconds, result.summary.steps)
        if result.summary.status == "errored":
            counts["errored"] += 1
            end = result.trace.end
            errors[spec.episode_id] = EpisodeError(spec.episode_id, spec.arm, (end.error if end else None) or "")
        wins[spec.arm][0] += bool(result.summary.success)
        wins[spec.arm][1] += 1
        if bar is not None:
            bar.set_postfix_str(" ".join(f"{a}={w}/{n}" for a, (w, n) in wins.items() if n), refresh=False)
            bar.update(1)

    def admit(spec: EpisodeSpec) -> bool:
        if budget.admit(spec):
            return True
        leave_out()
        return False

    left = budget.seconds_left()
    timer = threading.Timer(left, budget.expire) if left is not None else None
    if timer is not None:
        timer.daemon = True
        timer.start()
    try:
        run_in_slots(todo, play, record, all_slots, batcher, bar, admit=admit)
    finally:
        if timer is not None:
            timer.cancel()
    seconds = time.perf_counter() - started
    batch = batcher.stats.to_dict() if batcher is not None else {}
    return _Tally(counts, errors, seconds, batch)


def _config_key(spec: EpisodeSpec) -> tuple[str, int, int]:
    return (spec.arm, id(spec.entry), spec.max_steps)


def _progress(cfg: EvalConfig, total: int, initial: int) -> Any:
    if not cfg.progress:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, desc=f"eval {Path(cfg.out).name}", unit="ep", dynamic_ncols=True)


def _record_invocation(
    out: Path,
    cfg: EvalConfig,
    concurrency: int,
    tally: _Tally,
    engine_info: dict[str, Any],
    budget: TimeBudget,
    lane_peaks: list[float | None] | None = None,
) -> None:
    path = out / "run.json"
    info = json.loads(path.read_text()) if path.exists() else {"invocations": []}
    info["invocations"].append(
        {
            "finished": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "seconds": round(tally.seconds, 3),
            "episodes_run": tally.counts["ran"],
            "errored": tally.counts["errored"],
            "max_minutes": cfg.max_minutes,
            "not_started": budget.refused,
            "stopped": tally.counts["stopped"],
            "concurrency": concurrency,
            "batching": cfg.batching,
            "batch": tally.batch,
            "engine": engine_info,
            **({"lane_peak_rss_mb": lane_peaks} if lane_peaks else {}),
        }
    )
    info["seconds_total"] = round(sum(i["seconds"] for i in info["invocations"]), 3)
    write_json(path, info)
