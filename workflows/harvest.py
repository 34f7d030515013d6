"""Evaluation traces as training trajectories: the data flywheel's harvest (`simplan traces`).

    simplan traces --runs runs/eval/twx-train-small --out runs/data/twx-traces.jsonl --arms simplan
    simplan build --role simulator --inputs runs/data/twx-train.jsonl,runs/data/twx-traces.jsonl --out ...

    from simplan.workflows.harvest import TracesConfig, harvest
    report = harvest(TracesConfig(runs=["runs/eval/toy"], out="runs/data/toy-traces.jsonl"))
    print(report.summary())

Every finished episode of the run folders' traces.jsonl (inference/planning/trace.py) becomes one trajectory
(data/trajectory.py) whose steps are the real transitions the agent caused: these are exactly the
states the agent visits, which expert and noisy-expert collection never reaches. Each step's source
says what it teaches (build's defaults: the decider learns `expert` and `recovery` steps, the
simulator every step):

    won episode (or final score >= min_score)
        expert     an action that neither failed nor repeated an earlier (action, observation) pair
        recovery   such an action right after a mistake (the agent got back on track)
        noise      a failed action (error observation, injected fault) or a repeat: masked context
    lost episode (nothing in it is imitated)
        policy     an action up to the episode's last score gain: real, but not worth imitating
        noise      a failed action, or any action after the last score gain: the episode never
                   recovered from them (an irreversible wrong action is the last of these)

Steps are rebuilt by replaying each episode in its env (`data/recorder.py`'s `Recorder`, the code that
records collected steps), so valid actions, tools, goal changes and the structured action are what
collection would record; the env's constructor arguments come from the run's eval_config.json. A
replay that does not reach the traced observations (an env whose reset or steps are not
deterministic) skips the episode, counted as `replay_mismatch`; an env that raises skips it as
`replay_error` and is made anew. An injected fault the env never ran (transient, tool_error) is
recorded without stepping the env, and a perturbed observation as the env really returned it (the
perturbation is noise, not dynamics). Unfinished and errored episodes are skipped and counted.

A trajectory is `{env}/{task_id}/{arm}/trace-{run_id}`, its policy the arm, its task (and fold) the
traced one: harvest from a suite of train-fold tasks to add training data (`simplan build` refuses a
task in two folds). `meta` keeps the episode id, run folder, end status, outcome and loss class
(evaluation/losses.py), and the request's grade where the run graded it (PlannerConfig grading). The
output is written atomically and passes `simplan validate` and `simplan build`.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from simplan.core.config import comma_list
from simplan.core.errors import EmptyInputError, MissingInputError
from simplan.core.io import has_lines, write_jsonl
from simplan.core.text import exact
from simplan.data.recorder import EpisodeSpec, Recorder
from simplan.data.trajectory import Trajectory
from simplan.envs.base import Action, ActionParseError, Env, Task
from simplan.envs.registry import make_env
from simplan.evaluation.losses import classify_loss
from simplan.inference.planning.oracle import NOT_EXECUTED_FAULTS
from simplan.inference.planning.trace import ActEvent, EpisodeTrace, read_trace_records, read_traces, redundant_steps

TRACES = "traces.jsonl"
EVAL_CONFIG = "eval_config.json"
TARGET_SOURCES = ("expert", "recovery")  # build's decider sources (data/build.py DECIDER_SOURCES)
MAX_REPORTED = 3  # skipped episodes named in the report per reason (the rest are counted)
_TRUNCATED = ("budget_steps", "budget_stall", "budget_replans", "budget_tokens", "budget_time")


@dataclass
class TracesConfig:
    """Which traces to harvest and where to write the trajectories (`simplan traces --help`)."""

    runs: list[str] = field(
        default_factory=list,
        metadata={"help": "eval run folders (their traces.jsonl) or trace files, comma-separated"},
    )
    out: str = field(default="", metadata={"help": "output trajectory JSONL (written atomically, replaced)"})
    arms: list[str] | None = field(default=None, metadata={"help": "only episodes of these arms (default: all)"})
    min_score: float | None = field(
        default=None,
        metadata={
            "help": "an unwon episode whose final score is at least this also counts as a success (its actions "
            "become decider targets; ScienceWorld's partial credit); none: only won episodes"
        },
    )

    def __post_init__(self) -> None:
        self.runs = comma_list(self.runs)
        if self.arms is not None:
            self.arms = comma_list(self.arms)
        if not self.runs:
            raise ValueError("runs: give at least one eval run folder or trace file (--runs runs/eval/NAME)")
        if not self.out:
            raise ValueError("out: give the output trajectory file (--out runs/data/NAME-traces.jsonl)")
        if self.arms is not None and not self.arms:
            raise ValueError("arms: give at least one arm, or leave it unset for all")


@dataclass
class TracesReport:
    """What a harvest read and wrote."""

    out: str
    episodes: int = 0  # finished episodes read (of the selected arms)
    written: int = 0
    outcomes: Counter = field(default_factory=Counter)  # won, recovered (won after a mistake), lost
    skipped: Counter = field(default_factory=Counter)  # reason -> episodes
    sources: Counter = field(default_factory=Counter)  # step source -> steps
    decider_targets: int = 0  # expert and recovery steps that did not fail
    transitions: int = 0  # every written step: simulator rows
    folds: Counter = field(default_factory=Counter)
    problems: list[str] = field(default_factory=list)  # unreadable lines, first episodes of each skip reason
    bad_lines: int = 0  # lines of the trace files that could not be read (named in `problems`)

    @property
    def masked(self) -> int:
        """Steps kept as context only: not decider targets."""
        return self.transitions - self.decider_targets

    def summary(self) -> str:
        lines = [
            f"traces -> {self.out}",
            f"  episodes: {self.episodes} finished, {self.written} written "
            f"({', '.join(f'{k} {v}' for k, v in sorted(self.outcomes.items())) or 'none'})",
            f"  transitions (simulator rows): {self.transitions}; decider targets: {self.decider_targets}; "
            f"masked steps: {self.masked}",
            f"  steps by source: {dict(sorted(self.sources.items()))}",
        ]
        if self.folds:
            lines.append(f"  folds: {dict(sorted(self.folds.items()))}")
        if self.skipped:
            lines.append(f"  skipped: {dict(sorted(self.skipped.items()))}")
        lines += [f"  ! {p}" for p in self.problems]
        return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Which steps teach what
# ---------------------------------------------------------------------------------------------
def failed(act: ActEvent) -> bool:
    """The action failed: an error observation, or an injected fault the env never ran."""
    return act.error or act.fault in NOT_EXECUTED_FAULTS


def step_sources(acts: list[ActEvent], succeeded: bool) -> list[str]:
    """Each real step's source (the table in the module docstring)."""
    if succeeded:
        repeats = set(redundant_steps(acts))
        out, after_mistake = [], False
        for act in acts:
            mistake = failed(act) or act.step in repeats
            out.append("noise" if mistake else "recovery" if after_mistake else "expert")
            after_mistake = mistake
        return out
    last_gain = max((i for i, act in enumerate(acts) if act.reward > 0), default=-1)
    return ["noise" if failed(act) or i > last_gain else "policy" for i, act in enumerate(acts)]


