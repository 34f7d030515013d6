"""Engine lanes: the same engine in N processes side by side, each on its own cores, one eval's episodes spread
over them.

    engine = LanedEngine("hf", model, adapters, lanes=2, dtype="auto", threads=1, merge_adapters=True)
    batcher = engine.batcher(window=0.02)     # what evaluation/runner.py uses instead of one BatchingEngine
    with batcher.session():                   # in each episode thread: the episode joins the least-loaded lane
        ...                                   # its calls are batched with that lane's other episodes
    engine.close()                            # the lane processes end

Why: on a CPU, a small model's forward passes gain little from a second thread (SmolLM2-135M generation on 2
cores: 16.8 tokens/s with 2 threads against 14.3 with 1), while two one-thread processes side by side make 28.8;
two one-thread evals of 8 tasks each finished 1.64x sooner than one two-thread eval of the 16, with the same
outcomes (bench/RESULTS.md "Evaluation profile and thread settings"). `engine_from_config` (inference/engines/
__init__.py) builds lanes where `EngineConfig.lanes` resolves to more than one (`resolve_lanes`: `auto` is one
per core, at most MAX_AUTO_LANES, for an hf engine on a CPU serving concurrent episodes).

Each lane is a new Python process that builds the backend with `make_engine` and serves the engine protocol over a
socket: requests and results are the protocol's dataclasses, pickled. A lane holds its own copy of the model (and
of each merged adapter), its own prefix cache, and one `BatchingEngine` in the eval process (`LaneBatcher`), so
the queue of episodes, the time budget, Ctrl-C and the one traces file stay the eval's, as with one engine. An
episode stays on its lane (its prefix cache is there) unless its lane holds two episodes more than another (the
last episodes of an eval): then it moves. Ended sessions are freed in every lane with the next call. Lanes
ignore SIGINT: the eval decides what a Ctrl-C stops. An exception raised in a lane is raised again in the caller
with its own type and the lane's traceback as a note (NotImplementedError for a constraint the backend cannot
honour, so the planner's fallbacks work); a lane that dies (e.g. killed for memory) fails its calls with
`LaneDied`, naming its exit code, and new episodes go to the lanes still alive.
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import signal
import socket
import subprocess
import sys
import threading
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from simplan.inference.engines.base import (
    EmbedRequest,
    EmbedResult,
    EngineUsage,
    GenerationRequest,
    GenerationResult,
    ScoreRequest,
    ScoreResult,
    SessionEngine,
)
from simplan.inference.engines.batching import BatchingEngine, BatchSession, BatchStats
from simplan.inference.engines.common import account, timer

# `lanes: auto` builds at most this many: each lane holds the model again (measured: 2 lanes on 2 cores).
MAX_AUTO_LANES = 4
READY_SECONDS = 600.0  # a lane that has not loaded its model in this long is reported as stuck
CLOSE_SECONDS = 30.0


class LaneDied(RuntimeError):
    """A lane process ended while (or before) serving a call."""


class LaneError(RuntimeError):
    """An exception raised in a lane that could not be sent back as itself (its text and traceback)."""


# ---------------------------------------------------------------------------------------------
# The lane process
# ---------------------------------------------------------------------------------------------
def _portable(error: BaseException) -> BaseException:
    """`error` with the lane's traceback as a note if it survives pickling, else a LaneError with its type, message
    and traceback."""
    text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    try:
        error.add_note(f"raised in engine lane pid {os.getpid()}:\n{text}")
        pickle.loads(pickle.dumps(error))
        return error
    except Exception:  # noqa: BLE001 - any exception that cannot travel is described instead
        return LaneError(f"{type(error).__name__}: {error}\n{text}")


def _picklable(value: Any) -> Any:
    """`value` if it pickles, else None (the eval process then loads its own tokenizer)."""
    try:
        pickle.dumps(value)
        return value
    except Exception:  # noqa: BLE001 - any object that cannot travel
        return None


def serve(fd: int) -> None:
    """A lane process (`python -c "...serve(FD)"`): read what to build from the socket `fd`, build the engine, say
    what it serves, then answer calls until told to close or the socket ends (the eval process is gone)."""
    from multiprocessing.connection import Connection

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the eval's to handle; closing the pipe ends a lane
    conn = Connection(fd)
    try:
        kind, model, adapters, opts = conn.recv()
    except (EOFError, OSError):
        return
    from simplan.core.memory import rss_mb
    from simplan.inference.engines import is_merged, make_engine

    try:
        engine: Any = make_engine(kind, model, adapters, **opts)
    except BaseException as e:  # noqa: BLE001 - reported to the parent, which raises it
        conn.send(("failed", _portable(e)))
        return
    conn.send(
        (
            "ready",
            {
                "adapters": list(engine.adapters),
                "adapter_dirs": dict(getattr(engine, "adapter_dirs", {}) or {}),
                "tokenizer": _picklable(getattr(engine, "tokenizer", None)),
                "merged": is_merged(engine),
                "backend": type(engine).__name__,
            },
        )
    )
    try:
        while True:
            try:
                message = conn.recv()
            except (EOFError, OSError):  # the eval process is gone
                return
            if message[0] == "close":
                return
            if message[0] == "peak":  # this lane's peak resident memory, MB (core/memory.py)
                reply: tuple[str, Any] = ("ok", rss_mb("VmHWM"))
            else:
                _, method, requests, ended = message
                if isinstance(engine, SessionEngine):
                    for session in ended:
                        engine.end_session(session)
                try:
                    reply = ("ok", getattr(engine, method)(requests))
                except BaseException as e:  # noqa: BLE001 - raised again in the caller
                    reply = ("error", _portable(e))
            try:
                conn.send(reply)
            except OSError:  # the eval process died while this call ran: nobody to answer
                return
    finally:
        engine.close()


# ---------------------------------------------------------------------------------------------
# The eval process's side
# ---------------------------------------------------------------------------------------------
class Lane:
    """One lane process, as an engine: each call is sent down its pipe and waited for (one at a time)."""

    def __init__(self, index: int, kind: str, model: str, adapters: dict[str, str], opts: dict[str, Any]) -> None:
        from multiprocessing.connection import Connection

        self.index = index
        self.info: dict[str, Any] = {}
        self.dead: str | None = None  # why calls fail, once the process is gone
        # A fresh interpreter, not multiprocessing's spawn: that runs the caller's main script again in the child
        # (a user's script without a __main__ guard would start its own eval there). The socket is the lane's pipe.
        mine, theirs = socket.socketpair()
        fd = theirs.fileno()
        code = f"from simplan.inference.engines.lanes import serve; serve({fd})"
        self.process = subprocess.Popen([sys.executable, "-c", code], pass_fds=(fd,), close_fds=True)
        theirs.close()
        self._conn = Connection(mine.detach())
        try:
            self._conn.send((kind, model, adapters, opts))
        except OSError:  # it died at once: wait_ready says how
            pass
        self._lock = threading.Lock()
        self._ended: list[str] = []  # sessions to free, sent with the next call

    def wait_ready(self) -> None:
        """Wait for the lane's engine; raise what building it raised, or LaneDied."""
        if not self._conn.poll(READY_SECONDS):
            raise LaneDied(f"engine lane {self.index}: its engine did not load in {READY_SECONDS:g} s")
        try:
            status, payload = self._conn.recv()
        except (EOFError, OSError):
            raise LaneDied(self._death("while loading its engine")) from None
        if status == "failed":
            raise payload
        self.info = payload

    def _death(self, when: str) -> str:
        try:
            code: int | None = self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            code = None
        cause = " (killed by the OS: out of memory?)" if code == -signal.SIGKILL else ""
        return (
            f"engine lane {self.index} (pid {self.process.pid}) exited with code {code}{cause} {when}; the "
            "episodes it served errored and run again on the next run of the same command (or give --lanes 1)"
        )

    def call(self, method: str, requests: list[Any]) -> list[Any]:
        return self._ask(("call", method, requests))

    def peak_mb(self) -> float | None:
        """The lane process's peak resident memory in MB (None where /proc cannot tell)."""
        return self._ask(("peak",))

    def _ask(self, message: tuple[Any, ...]) -> Any:
        with self._lock:
            if self.dead is not None:
                raise LaneDied(self.dead)
            if message[0] == "call":
                ended, self._ended = self._ended, []
                message = (*message, ended)
            try:
                self._conn.send(message)
                status, payload = self._conn.recv()
            except (EOFError, OSError):  # OSError: BrokenPipeError too
                self.dead = self._death("during a call")
                raise LaneDied(self.dead) from None
        if status == "error":
            raise payload
        return payload

    def end_session(self, session: str) -> None:
        with self._lock:
            self._ended.append(session)

    def close(self) -> None:
        with self._lock:
            if self.dead is None:
                try:
                    self._conn.send(("close",))
                except OSError:
                    pass
                self.dead = f"engine lane {self.index}: closed"
        try:
            self.process.wait(timeout=CLOSE_SECONDS)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=5)
        self._conn.close()


