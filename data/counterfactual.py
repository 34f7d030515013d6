"""Counterfactual transitions: from every state of recorded paths, what other actions really lead to.

    simplan collect --config recipes/collect/twx-train.yaml
    simplan counterfactuals --inputs runs/data/twx-train.jsonl --per_state 8 --out runs/data/twx-train-cf.jsonl
    simplan counterfactuals --inputs runs/data/twx-train.jsonl --env_kwargs '{gold_path: false}' \\
        --out runs/data/twx-train-cf.jsonl      # the same alternatives, faster (see Cost)
    simplan counterfactuals --inputs runs/data/twx-traces.jsonl,runs/data/shop.jsonl --workers 2 \\
        --out runs/data/more-cf.jsonl

    from simplan.data.counterfactual import CounterfactualConfig, collect_counterfactuals
    cfg = CounterfactualConfig(inputs=["runs/data/toy.jsonl"], out="runs/data/toy-cf.jsonl")
    report = collect_counterfactuals(cfg)
    print(report.summary())

The collected paths show the simulator what the expert's actions (and a few mistakes) lead to; from the
same states, this plays other actions for real and keeps what the env returned, so the simulator can learn
what ends a game unwon. For each trajectory of the inputs (`simplan collect` outputs, `simplan traces`
harvests; status ok or truncated) and each of its steps, the env is brought to the step's state (the state
before the step) by a reset and the recorded actions, and up to `per_state` alternatives are played there,
each from a freshly replayed state:

- envs that list valid actions (TWX, ScienceWorld, the toy): the listed actions other than the step's own,
  a uniform sample seeded by (`seed`, trajectory id, step);
- tool envs (BFCL, the example shop): calls of each of the task's tools with argument values borrowed from
  the trajectory's own calls, invalid calls (an unknown tool, a call missing its arguments) and `finish`
  where no tool is named so (data/mistakes.py makes them), the same seeded sample of those.

Each alternative is recorded on its step (`Step.alternatives`, schema version 2, data/trajectory.py) with
the env's observation, reward, score, done, won, error and its outcome class (data/outcomes.py: error,
no_change, progress, won, lost). Replay is checked: every replayed observation must equal the recorded one
(`core.text.exact`), else the trajectory is skipped and counted (`diverged`; e.g. a harvested trace with an
injected fault the env never ran), never recorded wrong. An env that raises skips its trajectory
(`env_failed`) and is made anew; a re-run tries it again.

Cost: replaying the prefix for every alternative is O(T^2 * K) env steps per trajectory of T steps; a TWX
step takes well under a millisecond, so that is fine. Each worker keeps one env per env name (and
constructor arguments: the record's `meta.env_kwargs`, then `env_kwargs`) and reuses it; `workers > 1` runs
trajectories in spawned processes (data/collect_workers.py `pooled`). The summary gives alternatives per
second. Resets and the step watchdog dominate: for TWX, `--env_kwargs '{gold_path: false}'` makes resets skip
the expert path (the same alternatives, 1.2-3x faster), and `step_timeout: 0` in it drops the thread each
step runs in (another ~2x; a step that hangs then hangs the run).

Output: the trajectories with alternatives, one per line, appended durably as each is done, so a re-run
skips ids already in `out` and a torn last line is repaired as `simplan collect` repairs it. Input lines that
do not validate are reported as FILE:LINE and kept aside in `{out}.rejects.jsonl`; the rest goes on. Counts
go to `{out}.stats.json` and `{out}.stats.md`: per task family (game) and outcome class over the whole
output file, and what this run read, skipped (and why), wrote, and how fast.
"""

from __future__ import annotations

