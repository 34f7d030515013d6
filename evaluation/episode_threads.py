"""Running eval episodes side by side: env slots, worker threads, Ctrl-C, one planning loop per episode.

    slots = [EnvSlot() for _ in range(concurrency)]
    run_in_slots(specs, play, record, slots, batcher, bar)   # play(spec, slot) in a thread, record(spec, result)

Each concurrent slot owns its env instances, made on first use and reused (one JVM per slot for
TextWorld-Express / ScienceWorld), wrapped by the suite entry's fault injection (evaluation/faults.py).
`run_in_slots` plays each item in a thread that holds a free slot and records its result under one lock;
`run_episode` is one episode of the planning loop (inference/planning/planner.py); `locked_token_counter`
gives the episode threads a tokenizer of their own; `ctrl_c_stops` lets a second Ctrl-C cut the running
episodes at their next model call. evaluation/runner.py `evaluate` is the caller.
"""

from __future__ import annotations

import contextlib
import copy
import queue
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from typing import Any, TypeVar

from simplan.envs.base import Env, Task
from simplan.envs.registry import make_env
from simplan.evaluation.faults import wrap_faults
from simplan.evaluation.suites import SuiteEntry
from simplan.inference.engines.base import Engine
from simplan.inference.engines.batching import BatchingEngine

Item = TypeVar("Item")
Result = TypeVar("Result")


class _Presses:
    """Ctrl-C presses while episodes run; `held()`: a first press that lands inside it is kept until it ends."""

    def __init__(self) -> None:
        self.count = 0
        self._holding = False
        self._pending = False

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        self._holding = True
        try:
            yield
        finally:
            self._holding = False
        if self._pending:
            self._pending = False
            raise KeyboardInterrupt

    def first(self) -> None:
        if self._holding:
            self._pending = True
            return
        raise KeyboardInterrupt


@contextlib.contextmanager
def ctrl_c_stops(batcher: BatchingEngine | None) -> Iterator[_Presses]:
    """Ctrl-C while episodes run: the first raises KeyboardInterrupt as usual (episodes not started are dropped,
    running ones finish and are written), or, inside the yielded `held()`, when it ends; a second, wherever it
    lands, cancels the batcher, so each running episode ends at its next model call, recorded as errored (the
    next run plays it again). Without a batcher, or outside the main thread (no signal handler can be set there),
    Ctrl-C behaves as it always does."""
    presses = _Presses()
    if batcher is None or threading.current_thread() is not threading.main_thread():
        yield presses
        return

    def on_sigint(signum: int, frame: Any) -> None:
        presses.count += 1
        if presses.count == 1:
            presses.first()
            return
        print("eval: cutting the running episodes at their next model call", file=sys.stderr, flush=True)
        batcher.cancel("evaluation stopped by Ctrl-C; the episode runs again on the next run")

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        yield presses
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


def run_in_slots(
    items: list[Item],
    play: Callable[[Item, EnvSlot], Result],
    record: Callable[[Item, Result], None],
    slots: list[EnvSlot],
    batcher: BatchingEngine | None,
    bar: Any = None,
    admit: Callable[[Item], bool] | None = None,
) -> None:
    """`play` each item in a thread that holds a free slot, then `record` its result under one lock, with one
    thread per slot; an item that `admit` refuses when its slot is free is skipped (neither played nor
    recorded). The first error raises; on it or on Ctrl-C (`ctrl_c_stops`), items not started are
    dropped and running ones finish and are recorded. At the end the progress `bar`, the batcher and the
    slots are closed."""
    free: queue.Queue[EnvSlot] = queue.Queue()
    for s in slots:
        free.put(s)
    write_lock = threading.Lock()

    def one(item: Item) -> None:
        slot = free.get()
        if admit is not None and not admit(item):
            free.put(slot)
            return
        try:
            result = play(item, slot)
        finally:
            free.put(slot)
        with write_lock:
            record(item, result)

    pool = ThreadPoolExecutor(max_workers=len(slots), thread_name_prefix="episode")
    futures: list[Future] = []
    with ctrl_c_stops(batcher) as presses:  # set before the first episode starts: no Ctrl-C meets the default
        try:
            # The first episode may already call the model (and a Ctrl-C land in the main thread) while the rest
            # are being submitted. A press raised inside pool.submit would lose the future of an episode that
            # runs (nothing would wait for it): a press is held to the end of each submit, then raised, and the
            # episodes not yet submitted are dropped.
            for item in items:
                with presses.held():
                    futures.append(pool.submit(one, item))
            failed = _first_failure(futures)
            if failed is not None:
                raise failed
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
            pool.shutdown(wait=False, cancel_futures=True)
            _drain(futures)
            pool.shutdown(wait=True)  # every thread is done: returns at once
            if bar is not None:
                bar.close()
            if batcher is not None:
                batcher.close()
            for s in slots:
                s.close()


# How often the main thread wakes while episodes run. A signal the OS delivers to an episode thread only sets a
# flag that the main thread reads when it runs: blocked in an untimed wait() or join() it never runs, so Ctrl-C
# was ignored until every queued episode had finished (2 of 8 trials, 19.5 s).
POLL_SECONDS = 0.1


def _first_failure(futures: list[Future]) -> BaseException | None:
    """Wait for every future, waking every POLL_SECONDS (so Ctrl-C is handled at once); the first exception."""
    pending = set(futures)
    while pending:
        done, pending = wait(pending, timeout=POLL_SECONDS, return_when=FIRST_EXCEPTION)
        failed = next((f.exception() for f in done if not f.cancelled() and f.exception() is not None), None)
        if failed is not None:
            return failed
    return None


def _drain(futures: list[Future]) -> None:
    """Wait for the running futures to finish, waking every POLL_SECONDS so a second Ctrl-C reaches its handler
    (`ctrl_c_stops`: it cuts them at their next model call); without that handler, Ctrl-C keeps waiting."""
    pending = {f for f in futures if not f.done()}
    while pending:
        try:
            _, pending = wait(pending, timeout=POLL_SECONDS)
        except KeyboardInterrupt:
            print(f"eval: waiting for {len(pending)} running episode(s) to finish", file=sys.stderr, flush=True)