class _Calls:
    """The engine protocol's calls, each sent through `_call(method, requests)`."""

    def _call(self, method: str, requests: list[Any]) -> list[Any]:
        raise NotImplementedError

    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        return self._call("generate", requests)

    def score(self, requests: list[ScoreRequest]) -> list[ScoreResult]:
        return self._call("score", requests)

    def embed(self, requests: list[EmbedRequest]) -> list[EmbedResult]:
        return self._call("embed", requests)


class LaneEngine(_Calls):
    """The engine protocol over one lane (what a lane's BatchingEngine wraps)."""

    def __init__(self, lane: Lane) -> None:
        self.lane = lane
        self.adapters = list(lane.info.get("adapters", []))
        self.tokenizer = lane.info.get("tokenizer")
        self.usage = EngineUsage()

    def _call(self, method: str, requests: list[Any]) -> list[Any]:
        with timer() as t:
            results = self.lane.call(method, requests)
        if method != "embed":
            account(self.usage, results, t[0])
        return results

    def end_session(self, session: str) -> None:
        self.lane.end_session(session)

    def close(self) -> None:
        self.lane.close()


def _own_tokenizer(model: str) -> Any:
    """The model's tokenizer loaded here, where a lane's could not be sent (it did not pickle)."""
    from simplan.models.registry import load_tokenizer, resolve_model

    return load_tokenizer(resolve_model(model))