import json
import random
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from simplan.core.config import comma_list
from simplan.core.errors import MissingInputError, UsageError
from simplan.core.io import append_jsonl, atomic_open, read_jsonl_tolerant, write_json, write_text
from simplan.core.text import exact
from simplan.data.collect import load_done
from simplan.data.collect_workers import EnvHolder, pooled
from simplan.data.mistakes import argument_pool, invalid_tool_call, random_tool_call
from simplan.data.outcomes import OUTCOMES, classify_outcome
from simplan.data.trajectory import Alternative, Step, Trajectory
from simplan.data.validate import read_trajectory_lines
from simplan.envs import registry
from simplan.envs.actions import render_action
from simplan.envs.base import Action, Env, Observation, action_key_of_text
from simplan.envs.failures import FailureRules
from simplan.envs.registry import UnknownEnvError

SKIP_REASONS = ("bad_line", "duplicate_id", "errored", "diverged", "env_failed")
TOOL_DRAWS = 2  # calls drawn per tool of a tool env (argument values vary between draws)
INVALID_DRAWS = 2  # invalid calls among a tool env's candidates


@dataclass
class CounterfactualConfig:
    """Which trajectories to branch, how many alternatives per state, where to write them."""

    inputs: list[str] = field(
        default_factory=list,
        metadata={
            "help": "trajectory JSONL files, comma-separated (simplan collect outputs, simplan traces harvests)"
        },
    )
    out: str = field(
        default="runs/data/counterfactuals.jsonl",
        metadata={"help": "append-only JSONL output: the trajectories with alternatives (a re-run resumes)"},
    )
    per_state: int = field(default=8, metadata={"help": "alternatives played from each state at most"})
    families: list[str] | None = field(default=None, metadata={"help": "only trajectories of these task families"})
    limit: int | None = field(
        default=None, metadata={"help": "branch the first N selected trajectories (in input order), null for all"}
    )
    seed: int = field(default=0, metadata={"help": "the sample of alternatives is seeded by (seed, id, step)"})
    env_kwargs: dict[str, Any] = field(
        default_factory=dict,
        metadata={
            "help": "env constructor arguments over those a trajectory was collected with (its meta.env_kwargs), "
            "e.g. {gold_path: false} for TWX: resets skip the expert path, which alternatives do not need"
        },
    )
    workers: int = field(default=1, metadata={"help": "worker processes, each with its own envs (JVM)"})
    progress: bool = field(default=True, metadata={"help": "show a progress bar"})

    def __post_init__(self) -> None:
        self.inputs = comma_list(self.inputs)
        if self.families is not None:
            self.families = comma_list(self.families)
        if not self.inputs:
            raise ValueError("inputs: give one or more trajectory JSONL files (e.g. simplan collect --out)")
        if not self.out:
            raise ValueError("out: give the output JSONL path")
        if any(Path(p).resolve() == Path(self.out).resolve() for p in self.inputs):
            raise ValueError(f"out: {self.out} is also an input; write the trajectories with alternatives elsewhere")
        if not isinstance(self.env_kwargs, dict):
            raise ValueError(f"env_kwargs: expected a mapping, got {self.env_kwargs!r}")
        for name in ("per_state", "workers"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: {getattr(self, name)} must be at least 1")
        if self.limit is not None and self.limit < 1:
            raise ValueError(f"limit: {self.limit} must be at least 1 (or null for all)")


# ---------------------------------------------------------------------------------------------
# Playing alternatives from the states of one trajectory
# ---------------------------------------------------------------------------------------------
class Diverged(RuntimeError):
    """The replayed episode is not the recorded one; the message says where."""


@dataclass
class Branched:
    """One trajectory's result: its record with alternatives, or why it was skipped."""

    id: str
    record: dict[str, Any] | None  # None when skipped
    skip: str | None = None  # "diverged" or "env_failed"
    problem: str | None = None
    env_steps: int = 0


def replay_to(env: Env, traj: Trajectory, t: int) -> tuple[Observation, float, int]:
    """Reset the trajectory's task and play its first `t` recorded actions, checking every observation against
    the record; returns (the observation at step t's state, the score there, env steps). Raises Diverged."""
    obs, score = env.reset(traj.task), 0.0
    if not exact(obs.text, traj.initial_observation):
        raise Diverged(f"the reset observation is {obs.text[:80]!r}, the record's {traj.initial_observation[:80]!r}")
    for step in traj.steps[:t]:
        result = env.step(step.action)
        obs, score = result.observation, result.score
        if not exact(obs.text, step.next_observation):
            raise Diverged(
                f"step {step.index} ({render_action(step.action)}): the env returned {obs.text[:80]!r}, "
                f"the record {step.next_observation[:80]!r}"
            )
    return obs, float(score), t


def candidates(env: Env, obs: Observation, step: Step, pool: dict[str, list[Any]], rng: random.Random) -> list[Action]:
    """Every alternative to `step.action` at `obs`, in a stable order, each once (module docstring)."""
    own = step.action.key()
    if obs.valid_actions is not None:
        by_key = {action_key_of_text(env, text): Action.command(text) for text in obs.valid_actions}
    else:
        tools = obs.tools or []
        calls = [random_tool_call([tool], pool, rng) for tool in tools for _ in range(TOOL_DRAWS)]
        calls += [invalid_tool_call(tools, rng) for _ in range(INVALID_DRAWS if tools else 0)]
        if tools and "finish" not in {call.name for call in calls if call is not None}:
            calls.append(Action(kind="finish"))  # ending the turn or the episode is an alternative too
        by_key = {call.key(): call for call in calls if call is not None}
    return [action for key, action in by_key.items() if key != own]


class Brancher:
    """Plays the alternatives of recorded trajectories; one env per (env name, constructor arguments), reused."""

    def __init__(self, cfg: CounterfactualConfig) -> None:
        self.cfg = cfg
        self._holders: dict[str, EnvHolder] = {}
        self._rules: dict[str, FailureRules] = {}

    def _holder(self, traj: Trajectory) -> EnvHolder:
        kwargs = {**(traj.meta.get("env_kwargs") or {}), **self.cfg.env_kwargs}  # as collected, then ours
        key = f"{traj.env}|{json.dumps(kwargs, sort_keys=True, default=repr)}"
        if key not in self._holders:
            self._holders[key] = EnvHolder(traj.env, kwargs)
        return self._holders[key]

    def branch(self, traj: Trajectory) -> Branched:
        holder = self._holder(traj)
        result = Branched(traj.id, None)
        try:
            env = holder.get()
            if traj.env not in self._rules:
                self._rules[traj.env] = FailureRules.for_env(env)
            rules = self._rules[traj.env]
            steps, result.env_steps = self._alternatives(env, traj, rules)
        except Diverged as e:
            result.skip, result.problem = "diverged", f"{traj.id}: not replayable: {e}"
            return result
        except UsageError:  # the env cannot be made as asked (--env_kwargs it does not take): no trajectory can be
            holder.discard()
            raise
        except Exception as e:  # noqa: BLE001 - any env failure skips the trajectory; a re-run tries it again
            holder.discard()
            result.skip, result.problem = "env_failed", f"{traj.id}: the env failed: {type(e).__name__}: {e}"
            return result
        meta = {**traj.meta, "counterfactuals": {"per_state": self.cfg.per_state, "seed": self.cfg.seed}}
        result.record = replace(traj, steps=steps, meta=meta).to_dict()
        return result

    def _alternatives(self, env: Env, traj: Trajectory, rules: FailureRules) -> tuple[list[Step], int]:
        """The trajectory's steps with their alternatives, and the env steps it took."""
        pool = argument_pool([s.action for s in traj.steps])
        steps, env_steps = [], 0
        for t, step in enumerate(traj.steps):
            obs, score, n = replay_to(env, traj, t)
            env_steps += n
            rng = random.Random(f"{self.cfg.seed}:{traj.id}:{t}")
            options = candidates(env, obs, step, pool, rng)
            picked = sorted(rng.sample(range(len(options)), min(self.cfg.per_state, len(options))))
            alternatives = []
            for i, k in enumerate(picked):
                if i:  # the previous alternative moved the env: back to the step's state
                    obs, score, n = replay_to(env, traj, t)
                    env_steps += n
                result = env.step(options[k])
                env_steps += 1
                seen = result.observation
                alternatives.append(
                    Alternative(
                        action=options[k],
                        next_observation=seen.text,
                        reward=float(result.reward),
                        score=float(result.score),
                        done=bool(result.done),
                        won=bool(result.won),
                        error=bool(seen.error),
                        outcome=classify_outcome(
                            seen.error, seen.text, score, result.score, result.done, result.won, rules
                        ),
                    )
                )
            steps.append(replace(step, alternatives=alternatives))
        return steps, env_steps

    def close(self) -> None:
        for holder in self._holders.values():
            holder.discard()
        self._holders.clear()


_WORKER: Brancher | None = None


def _worker_init(cfg: CounterfactualConfig, registered: dict[str, Any]) -> None:
    global _WORKER
    for name, factory in registered.items():  # envs registered at run time: a spawned worker registers them again
        registry.register(name, factory)
    _WORKER = Brancher(cfg)


def _worker_branch(traj: Trajectory) -> Branched:
    assert _WORKER is not None, "worker not initialised"
    return _WORKER.branch(traj)


def branched(cfg: CounterfactualConfig, todo: list[Trajectory]) -> Iterator[Branched]:
    """Each trajectory's `Branched`, from `cfg.workers` processes in order of completion (one: in input order)."""
    if cfg.workers == 1:
        brancher = Brancher(cfg)
        try:
            yield from map(brancher.branch, todo)
        finally:
            brancher.close()
        return
    registered = {t.env: registry._REGISTERED[t.env] for t in todo if t.env in registry._REGISTERED}
    yield from pooled(_worker_branch, todo, cfg.workers, _worker_init, (cfg, registered))


# ---------------------------------------------------------------------------------------------
# Reading the inputs, counting, and the main loop
# ---------------------------------------------------------------------------------------------
@dataclass
class CounterfactualReport:
    out: str
    lines: int = 0  # non-empty input lines
    not_selected: int = 0  # left out by --families or --limit
    selected: int = 0
    already_done: int = 0
    written: int = 0
    unfinished: int = 0
    skipped: Counter = field(default_factory=Counter)  # SKIP_REASONS -> trajectories
    states: int = 0  # states branched this run (with at least one alternative)
    alternatives: int = 0  # alternatives recorded this run
    env_steps: int = 0  # every env.step this run, replays included
    elapsed_s: float = 0.0
    problems: list[str] = field(default_factory=list)
    file: dict[str, Any] = field(default_factory=dict)  # `count_file(out)`: the whole output file

    @property
    def alternatives_per_s(self) -> float:
        return self.alternatives / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        run = {k: getattr(self, k) for k in ("lines", "not_selected", "selected", "already_done", "written")}
        run |= {"unfinished": self.unfinished, "skipped": {r: self.skipped[r] for r in SKIP_REASONS}}
        run |= {"states_branched": self.states, "alternatives": self.alternatives, "env_steps": self.env_steps}
        run |= {"seconds": round(self.elapsed_s, 3), "alternatives_per_s": round(self.alternatives_per_s, 1)}
        run |= {"env_steps_per_s": round(self.env_steps / self.elapsed_s, 1) if self.elapsed_s > 0 else 0.0}
        return {"out": self.out, "file": self.file, "run": run, "problems": self.problems}

    def summary(self) -> str:
        skipped = ", ".join(f"{self.skipped[r]} {r}" for r in SKIP_REASONS if self.skipped[r]) or "none"
        lines = [
            f"counterfactuals -> {self.out}",
            f"  trajectories: {self.lines} lines read, {self.selected} selected, {self.already_done} already there, "
            f"{self.written} written, {self.unfinished} unfinished; skipped: {skipped}",
            f"  this run: {self.alternatives} alternatives from {self.states} states in {self.elapsed_s:.1f} s "
            f"({self.alternatives_per_s:.1f} alternatives/s; {self.env_steps} env steps incl. replays)",
            outcome_table(self.file).rstrip(),
        ]
        lines += [f"  ! {p}" for p in self.problems[:20]]
        if len(self.problems) > 20:
            lines.append(f"  ! ... and {len(self.problems) - 20} more in {self.out}.stats.json")
        return "\n".join(lines)


def count_file(path: Path) -> dict[str, Any]:
    """Counts over an output file: trajectories, states branched, alternatives, and family x outcome class."""
    records, _ = read_jsonl_tolerant(path)
    outcomes: dict[str, Counter] = {}
    states = alternatives = 0
    for record in records:
        family = (record.get("task") or {}).get("family") or "(none)"
        tally = outcomes.setdefault(family, Counter())
        for step in record.get("steps") or []:
            found = step.get("alternatives") or []
            states += bool(found)
            alternatives += len(found)
            tally.update(alt.get("outcome") for alt in found)
    table = {f: {o: tally[o] for o in OUTCOMES} for f, tally in sorted(outcomes.items())}
    return {"trajectories": len(records), "states_branched": states, "alternatives": alternatives, "outcomes": table}


def outcome_table(file: dict[str, Any]) -> str:
    """The family x outcome counts of `count_file` as a Markdown table with totals."""
    rows = file.get("outcomes") or {}
    lines = [f"| family | {' | '.join(OUTCOMES)} | all |", "|---" * (len(OUTCOMES) + 2) + "|"]
    totals = Counter()
    for family, counts in rows.items():
        totals.update(counts)
        lines.append(f"| {family} | {' | '.join(str(counts[o]) for o in OUTCOMES)} | {sum(counts.values())} |")
    lines.append(f"| all | {' | '.join(str(totals[o]) for o in OUTCOMES)} | {sum(totals.values())} |")
    return "\n".join(lines) + "\n"


def _select(cfg: CounterfactualConfig, report: CounterfactualReport, rejects: list[bytes]) -> list[Trajectory]:
    """The input trajectories to branch, in input order; the rest counted (and bad lines kept in `rejects`)."""
    missing = [p for p in cfg.inputs if not Path(p).is_file()]
    if missing:
        raise MissingInputError(
            f"inputs: no such file: {', '.join(missing)}; give trajectory JSONL files (simplan collect --out, "
            "simplan traces --out)"
        )
    picked: list[Trajectory] = []
    for line in read_trajectory_lines(cfg.inputs):
        report.lines += 1
        traj = line.trajectory
        if traj is None:
            report.skipped["bad_line"] += 1
            report.problems += [f"{line.where}: {p}" for p in line.problems]
            rejects.append(line.raw if line.raw.endswith(b"\n") else line.raw + b"\n")
        elif line.duplicate_of is not None:
            report.skipped["duplicate_id"] += 1
            report.problems.append(f"{line.where}: {line.duplicate_problem()}; branched once")
        elif traj.status == "errored":
            report.skipped["errored"] += 1
        elif (cfg.families and traj.task.family not in cfg.families) or len(picked) == cfg.limit:
            report.not_selected += 1
        else:
            picked.append(traj)
    report.selected = len(picked)
    return picked


def _check_envs(trajectories: list[Trajectory], cfg: CounterfactualConfig) -> None:
    """Every env the trajectories name resolves here, before anything runs (nothing is written otherwise)."""
    for name in dict.fromkeys(t.env for t in trajectories):
        try:
            registry.resolve(name)
        except (UnknownEnvError, ImportError) as e:
            first = next(t.id for t in trajectories if t.env == name)
            raise UnknownEnvError(
                f"env {name!r} of trajectory {first!r} (in {', '.join(cfg.inputs)}) cannot be made here: {e}. "
                "Install the env's package, or leave its trajectories out of --inputs"
            ) from None


def _by_family(trajectories: list[Trajectory]) -> list[Trajectory]:
    """Grouped by (env, family), in order of first appearance: TWX reloads its game (~0.2 s) when the game changes."""
    first: dict[tuple[str, str], int] = {}
    for n, t in enumerate(trajectories):
        first.setdefault((t.env, t.task.family), n)
    return sorted(trajectories, key=lambda t: first[(t.env, t.task.family)])


def write_stats(report: CounterfactualReport, cfg: CounterfactualConfig) -> None:
    """`{out}.stats.json` and `{out}.stats.md`, next to the output."""
    stats = {"inputs": cfg.inputs, "per_state": cfg.per_state, "seed": cfg.seed, "workers": cfg.workers}
    write_json(f"{cfg.out}.stats.json", stats | report.to_dict())
    run = report.to_dict()["run"]
    skipped = ", ".join(f"{n} {r}" for r, n in run["skipped"].items() if n) or "none"
    text = (
        f"# Counterfactual transitions: {cfg.out}\n\n"
        f"{report.file.get('alternatives', 0)} alternatives from {report.file.get('states_branched', 0)} states of "
        f"{report.file.get('trajectories', 0)} trajectories (up to {cfg.per_state} per state, seed {cfg.seed}).\n\n"
        f"{outcome_table(report.file)}\n"
        f"This run: {run['lines']} input lines, {run['selected']} selected, {run['already_done']} already there, "
        f"{run['written']} written, {run['unfinished']} unfinished; skipped: {skipped}. "
        f"{run['alternatives']} alternatives in {run['seconds']} s ({run['alternatives_per_s']} alternatives/s, "
        f"{run['env_steps']} env steps incl. replays, {run['env_steps_per_s']}/s).\n"
    )
    write_text(f"{cfg.out}.stats.md", text)


def collect_counterfactuals(cfg: CounterfactualConfig) -> CounterfactualReport:
    """Branch every selected trajectory not yet in `cfg.out`; returns counts (see the module docstring)."""
    from tqdm.auto import tqdm

    out = Path(cfg.out)
    report = CounterfactualReport(out=str(out))
    rejects: list[bytes] = []
    selected = _select(cfg, report, rejects)
    _check_envs(selected, cfg)
    if rejects:  # every run reads all inputs: this run's rejects are all of them
        with atomic_open(f"{out}.rejects.jsonl", "wb") as f:
            f.writelines(rejects)
        report.problems.append(f"{report.skipped['bad_line']} bad input line(s) kept aside in {out}.rejects.jsonl")
    done, problems = load_done(out, retry_errored=False)
    report.problems += problems
    todo = _by_family([t for t in selected if t.id not in done])
    report.already_done = len(selected) - len(todo)
    t0 = time.perf_counter()
    bar = tqdm(total=len(todo), unit="traj", desc="counterfactuals", disable=not cfg.progress)
    finished = 0
    try:
        for result in branched(cfg, todo) if todo else ():
            finished += 1
            report.env_steps += result.env_steps
            if result.record is None:
                report.skipped[result.skip] += 1
                report.problems.append(result.problem)
            else:
                append_jsonl(out, [result.record])
                report.written += 1
                found = [len(s["alternatives"]) for s in result.record["steps"] if "alternatives" in s]
                report.states += len(found)
                report.alternatives += sum(found)
            bar.update(1)
            elapsed = time.perf_counter() - t0
            bar.set_postfix(alt=report.alternatives, per_s=f"{report.alternatives / max(elapsed, 1e-9):.0f}")
    except BrokenProcessPool as e:
        report.problems.append(f"a worker process died ({e}); re-run the same command to resume")
    finally:
        bar.close()
        report.elapsed_s = time.perf_counter() - t0
        report.unfinished = len(todo) - finished
        report.file = count_file(out)
        write_stats(report, cfg)
    return report
