"""An oracle simulator: the real environment answers imagination (`PlannerConfig.simulator = "env"`).

    oracle = EnvOracle(same_env_factory(env))          # copies of `env`, built with the same settings
    obs = oracle.predict(task, real_actions, [a1, a2])  # exactly what the real env returns for a2 after a1
    step = oracle.predict_step(task, real_actions, [a1, a2])  # ... with its verdict: done, won, score, reward
    oracle.close()

From the command line: `simplan eval --arms reactive,simplan,simplan-oracle,plan ...` (the arm preset
`simplan-oracle` is simplan with this simulator), or `--planner '{simulator: env}'` for every arm.

How a prediction is made: a copy of the env is reset to the task and steps the episode's real actions,
then the imagined ones; the last step's result is the prediction: its observation, and the env's verdict
(done, won, score, reward), which the judge weighs (inference/planning/judge.py Outcome). This needs an env whose
reset is deterministic per task and whose steps are deterministic (TWX, ScienceWorld, BFCL and the toy
env are: tests/test_oracle.py checks each against the real steps). Replays are what cost, so:

- predictions are cached by (task, action sequence): the same question is answered once, in any episode;
- each copy remembers the actions it has stepped since its reset, and a question that extends them
  steps only the new actions (a rollout's next depth, or the next decision after a real step that
  followed the copy's own path);
- `copies` copies (one per candidate in the planner) let K rollouts each continue on their own copy
  instead of resetting one copy K times per depth;
- each call has a wall-clock limit, checked between steps (each step is also under the env's own step
  limit): past it `OracleTimeout` is raised, and the copy keeps what it replayed for the next call.

Copies are started lazily and closed by `close()` (or when the oracle is garbage-collected).
"""

from __future__ import annotations

import inspect
import json
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from simplan.envs.base import Action, Env, Observation, StepResult, Task
from simplan.envs.limits import LimitedEnv, make_limited

# Fault kinds whose action did not run (evaluation/faults.py): a replay must not step them.
NOT_EXECUTED_FAULTS = ("transient", "tool_error")
DEFAULT_TIME_LIMIT = 60.0  # seconds per prediction: a ScienceWorld reset + 50-step replay takes ~10 s


class OracleError(RuntimeError):
    """The env copy could not answer (it crashed or raised); the prediction is missing, not wrong."""


class OracleTimeout(OracleError):
    """A replay ran past the oracle's per-call time limit."""


@dataclass
class OracleStats:
    """What the oracle did (over its life): questions, cache hits, resets and env steps taken, seconds."""

    calls: int = 0
    hits: int = 0
    resets: int = 0
    steps: int = 0
    timeouts: int = 0
    errors: int = 0
    seconds: float = 0.0


@dataclass
class _Copy:
    env: Env
    task_key: str = ""  # "" = not reset (or in an unknown state after an error)
    stepped: list[str] = field(default_factory=list)  # keys of the actions stepped since the reset
    used: int = 0  # last use, for picking the least recently used copy to reset


def _task_key(task: Task) -> str:
    return json.dumps(task.to_dict(), sort_keys=True, ensure_ascii=False, default=repr)


def _close_all(copies: list[_Copy]) -> None:
    for c in copies:
        try:
            c.env.close()
        except Exception:  # noqa: BLE001 - closing is best effort (a dead JVM, a killed worker)
            pass
    copies.clear()