class LanedEngine(_Calls):
    """The engine protocol over N lanes (module docstring): a call outside a batcher goes to the lane with the
    fewest calls in flight; `batcher(window)` spreads episodes over the lanes, each batched on its own."""

    def __init__(self, kind: str, model: str, adapters: dict[str, str], lanes: int, **opts: Any) -> None:
        if lanes < 2:
            raise ValueError(f"LanedEngine.lanes: at least 2 (one lane is the engine itself), got {lanes}")
        started = [Lane(i, kind, model, adapters, opts) for i in range(lanes)]
        try:
            for lane in started:  # they load side by side; the first failure is raised
                lane.wait_ready()
        except BaseException:
            for lane in started:
                lane.close()
            raise
        self.lanes = [LaneEngine(lane) for lane in started]
        first = started[0].info
        self.adapters = list(first["adapters"])
        self.adapter_dirs = dict(first["adapter_dirs"])
        self.tokenizer = first["tokenizer"] or _own_tokenizer(model)  # the lanes' own, for counting and fitting
        self.merged = bool(first["merged"])
        self.backend = first["backend"]
        self.threads = opts.get("threads")
        self._busy = [0] * lanes
        self._lock = threading.Lock()

    @contextmanager
    def _least_busy(self) -> Iterator[LaneEngine]:
        with self._lock:
            i = min(range(len(self.lanes)), key=lambda j: (self.lanes[j].lane.dead is not None, self._busy[j], j))
            self._busy[i] += 1
        try:
            yield self.lanes[i]
        finally:
            with self._lock:
                self._busy[i] -= 1

    def _call(self, method: str, requests: list[Any]) -> list[Any]:
        with self._least_busy() as lane:
            return lane._call(method, requests)

    @property
    def usage(self) -> EngineUsage:
        """Every call any lane served (each lane keeps its own: a call reaches exactly one)."""
        total = EngineUsage()
        for lane in self.lanes:
            total.add(lane.usage)
        return total

    def end_session(self, session: str) -> None:
        """Free `session`'s state in every lane (with each lane's next call): cheap, and right wherever it ran."""
        for lane in self.lanes:
            lane.end_session(session)

    def peaks_mb(self) -> list[float | None]:
        """Each lane process's peak resident memory in MB (None for a lane that died or cannot tell): what an
        eval records beside its own peak (run.json `lane_peak_rss_mb`)."""
        peaks: list[float | None] = []
        for lane in self.lanes:
            try:
                peaks.append(lane.lane.peak_mb())
            except LaneDied:
                peaks.append(None)
        return peaks

    def batcher(self, window: float = 0.02) -> LaneBatcher:
        return LaneBatcher(self, window)

    def close(self) -> None:
        lanes, self.lanes = self.lanes, []
        for lane in lanes:
            lane.close()


class LaneSession:
    """One episode's membership of a LaneBatcher (what `session()` yields): its lane, its session in that lane's
    BatchingEngine, and `cancel(reason)`, which reaches it on whichever lane it is."""

    def __init__(self, batcher: LaneBatcher) -> None:
        self._batcher = batcher
        self.lane = -1
        self.cancelled: str | None = None
        self._context: Any = None  # the lane BatchingEngine's session() context, entered
        self._handle: BatchSession | None = None

    def join(self, lane: int) -> None:
        """Enter `lane`'s batcher (leaving the lane it was on); a cancelled episode stays cancelled there."""
        self.leave()
        self.lane = lane
        self._context = self._batcher.batchers[lane].session()
        handle = self._context.__enter__()
        with self._batcher._lock:  # a cancel from another thread (the time budget) sees this handle or sets this
            self._handle, cancelled = handle, self.cancelled
        if cancelled is not None:
            handle.cancel(cancelled)

    def leave(self) -> None:
        if self._context is not None:
            context, self._context, self._handle = self._context, None, None
            context.__exit__(None, None, None)

    def cancel(self, reason: str) -> None:
        with self._batcher._lock:
            self.cancelled = reason
            handle = self._handle
        if handle is not None:
            handle.cancel(reason)


