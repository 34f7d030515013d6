"""Running collection episodes: one episode per call, one env per worker process, recreated after a crash.

    from simplan.data.collect_workers import episode_outcomes, run_episode
    outcome = run_episode(env, spec, cfg)                  # the records of one episode (main first)
    for outcome in episode_outcomes(cfg, specs):           # cfg.workers processes, in order of completion
        ...

`run_episode` dispatches an `EpisodeSpec` (data/recorder.py) to its policy (data/policies.py); an env that
raises (a crashed JVM, `EnvCrashed`, any exception) yields an `errored` record with the message and a
traceback, and the worker's `EnvHolder` then recreates its env. With `workers > 1` the episodes run in
spawned processes (each creating its env once and reusing it), a bounded number in flight (`pooled`, which
counterfactual collection uses too). `collect` (data/collect.py) drives it.

The workers start without running the caller's main script again (spawn's default), so a user script that
collects at module level, with no `if __name__ == "__main__":` guard, works; only where the work refers to a
function defined in that script (an env factory registered there) must spawn run it, and then the script
needs the guard (a worker that dies says so).
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import os
import pickle
import random
import time
import traceback
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from multiprocessing import get_context
from typing import TYPE_CHECKING, Any, TypeVar

from simplan.data.policies import make_expert, run_branch, run_expert, run_losing_branch, run_noisy, run_random
from simplan.data.recorder import EpisodeSpec, Recorder, jsonable
from simplan.data.trajectory import Trajectory
from simplan.envs import registry
from simplan.envs.base import Env
from simplan.envs.failures import FailureRules
from simplan.envs.limits import main_module_hidden
from simplan.envs.registry import make_env

if TYPE_CHECKING:  # the config module runs the workers: a type-only import, no cycle at run time
    from simplan.data.collect import CollectConfig

T = TypeVar("T")
R = TypeVar("R")


@dataclass
class EpisodeOutcome:
    """What one worker call returns: the records to append (main first) and counters."""

    id: str
    records: list[dict[str, Any]]
    status: str
    transitions: int  # new real transitions recorded (branch prefixes not counted twice)
    env_steps: int  # every env.step call, including replays
    crashed: bool = False


def run_episode(env: Env, spec: EpisodeSpec, cfg: CollectConfig) -> EpisodeOutcome:
    """Collect one episode (plus its split-off branches); an env exception yields an errored record."""
    rng = random.Random(f"{cfg.seed}:{spec.id}")
    meta = {"seed": cfg.seed, "collector": "simplan.collect", "kind": "episode"}
    if spec.policy == "noisy_expert":
        meta.update(noise_rate=cfg.noise_rate, invalid_share=cfg.invalid_share)
    if cfg.env_kwargs:
        meta["env_kwargs"] = jsonable(cfg.env_kwargs)
    t0 = time.perf_counter()
    rec: Recorder | None = None
    try:
        rec = Recorder(env, spec, meta, notes=FailureRules.for_env(env))
        plain_expert = spec.policy == "expert" and not spec.attempt.startswith(("branch", "lose"))
        expert = make_expert(env, rec, cfg, needs_path=not plain_expert)
        rec.traj.meta["expert"] = expert.kind
        if spec.attempt.startswith("branch"):
            trajs = run_branch(rec, expert, cfg, rng)
        elif spec.attempt.startswith("lose"):
            trajs = run_losing_branch(rec, expert, cfg, rng)
        elif spec.policy == "expert":
            trajs = run_expert(rec, expert, cfg)
        elif spec.policy == "noisy_expert":
            trajs = run_noisy(rec, expert, cfg, rng)
        else:
            trajs = run_random(rec, expert, cfg, rng)
        trajs[0].meta["expert_plan_len"] = len(expert.path) if expert.path or expert.policy is None else len(rec.steps)
        crashed = False
    except Exception as e:  # noqa: BLE001 - any env failure is recorded, never dropped
        message = f"{type(e).__name__}: {e}"
        if rec is None:
            traj = Trajectory(
                id=spec.id, env=spec.task.env, task=spec.task, goal="", policy=spec.policy,
                initial_observation="", meta=dict(meta),
            )  # fmt: skip
        else:
            traj = rec.traj
            traj.success, traj.final_score = False, rec.score
        traj.status, traj.error = "errored", message
        traj.meta["traceback"] = traceback.format_exc(limit=8)[-4000:]
        trajs, crashed = [traj], True
    elapsed = time.perf_counter() - t0
    trajs[0].meta["elapsed_s"] = round(elapsed, 4)
    transitions = sum(len(t.steps) - int(t.meta.get("branch_step", 0)) for t in trajs if t.status != "errored")
    return EpisodeOutcome(
        id=spec.id,
        records=[t.to_dict() for t in trajs],
        status=trajs[0].status,
        transitions=transitions,
        env_steps=rec.env_steps if rec is not None else 0,
        crashed=crashed,
    )


# ---------------------------------------------------------------------------------------------
# Workers: one env per process, created once and reused; recreated after a crash.
# ---------------------------------------------------------------------------------------------
class EnvHolder:
    def __init__(self, name: str, kwargs: dict[str, Any]) -> None:
        self.name, self.kwargs = name, kwargs
        self.env: Env | None = None

    def get(self) -> Env:
        if self.env is None:
            self.env = make_env(self.name, **self.kwargs)
        return self.env

    def discard(self) -> None:
        env, self.env = self.env, None
        if env is not None:
            try:
                env.close()
            except Exception:  # noqa: BLE001 - a crashed env may fail to close; it is dropped anyway
                pass

    def run(self, spec: EpisodeSpec, cfg: CollectConfig) -> EpisodeOutcome:
        try:
            env = self.get()
        except Exception as e:  # noqa: BLE001 - recorded as an errored episode
            traj = Trajectory(
                id=spec.id, env=spec.task.env, task=spec.task, goal="", policy=spec.policy, initial_observation="",
                status="errored", error=f"could not create env {self.name!r}: {type(e).__name__}: {e}",
                meta={"seed": cfg.seed, "collector": "simplan.collect", "kind": "episode"},
            )  # fmt: skip
            return EpisodeOutcome(spec.id, [traj.to_dict()], "errored", 0, 0, crashed=True)
        outcome = run_episode(env, spec, cfg)
        if outcome.crashed:
            self.discard()
        return outcome


_WORKER: EnvHolder | None = None


def _worker_init(name: str, kwargs: dict[str, Any], factory: Any = None) -> None:
    global _WORKER
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if factory is not None:  # an env registered at run time: a spawned worker must register it again
        registry.register(name, factory)
    _WORKER = EnvHolder(name, kwargs)


def _worker_run(spec: EpisodeSpec, cfg: CollectConfig) -> EpisodeOutcome:
    assert _WORKER is not None, "worker not initialised"
    return _WORKER.run(spec, cfg)


def episode_outcomes(cfg: CollectConfig, todo: list[EpisodeSpec]) -> Iterator[EpisodeOutcome]:
    if cfg.workers == 1:
        holder = EnvHolder(cfg.env, cfg.env_kwargs)
        try:
            for spec in todo:
                yield holder.run(spec, cfg)
        finally:
            holder.discard()
        return
    factory = registry._REGISTERED.get(cfg.env)
    initargs = (cfg.env, cfg.env_kwargs, factory)
    yield from pooled(functools.partial(_worker_run, cfg=cfg), todo, cfg.workers, _worker_init, initargs)


def pooled(
    fn: Callable[[T], R], items: Iterable[T], workers: int, initializer: Callable[..., None], initargs: tuple = ()
) -> Iterator[R]:
    """`fn(item)` for every item in `workers` spawned processes, each set up once by `initializer(*initargs)`;
    results in order of completion. `fn` and the items must pickle (module-level functions, dataclasses)."""
    # spawn: a fresh interpreter per worker; forking a process that talks to a JVM is unsafe. Spawn also runs
    # the caller's main script again in each worker, unless it is hidden while a worker starts (on submit).
    uses_main = refers_to_main(fn, initializer, initargs)
    hidden = contextlib.nullcontext if uses_main else main_module_hidden
    with ProcessPoolExecutor(
        max_workers=workers, mp_context=get_context("spawn"), initializer=initializer, initargs=initargs
    ) as pool:

        def submit(item: T) -> Any:
            with hidden():
                return pool.submit(fn, item)

        try:
            # Keep a bounded number of items in flight so results stream back in order of completion.
            queue = iter(items)
            pending = {submit(item) for item in itertools.islice(queue, 4 * workers)}
            while pending:
                # A timeout, so the main thread runs often: a SIGINT the OS hands to the pool's own thread is
                # handled only when the main thread next runs Python code (an untimed wait sleeps until an episode
                # ends).
                finished, pending = wait(pending, timeout=0.2, return_when=FIRST_COMPLETED)
                for fut in finished:
                    yield fut.result()
                    for item in itertools.islice(queue, 1):
                        pending.add(submit(item))
        except BrokenProcessPool as e:
            if not uses_main:
                raise
            died = str(e).rstrip(".")
            raise BrokenProcessPool(
                f"{died}; the workers run your main script again, to find the functions defined in it: if it has no "
                '`if __name__ == "__main__":` guard around the code that starts the work, add one'
            ) from e


def refers_to_main(*objects: Any) -> bool:
    """Whether `objects` pickle with a reference to the main script (a function or class defined in it), which a
    spawned worker can only find by running that script again; True when they cannot be pickled here."""
    try:
        return b"__main__" in pickle.dumps(objects)
    except Exception:  # noqa: BLE001 - let the pool report it as it always has
        return True
