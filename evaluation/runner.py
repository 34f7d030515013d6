"""Evaluate agent arms on a suite: every (task, arm, repeat) episode, concurrently, against ONE engine.

    simplan eval --suite twx-dev --arms reactive,plan,simplan --episodes 3 --engine hf \\
        --adapters decider=runs/train/decider/adapter,simulator=runs/train/simulator/adapter \\
        --out runs/eval/twx-dev --concurrency 8

    from simplan.evaluation.runner import EvalConfig, evaluate
    outcome = evaluate(EvalConfig(suite="toy-dev", out="runs/eval/toy"), engine, concurrency=4)

How it runs:
- Episodes of all arms run at once in `concurrency` threads, task-major (the arms of one task side
  by side), sharing one `BatchingEngine` (inference/engines/batching.py): their model calls merge into
  batched engine calls. Each thread slot owns its env instances, created on first use and reused
  (one JVM per slot for TextWorld-Express / ScienceWorld), wrapped by the suite's fault injection
  (evaluation/faults.py) when it has any.
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

import contextlib
import copy
import dataclasses
import fcntl
import json
import os
import queue
import signal
import socket
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from simplan.core.io import append_jsonl, read_jsonl_tolerant, write_json, write_jsonl
from simplan.envs.base import Env, Task
from simplan.envs.registry import make_env
from simplan.evaluation.faults import FaultConfig, FaultyEnv, wrap_faults
from simplan.evaluation.suites import StepCap, Suite, SuiteEntry, entry_tasks_with_caps, load_suite
from simplan.inference.engines.base import Engine
from simplan.inference.engines.batching import BatchingEngine
from simplan.inference.engines.model_free import ModelFreeEngine
from simplan.inference.planning.arms import ARM_PRESETS
from simplan.inference.planning.trace import EpisodeTrace, append_trace, episode_runs, summarize

# The default comparison; every preset of inference/planning/arms.py may be asked for.
ARMS = ("reactive", "plan", "simplan")
TRACES = "traces.jsonl"
RESULTS = "results.jsonl"
LOCK = "eval.lock"


def _help(text: str) -> dict[str, str]:
    return {"help": text}


@dataclass
class EvalConfig:
    """What to evaluate and where to write it. The engine comes from EngineConfig (same command line)."""

    suite: str = field(default="toy-dev", metadata=_help("suite name (recipes/suites/NAME.yaml) or a YAML path"))
    arms: list[str] = field(
        default_factory=lambda: list(ARMS),
        metadata=_help("arms to compare: reactive,plan,simplan (also simplan-oracle, simplan-always, simplan-router)"),
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
    batch_window_ms: float = field(
        default=20.0, metadata=_help("batching: wait at most this long for other episodes' requests")
    )
    batching: bool = field(default=True, metadata=_help("merge concurrent episodes' engine calls"))
    limit: int = field(default=0, metadata=_help("run at most this many new episodes (0: all); a smoke test"))
    fresh: bool = field(default=False, metadata=_help("delete the run folder's previous results first"))
    progress: bool = field(default=True, metadata=_help("show a progress bar"))

    def __post_init__(self) -> None:
        bad = [a for a in self.arms if a not in ARM_PRESETS]
        if bad or not self.arms:
            raise ValueError(f"arms: {bad or self.arms!r} not valid; choose from {', '.join(ARM_PRESETS)}")
        for name in ("episodes", "max_steps", "limit"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}: must be >= 0, got {getattr(self, name)}")
        if self.repeats < 1:
            raise ValueError(f"repeats: must be >= 1, got {self.repeats}")
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


def planner_config(cfg: EvalConfig, arm: str, entry: SuiteEntry, max_steps: int | None = None) -> Any:
    """The arm's PlannerConfig for a task of `entry`; `max_steps`: the task's cap (default: the entry's)."""
    from simplan.inference.planning.config import PlannerConfig

    cap = entry.max_steps if max_steps is None else max_steps
    values = {**cfg.planner, **cfg.arm_overrides.get(arm, {}), "arm": arm, "max_steps": cap}
    try:
        return PlannerConfig(**values)
    except TypeError as e:
        raise ValueError(f"planner / arm_overrides[{arm}]: {e}; keys are PlannerConfig fields") from None


# ---------------------------------------------------------------------------------------------
# Resume: repair the logs and find finished episodes
# ---------------------------------------------------------------------------------------------
def repair_tail(path: Path) -> str | None:
    """Move a torn last line (no trailing newline) to `path.torn`; returns a note when it did."""
    if not path.exists() or path.stat().st_size == 0:
        return None
    with open(path, "rb") as f:
        data = f.read()
    if data.endswith(b"\n"):
        return None
    cut = data.rfind(b"\n") + 1
    with open(path.with_name(path.name + ".torn"), "ab") as f:
        f.write(data[cut:] + b"\n")
    with open(path, "r+b") as f:
        f.truncate(cut)
    return f"{path}: torn last line ({len(data) - cut} bytes) moved to {path.name}.torn"


def finished_traces(out: Path) -> tuple[dict[str, EpisodeTrace], list[str]]:
    """Complete traces by episode id, after repairing the files; returns (traces, notes).

    traces.jsonl is left holding one finished run per episode (`episode_runs` picks it: the first
    finished one); the lines of unfinished runs move to traces.jsonl.partial, those of extra
    finished runs to traces.jsonl.duplicate, so no reader ever meets two runs of one episode, and
    those of errored runs to traces.jsonl.errored (with their result lines dropped): a crashed
    episode has no result, so it is not complete and runs again.
    """
    traces_path, notes = out / TRACES, []
    for p in (traces_path, out / RESULTS):
        note = repair_tail(p)
        if note:
            notes.append(note)
    if not traces_path.exists():
        return {}, notes
    records, problems = read_jsonl_tolerant(traces_path)
    notes.extend(problems)
    kept, left_out = episode_runs(records)
    complete = [run for run in kept if _finished(run) and not _errored(run)]
    errored = [run for run in kept if _errored(run)]
    moved = {
        ".partial": [r for run in [*kept, *left_out] if not _finished(run) for r in run],
        ".duplicate": [r for run in left_out if _finished(run) for r in run],
        ".errored": [r for run in errored for r in run],
    }
    if any(moved.values()):
        for suffix, lines in moved.items():
            append_jsonl(out / (TRACES + suffix), lines)
        write_jsonl(traces_path, [r for run in complete for r in run])
        _drop_results(out, {str(run[0].get("episode_id")) for run in errored})
        what = {
            ".partial": "unfinished episode runs",
            ".duplicate": "second finished runs of an episode",
            ".errored": "errored episode runs (they run again)",
        }
        notes.extend(
            f"{traces_path}: {len(lines)} event(s) of {what[suffix]} moved to {TRACES}{suffix}"
            for suffix, lines in moved.items()
            if lines
        )
    traces = [EpisodeTrace.from_dicts(run) for run in complete]
    return {t.episode_id: t for t in traces}, notes


def _finished(run: list[dict[str, Any]]) -> bool:
    return run[-1].get("type") == "end"


def _errored(run: list[dict[str, Any]]) -> bool:
    return _finished(run) and run[-1].get("status") == "errored"


def _drop_results(out: Path, episode_ids: set[str]) -> None:
    """Remove the result lines of `episode_ids` from results.jsonl (their episodes run again)."""
    path = out / RESULTS
    if not episode_ids or not path.exists():
        return
    records = read_jsonl_tolerant(path)[0]
    write_jsonl(path, [r for r in records if str(r.get("episode_id")) not in episode_ids])


def sync_results(out: Path, done: dict[str, EpisodeTrace]) -> int:
    """Append the summary of every finished trace missing from results.jsonl; returns how many."""
    have = {str(r.get("episode_id")) for r in read_jsonl_tolerant(out / RESULTS)[0]}
    missing = [summarize(t).to_dict() for eid, t in done.items() if eid not in have]
    append_jsonl(out / RESULTS, missing)
    return len(missing)


def _identity(cfg: EvalConfig, suite: Suite, engine_info: dict[str, Any]) -> dict[str, Any]:
    """What an episode's outcome depends on (arms, episodes, repeats and limit only add episodes)."""
    s = suite.to_dict()
    s.pop("path", None)
    s.pop("description", None)
    for e in s["entries"]:
        e.pop("tasks_per_family", None)  # more tasks extend a run; they do not change finished episodes
    return {
        "suite": s,
        "planner": cfg.planner,
        "arm_overrides": cfg.arm_overrides,
        "engine": {k: engine_info.get(k) for k in ("engine", "model", "adapters")},
    }


class FolderLockedError(RuntimeError):
    """Another process is writing the run folder."""


@contextlib.contextmanager
def lock_folder(out: Path) -> Iterator[None]:
    """Hold `out/eval.lock` for the block; refuse at once (FolderLockedError) if another process holds it.

    An flock belongs to the open file, so the OS releases it when the process exits, however it
    dies: no stale lock to clean up by hand. The file keeps the holder's pid, host and start time
    for the message; it is never deleted (deleting would let a third run lock a fresh file while a
    second still holds the old one).
    """
    path = out / LOCK
    with open(path, "a+", encoding="utf-8") as f:  # "a+": opening must not erase the holder's note
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            raise FolderLockedError(_locked_message(out, f.read())) from None
        try:
            f.seek(0)
            f.truncate()
            holder = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.strftime("%Y-%m-%dT%H:%M:%S")}
            f.write(json.dumps({**holder, "command": " ".join(sys.argv)}) + "\n")
            f.flush()
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def check_unlocked(out: Path) -> None:
    """Raise FolderLockedError if a run holds `out` now (a quick check before loading an engine for minutes)."""
    if (out / LOCK).exists():
        with lock_folder(out):
            pass