class LaneBatcher:
    """What evaluation/runner.py uses in place of one BatchingEngine over a LanedEngine: `session()` puts the
    calling episode on the lane with the fewest episodes (lanes still alive first), and each lane's BatchingEngine
    merges its own episodes' calls. An episode stays on its lane (its prefix cache is there) until its lane holds
    two episodes more than another, as when the last episodes of an eval happen to share a lane: then its next
    call moves it to the emptier lane (one prefill there). The BatchingEngine interface (session, cancel, close,
    stats, usage) over all lanes."""

    def __init__(self, engine: LanedEngine, window: float = 0.02) -> None:
        self.inner = engine
        self.window = window
        self.adapters = list(engine.adapters)
        self.tokenizer = engine.tokenizer
        self.batchers = [BatchingEngine(lane, window=window) for lane in engine.lanes]
        self.moves = 0  # episodes moved to an emptier lane
        self._episodes = [0] * len(self.batchers)
        self._lock = threading.Lock()
        self._local = threading.local()  # .session: the calling thread's LaneSession

    def _alive(self) -> list[int]:
        return [i for i, lane in enumerate(self.inner.lanes) if lane.lane.dead is None] or list(
            range(len(self.batchers))
        )

    def _emptiest(self) -> int:
        return min(self._alive(), key=lambda j: (self._episodes[j], j))

    @contextmanager
    def session(self) -> Iterator[LaneSession]:
        handle = LaneSession(self)
        with self._lock:
            lane = self._emptiest()
            self._episodes[lane] += 1
        handle.join(lane)
        outer, self._local.session = getattr(self._local, "session", None), handle
        try:
            yield handle
        finally:
            self._local.session = outer
            handle.leave()
            with self._lock:
                self._episodes[handle.lane] -= 1

    def _route(self) -> Any:
        """The calling episode's lane batcher, after moving the episode if its lane holds two more episodes than
        another (or is dead); a call outside any session goes to the engine's least busy lane."""
        handle: LaneSession | None = getattr(self._local, "session", None)
        if handle is None:
            return self.inner
        with self._lock:
            target = self._emptiest()
            here = handle.lane
            move = here not in self._alive() or self._episodes[here] - self._episodes[target] >= 2
            if move:
                self._episodes[here] -= 1
                self._episodes[target] += 1
                self.moves += 1
        if move:
            handle.join(target)
        return self.batchers[handle.lane]

    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        return self._route().generate(requests)

    def score(self, requests: list[ScoreRequest]) -> list[ScoreResult]:
        return self._route().score(requests)

    def embed(self, requests: list[EmbedRequest]) -> list[EmbedResult]:
        return self._route().embed(requests)

    def end_session(self, session: str) -> None:
        self.inner.end_session(session)

    @property
    def usage(self) -> EngineUsage:
        total = EngineUsage()
        for b in self.batchers:
            total.add(b.usage)
        return total

    @property
    def stats(self) -> LaneStats:
        return LaneStats.over([b.stats for b in self.batchers], self.moves)

    def cancel(self, reason: str) -> None:
        for b in self.batchers:
            b.cancel(reason)

    def close(self) -> None:
        """Stop every lane's dispatcher (pending calls are served first); the lanes stay open (LanedEngine.close)."""
        for b in self.batchers:
            b.close()

    def __getattr__(self, attr: str) -> Any:  # backend extras pass through, as BatchingEngine's do
        if attr == "inner":
            raise AttributeError(attr)
        return getattr(self.inner, attr)


@dataclasses.dataclass
class LaneStats(BatchStats):
    """The lanes' BatchStats added up (max_calls_per_batch: the largest of any lane), and each lane's episode
    calls (how evenly the episodes were spread)."""

    lane_calls: list[int] = dataclasses.field(default_factory=list)
    moves: int = 0  # episodes moved to an emptier lane (LaneBatcher)

    @classmethod
    def over(cls, stats: list[BatchStats], moves: int = 0) -> LaneStats:
        return cls(
            underlying_calls=sum(s.underlying_calls for s in stats),
            episode_calls=sum(s.episode_calls for s in stats),
            requests=sum(s.requests for s in stats),
            max_calls_per_batch=max((s.max_calls_per_batch for s in stats), default=0),
            split_retries=sum(s.split_retries for s in stats),
            lane_calls=[s.episode_calls for s in stats],
            moves=moves,
        )

    def to_dict(self) -> dict[str, Any]:
        return {**super().to_dict(), "lanes": len(self.lane_calls), "lane_calls": self.lane_calls, "moves": self.moves}