def outcome(sources: list[str], succeeded: bool) -> str:
    if not succeeded:
        return "lost"
    return "recovered" if "noise" in sources else "won"


# ---------------------------------------------------------------------------------------------
# Replay: the trace's actions through the env's own recorder
# ---------------------------------------------------------------------------------------------
class ReplayMismatch(ValueError):
    """The replayed episode is not the traced one; the message says where."""


def traced_action(env: Env, act: ActEvent) -> Action:
    """The structured action behind a traced one: the env's parse of its text whose key is the traced key."""
    if act.action_key == "finish":
        return Action(kind="finish")
    candidates = []
    try:
        candidates.append(env.parse_action(act.action))
    except ActionParseError:
        pass
    candidates += [Action.command(act.action), Action(kind="answer", text=act.action)] if act.action.strip() else []
    for action in candidates:
        if action.key() == act.action_key:
            return action
    raise ReplayMismatch(f"step {act.step}: {act.action!r} does not parse to the traced action {act.action_key!r}")


def replay(env: Env, trace: EpisodeTrace, sources: list[str], meta: dict[str, Any]) -> Trajectory:
    """The episode's trajectory, recorded as collection records steps; raises ReplayMismatch on divergence."""
    start = trace.of_type("start")[0]
    acts: list[ActEvent] = trace.of_type("act")
    spec = EpisodeSpec(Task.from_dict(trace.task), trace.arm or "policy", f"trace-{_run_key(trace)}")
    rec = Recorder(env, spec, meta)
    if not exact(rec.obs.text, start.observation):
        raise ReplayMismatch("the reset observation differs from the traced first observation")
    for act, source in zip(acts, sources):
        action = traced_action(env, act)
        if act.fault in NOT_EXECUTED_FAULTS:
            rec.note(action, act.observation, source)
        else:
            seen = rec.act(action, source).observation.text
            if act.fault is None and not exact(seen, act.observation):
                raise ReplayMismatch(f"step {act.step} ({act.action!r}): the env returned {seen[:80]!r} this time")
        rec.steps[-1].expectation = act.expectation
        rec.steps[-1].notes = list(act.notes)  # the notes the planner showed, byte for byte
    end = trace.end
    traj = rec.finish()
    traj.success, traj.final_score = bool(end.success), float(end.score)
    traj.status = "truncated" if end.status in _TRUNCATED else "ok"
    return traj


def _run_key(trace: EpisodeTrace) -> str:
    """The run id (unique per run of an episode); a trace without one ("") is keyed by a hash of its episode id."""
    return trace.run_id or hashlib.sha256(trace.episode_id.encode()).hexdigest()[:12]


# ---------------------------------------------------------------------------------------------
# The harvest
# ---------------------------------------------------------------------------------------------
def trace_file(run: str) -> Path:
    path = Path(run)
    if path.is_dir():
        path = path / TRACES
    if not path.exists():
        raise MissingInputError(f"{run}: no traces; give an eval run folder (simplan eval --out) or a traces.jsonl")
    return path