def _locked_message(out: Path, note: str) -> str:
    try:
        holder = json.loads(note)
        who = f"pid {holder['pid']} on {holder['host']}, running since {holder['started']}: {holder['command']}"
    except (json.JSONDecodeError, KeyError, TypeError):
        who = "a process that has not written its details yet"
    return (
        f"{out} is in use by another evaluation ({who}); two runs on one folder would write every episode twice. "
        f"Wait for it to finish (the lock in {out / LOCK} is released when that process exits, even if it "
        "crashes), stop it, or use another --out"
    )


def check_identity(out: Path, identity: dict[str, Any]) -> None:
    path = out / "eval_config.json"
    if path.exists():
        old = json.loads(path.read_text()).get("identity")
        if old is not None and old != identity:
            changed = sorted(k for k in identity if old.get(k) != identity.get(k))
            raise ValueError(
                f"{out}: holds episodes of a different evaluation (changed: {', '.join(changed)}; see {path}); "
                "use another --out, or --fresh to delete the old results"
            )


# ---------------------------------------------------------------------------------------------
# Running
# ---------------------------------------------------------------------------------------------
@contextlib.contextmanager
def ctrl_c_stops(batcher: BatchingEngine | None) -> Iterator[None]:
    """Ctrl-C while episodes run: the first raises KeyboardInterrupt as usual (episodes not started are dropped,
    running ones finish and are written); a second, wherever it lands, cancels the batcher, so each running
    episode ends at its next model call, recorded as errored (the next run plays it again). Without a batcher,
    or outside the main thread (no signal handler can be set there), Ctrl-C behaves as it always does."""
    if batcher is None or threading.current_thread() is not threading.main_thread():
        yield
        return
    presses = 0

    def on_sigint(signum: int, frame: Any) -> None:
        nonlocal presses
        presses += 1
        if presses == 1:
            raise KeyboardInterrupt
        print("eval: cutting the running episodes at their next model call", file=sys.stderr, flush=True)
        batcher.cancel("evaluation stopped by Ctrl-C; the episode runs again on the next run")

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def run_episode(
    engine: Engine,
    env: Env,
    task: Task,
    config: Any,
    episode_id: str,
    count_tokens: Callable[[list[dict[str, str]]], int] | None = None,
) -> Any:
    """One episode with the planning loop (the only coupling to inference/planning/planner.py)."""
    from simplan.inference.planning.planner import Planner

    planner = Planner(engine, env, config, count_tokens=count_tokens)
    try:
        return planner.run(task, episode_id=episode_id)
    finally:
        planner.close()  # the env oracle's copies (simulator: env) are per episode: their JVMs end with it