class EnvOracle:
    """Predicts observations by replaying the real environment on copies made by `make_env_fn`."""

    def __init__(
        self,
        make_env_fn: Callable[[], Env],
        copies: int = 1,
        time_limit: float = DEFAULT_TIME_LIMIT,
        max_cached: int = 20_000,
    ) -> None:
        if copies < 1:
            raise ValueError(f"EnvOracle.copies: must be >= 1, got {copies}")
        if not time_limit > 0:
            raise ValueError(f"EnvOracle.time_limit: must be > 0 seconds, got {time_limit!r}")
        self.make_env_fn = make_env_fn
        self.copies = copies
        self.time_limit = time_limit
        self.max_cached = max_cached
        self.stats = OracleStats()
        self._copies: list[_Copy] = []
        self._cache: OrderedDict[tuple[str, tuple[str, ...]], StepResult] = OrderedDict()
        self._clock = 0
        # Copies hold JVMs or worker processes: close them even when nobody calls close().
        self._finalizer = weakref.finalize(self, _close_all, self._copies)

    def predict(self, task: Task, real_actions: Sequence[Action], imagined_actions: Sequence[Action]) -> Observation:
        """The observation the env returns for the last imagined action, after the real then imagined ones.

        Raises OracleTimeout past the time limit and OracleError when the copy fails."""
        return self.predict_step(task, real_actions, imagined_actions).observation

    def predict_step(
        self, task: Task, real_actions: Sequence[Action], imagined_actions: Sequence[Action]
    ) -> StepResult:
        """The env's whole result for the last imagined action (observation, reward, score, done, won)."""
        if not imagined_actions:
            raise ValueError("EnvOracle.predict: imagined_actions is empty; give at least the action to predict")
        actions = [*real_actions, *imagined_actions]
        keys = [a.key() for a in actions]
        tkey = _task_key(task)
        ckey = (tkey, tuple(keys))
        self.stats.calls += 1
        if ckey in self._cache:
            self.stats.hits += 1
            self._cache.move_to_end(ckey)
            return self._cache[ckey]
        t0 = time.perf_counter()
        try:
            result = self._replay(task, tkey, actions, keys, deadline=t0 + self.time_limit)
        finally:
            self.stats.seconds += time.perf_counter() - t0
        self._cache[ckey] = result
        if len(self._cache) > self.max_cached:
            self._cache.popitem(last=False)
        return result

    def close(self) -> None:
        self._finalizer()

    # -- replay ------------------------------------------------------------------------------------
    def _replay(self, task: Task, tkey: str, actions: list[Action], keys: list[str], deadline: float) -> StepResult:
        try:
            copy = self._pick(tkey, keys)
        except Exception as e:  # the factory failed (no JVM, a missing package): no prediction, the episode goes on
            self.stats.errors += 1
            raise OracleError(f"oracle: could not make an env copy: {type(e).__name__}: {e}") from e
        self._clock += 1
        copy.used = self._clock
        try:
            if not copy.task_key:
                copy.env.reset(task)
                copy.task_key = tkey
                self.stats.resets += 1
            result: StepResult | None = None
            for i in range(len(copy.stepped), len(actions)):
                if time.perf_counter() > deadline:
                    self.stats.timeouts += 1
                    raise OracleTimeout(
                        f"oracle: replaying {len(actions)} actions of {task.task_id} took over {self.time_limit:g} s "
                        f"({i} stepped); the rollout is dropped and the next call goes on from there"
                    )
                result = copy.env.step(actions[i])
                copy.stepped.append(keys[i])
                self.stats.steps += 1
        except OracleTimeout:
            raise
        except Exception as e:  # a crashed JVM, a stuck step, a killed worker: this copy restarts at next use
            copy.task_key, copy.stepped = "", []
            self.stats.errors += 1
            raise OracleError(f"oracle: the env copy failed on {task.task_id}: {type(e).__name__}: {e}") from e
        if result is None:  # unreachable: _pick never returns a copy that has already stepped all of `keys`
            raise OracleError(f"oracle: nothing was stepped for {task.task_id}")
        return result

    def _pick(self, tkey: str, keys: list[str]) -> _Copy:
        """The copy with the longest stepped prefix of `keys` (it continues from there); else a new copy
        while fewer than `copies` exist; else the least recently used copy, reset."""
        best: _Copy | None = None
        for c in self._copies:
            n = len(c.stepped)
            if c.task_key == tkey and n < len(keys) and c.stepped == keys[:n]:
                if best is None or n > len(best.stepped):
                    best = c
        if best is not None:
            return best
        if len(self._copies) < self.copies:
            self._copies.append(_Copy(self.make_env_fn()))
            return self._copies[-1]
        lru = min(self._copies, key=lambda c: c.used)
        lru.task_key, lru.stepped = "", []
        return lru


def executed_actions(actions: Sequence[Action], faults: Sequence[str | None]) -> list[Action]:
    """The real actions that ran: those whose step had no injected fault that skipped it (evaluation/faults.py)."""
    if len(actions) != len(faults):
        raise ValueError(f"executed_actions: {len(actions)} actions but {len(faults)} fault flags")
    return [a for a, f in zip(actions, faults) if f not in NOT_EXECUTED_FAULTS]


def same_env_factory(env: Env) -> Callable[[], Env]:
    """A factory of fresh adapters like `env`'s, under the same step limits, with no fault injection.

    The adapter's settings are read back from its attributes named like its constructor's parameters
    (every simplan adapter keeps them so); `gold_path` is turned off, because the oracle never asks for
    the expert's path and TWX and ScienceWorld reset faster without generating it."""
    limits = None
    inner: object = env
    while hasattr(inner, "env") and not isinstance(inner, LimitedEnv):  # wrappers (FaultyEnv) keep it in .env
        inner = inner.env  # type: ignore[attr-defined]
    if isinstance(inner, LimitedEnv):
        limits = inner.limits
        inner = inner.unwrapped
    cls = type(inner)
    kwargs = {}
    for name, p in inspect.signature(cls.__init__).parameters.items():
        if name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) and hasattr(inner, name):
            kwargs[name] = getattr(inner, name)
    if "gold_path" in kwargs:
        kwargs["gold_path"] = False
    if limits is None:  # a bare adapter (tests, library use): so is its copy
        return lambda: cls(**kwargs)
    kwargs.setdefault("step_timeout", limits.step_timeout)
    kwargs["max_observation_chars"] = limits.max_observation_chars
    return lambda: make_limited(cls, kwargs)