def env_kwargs_of(run: Path) -> dict[str, dict[str, Any]]:
    """Env name -> the constructor arguments the evaluation used (its eval_config.json; {} without one)."""
    config = run.parent / EVAL_CONFIG
    if not config.exists():
        return {}
    entries = json.loads(config.read_text()).get("suite", {}).get("entries", [])
    out: dict[str, dict[str, Any]] = {}
    for entry in entries:
        out.setdefault(entry["env"], dict(entry.get("env_kwargs") or {}))
    return out


class EnvPool:
    """One env per (name, constructor arguments), made on first use and closed at the end."""

    def __init__(self) -> None:
        self.envs: dict[str, Env] = {}

    def get(self, name: str, kwargs: dict[str, Any]) -> Env:
        key = self._key(name, kwargs)
        if key not in self.envs:
            self.envs[key] = make_env(name, **kwargs)
        return self.envs[key]

    def discard(self, name: str, kwargs: dict[str, Any]) -> None:
        """Close an env that failed; the next episode gets a new one (adapters restart their backend)."""
        env = self.envs.pop(self._key(name, kwargs), None)
        if env is not None:
            try:
                env.close()
            except Exception:  # noqa: BLE001 - closing a crashed env is best effort
                pass

    @staticmethod
    def _key(name: str, kwargs: dict[str, Any]) -> str:
        return f"{name}|{json.dumps(kwargs, sort_keys=True, default=repr)}"

    def close(self) -> None:
        for env in self.envs.values():
            env.close()
        self.envs.clear()


def episodes(cfg: TracesConfig, report: TracesReport) -> Iterator[tuple[Path, EpisodeTrace]]:
    """The finished episodes of the selected arms, run file by run file; the rest are counted as skipped."""
    for run in cfg.runs:
        path = trace_file(run)
        if not has_lines(path):
            raise EmptyInputError(f"{path}: empty (no line to read); give an eval run folder (simplan eval --out)")
        problems = read_trace_records(path)[1]
        report.bad_lines += sum(not p.torn for p in problems)  # a torn last line is what a stopped eval leaves
        report.problems += problems
        for trace in read_traces(path):
            if cfg.arms is not None and trace.arm not in cfg.arms:
                continue
            if trace.end is None:
                report.skipped["unfinished"] += 1
            elif trace.end.status == "errored":
                report.skipped["errored"] += 1
            elif not trace.of_type("act"):
                report.skipped["no_steps"] += 1
            else:
                report.episodes += 1
                yield path, trace


def harvest(cfg: TracesConfig) -> TracesReport:
    """Convert every finished episode of `cfg.runs` and write them to `cfg.out`; returns the counts."""
    report = TracesReport(out=cfg.out)
    records: list[dict[str, Any]] = []
    pool = EnvPool()
    env_kwargs: dict[Path, dict[str, dict[str, Any]]] = {}
    try:
        for path, trace in episodes(cfg, report):
            end = trace.end
            succeeded = bool(end.success) or (cfg.min_score is not None and end.score >= cfg.min_score)
            acts = trace.of_type("act")
            sources = step_sources(acts, succeeded)
            loss = classify_loss(trace)
            meta = {
                "kind": "traces",
                "episode_id": trace.episode_id,
                "run_id": trace.run_id,
                "run": str(path.parent),
                "end_status": end.status,
                "outcome": outcome(sources, succeeded),
                "loss": loss.label if loss else None,
                "grade": next((e.grade for e in trace.of_type("grade")), None),  # the request's, where graded
            }
            if path not in env_kwargs:
                env_kwargs[path] = env_kwargs_of(path)
            kwargs = env_kwargs[path].get(trace.env, {})
            try:
                traj = replay(pool.get(trace.env, kwargs), trace, sources, meta)
            except ReplayMismatch as e:
                _skip(report, "replay_mismatch", f"{path}: {trace.episode_id}: not replayable: {e}")
                continue
            except Exception as e:  # noqa: BLE001 - an env that crashed on one episode (a dead JVM) spoils only it
                _skip(report, "replay_error", f"{path}: {trace.episode_id}: the env failed: {type(e).__name__}: {e}")
                pool.discard(trace.env, kwargs)
                continue
            records.append(traj.to_dict())
            _count(report, traj, meta["outcome"])
    finally:
        pool.close()
    write_jsonl(cfg.out, records)
    return report


def _skip(report: TracesReport, reason: str, problem: str) -> None:
    report.skipped[reason] += 1
    if report.skipped[reason] <= MAX_REPORTED:
        report.problems.append(problem)


def _count(report: TracesReport, traj: Trajectory, outcome_: str) -> None:
    report.written += 1
    report.outcomes[outcome_] += 1
    report.folds[traj.task.fold] += 1
    report.transitions += len(traj.steps)
    report.sources.update(s.source for s in traj.steps)
    report.decider_targets += sum(s.source in TARGET_SOURCES and not s.error for s in traj.steps)