def check_arms_start(engine: Engine, slot: EnvSlot, specs: list[EpisodeSpec], configs: dict[Any, Any]) -> None:
    """Build the first planner of each arm (no episode runs): an arm the engine cannot serve (e.g. a missing
    simulator adapter) or an env that cannot be made raises here, before the run writes anything."""
    from simplan.inference.planning.planner import Planner

    seen: set[str] = set()
    for spec in specs:
        if spec.arm not in seen:
            seen.add(spec.arm)
            Planner(engine, slot.env_for(spec.entry), configs[_config_key(spec)]).close()


class EnvSlot:
    """The env instances of one concurrent episode slot, created on first use and reused."""

    def __init__(self) -> None:
        self.envs: dict[str, Env] = {}

    def env_for(self, entry: SuiteEntry) -> Env:
        key = f"{entry.env_key()}|{entry.faults.to_dict()}"
        if key not in self.envs:
            self.envs[key] = wrap_faults(make_env(entry.env, **entry.env_kwargs), entry.faults)
        return self.envs[key]

    def close(self) -> None:
        for env in self.envs.values():
            try:
                env.close()
            except Exception:  # noqa: BLE001 - closing is best effort; the process exits anyway
                pass
        self.envs.clear()


def locked_token_counter(engine: Any) -> Callable[[list[dict[str, str]]], int] | None:
    """A prompt-token counter for episode threads: its own tokenizer copy (fast tokenizers are not
    safe to share with the engine's thread) behind a lock; None when the engine has no tokenizer."""
    tok = getattr(engine, "tokenizer", None)
    if tok is None or not hasattr(tok, "apply_chat_template"):
        return None
    from simplan.data.format import chat_token_counter

    counter = chat_token_counter(copy.deepcopy(tok))
    lock = threading.Lock()

    def count(messages: list[dict[str, str]]) -> int:
        with lock:
            return counter(messages)

    return count


def evaluate(
    cfg: EvalConfig,
    engine: Engine,
    concurrency: int = 4,
    engine_info: dict[str, Any] | None = None,
) -> EvalOutcome:
    """Run every episode of the suite not finished yet (module docstring); returns counts and paths.

    Raises FolderLockedError when another process is evaluating into the same folder.
    """
    if concurrency < 1:
        raise ValueError(f"concurrency: must be >= 1, got {concurrency}")
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    with lock_folder(out):
        return _evaluate_locked(cfg, out, engine, concurrency, engine_info)


def _evaluate_locked(
    cfg: EvalConfig, out: Path, engine: Engine, concurrency: int, engine_info: dict[str, Any] | None
) -> EvalOutcome:
    if cfg.fresh:
        extra = (TRACES + ".partial", TRACES + ".duplicate", TRACES + ".errored")
        for name in (TRACES, RESULTS, "eval_config.json", "run.json", *extra):
            (out / name).unlink(missing_ok=True)
    engine_info = dict(engine_info or {})
    suite = resolve_suite(cfg)
    identity = _identity(cfg, suite, engine_info)
    check_identity(out, identity)
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

    started = time.perf_counter()
    # A model-free engine (expert, random) has no model calls to merge, and binds itself to each episode's env.
    batching = cfg.batching and not isinstance(engine, ModelFreeEngine)
    batcher = BatchingEngine(engine, window=cfg.batch_window_ms / 1000.0) if batching else None
    shared: Any = batcher if batcher is not None else engine
    count_tokens = locked_token_counter(engine)
    slots: queue.Queue[EnvSlot] = queue.Queue()
    all_slots = [first_slot] + [EnvSlot() for _ in range(min(concurrency, max(1, len(todo))) - 1)]
    for s in all_slots:
        slots.put(s)
    write_lock = threading.Lock()
    counts = {"ran": 0, "errored": 0}
    errors: dict[str, EpisodeError] = {}
    wins: dict[str, list[int]] = {a: [0, 0] for a in cfg.arms}
    bar = _progress(cfg, len(specs), skipped)

    def one(spec: EpisodeSpec) -> None:
        slot = slots.get()
        try:
            env = slot.env_for(spec.entry)
            if isinstance(env, FaultyEnv):
                env.begin_episode(spec.fault_key)
            pcfg = configs[_config_key(spec)]
            if batcher is not None:
                with batcher.session():
                    result = run_episode(shared, env, spec.task, pcfg, spec.episode_id, count_tokens)
            else:
                result = run_episode(shared, env, spec.task, pcfg, spec.episode_id, count_tokens)
        finally:
            slots.put(slot)
        with write_lock:
            append_trace(out / TRACES, result.trace)
            append_jsonl(out / RESULTS, [result.summary.to_dict()])
            counts["ran"] += 1
            if result.summary.status == "errored":
                counts["errored"] += 1
                end = result.trace.end
                errors[spec.episode_id] = EpisodeError(spec.episode_id, spec.arm, (end.error if end else None) or "")
            wins[spec.arm][0] += bool(result.summary.success)
            wins[spec.arm][1] += 1
            if bar is not None:
                bar.set_postfix_str(" ".join(f"{a}={w}/{n}" for a, (w, n) in wins.items() if n), refresh=False)
                bar.update(1)

    pool = ThreadPoolExecutor(max_workers=len(all_slots), thread_name_prefix="episode")
    futures = [pool.submit(one, s) for s in todo]
    with ctrl_c_stops(batcher):
        try:
            finished, _ = wait(futures, return_when=FIRST_EXCEPTION)
            failed = [f for f in finished if f.exception() is not None]
            if failed:
                raise failed[0].exception()  # type: ignore[misc]
        except KeyboardInterrupt:
            running = sum(f.running() for f in futures)
            again = " Ctrl-C again cuts them at their next model call (they run again next time)." if batcher else ""
            print(
                f"\neval: stopping; {running} running episode(s) finish and are kept.{again}",
                file=sys.stderr,
                flush=True,
            )
            raise
        finally:
            # On an error or Ctrl-C, episodes not started are dropped; running ones finish and are written.
            pool.shutdown(wait=True, cancel_futures=True)
            if bar is not None:
                bar.close()
            if batcher is not None:
                batcher.close()
            for s in all_slots:
                s.close()
    seconds = time.perf_counter() - started
    batch = batcher.stats.to_dict() if batcher is not None else {}
    _record_invocation(out, cfg, concurrency, seconds, counts, batch, engine_info)
    return EvalOutcome(
        out=out,
        planned=len(specs),
        skipped=skipped,
        ran=counts["ran"],
        errored=counts["errored"],
        seconds=seconds,
        batch=batch,
        traces=out / TRACES,
        results=out / RESULTS,
        errors=[errors[s.episode_id] for s in todo if s.episode_id in errors],
    )


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
    seconds: float,
    counts: dict[str, int],
    batch: dict[str, Any],
    engine_info: dict[str, Any],
) -> None:
    path = out / "run.json"
    info = json.loads(path.read_text()) if path.exists() else {"invocations": []}
    info["invocations"].append(
        {
            "finished": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "seconds": round(seconds, 3),
            "episodes_run": counts["ran"],
            "errored": counts["errored"],
            "concurrency": concurrency,
            "batching": cfg.batching,
            "batch": batch,
            "engine": engine_info,
        }
    )
    info["seconds_total"] = round(sum(i["seconds"] for i in info["invocations"]), 3)
    write_json(path, info)
