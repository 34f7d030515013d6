"""Cross-episode request batching: many episode threads, one engine, one batched call at a time.

    batching = BatchingEngine(engine, window=0.02)
    with batching.session():              # in each episode thread, around Planner(...).run(task)
        ...                                # the planner calls batching.generate / batching.score
    print(batching.stats)                  # underlying calls vs episode calls
    batching = batcher_for(engine, 0.02)   # the same, or the engine's own (engine lanes: one per lane)

The planning loop issues one engine call per decision; alone, a small model on a CPU or a GPU is
starved by such small batches. `BatchingEngine` implements the engine protocol
(inference/engines/base.py) for episode threads: each call is queued, and one dispatcher thread gathers
the calls that arrive within `window` seconds of the first, or until every active episode
(`session()`) is waiting, whichever comes first, issues ONE underlying `generate` (and one `score`)
over all of their requests, and hands each caller its own results with their own token counts.
Only the dispatcher thread touches the underlying engine, so backends need not be thread-safe.

If a merged call raises (e.g. NotImplementedError for a constraint one caller asked for), each
caller's requests are retried alone, so only the caller responsible sees the error and the
planner's own fallbacks work as they do without batching.

`cancel(reason)` ends the episodes at their next model call: waiting and later calls raise
`Cancelled(reason)` (the planner records the episode as errored), the call in flight finishes first.
`simplan eval` cancels on a second Ctrl-C, so a stop does not wait for a dozen long episodes.
`session.cancel(reason)` (the handle `session()` yields) does the same for one episode: a time budget
stops the episodes it no longer waits for.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from simplan.inference.engines.base import (
    EmbedRequest,
    EmbedResult,
    Engine,
    EngineUsage,
    GenerationRequest,
    GenerationResult,
    ScoreRequest,
    ScoreResult,
)


class Cancelled(RuntimeError):
    """A model call refused because the batcher was cancelled (`BatchingEngine.cancel`)."""


class BatchSession:
    """One episode thread's membership of a `BatchingEngine` (what `session()` yields); `cancel(reason)` refuses
    the episode's waiting and later calls with `Cancelled(reason)`, the call in flight finishes first."""

    def __init__(self, batcher: BatchingEngine) -> None:
        self._batcher = batcher
        self.cancelled: str | None = None

    def cancel(self, reason: str) -> None:
        self._batcher._cancel_session(self, reason)


@dataclass
class _Job:
    kind: str  # generate | score
    requests: list[Any]
    session: BatchSession | None = None  # the caller's (None: a call outside any session)
    arrived: float = field(default_factory=time.monotonic)
    done: threading.Event = field(default_factory=threading.Event)
    results: list[Any] | None = None
    error: BaseException | None = None


@dataclass
class BatchStats:
    underlying_calls: int = 0  # calls made on the wrapped engine
    episode_calls: int = 0  # calls the episodes made on this wrapper
    requests: int = 0
    max_calls_per_batch: int = 0
    split_retries: int = 0  # merged calls that failed and were retried caller by caller

    @property
    def calls_per_batch(self) -> float:
        return self.episode_calls / self.underlying_calls if self.underlying_calls else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "underlying_calls": self.underlying_calls,
            "episode_calls": self.episode_calls,
            "requests": self.requests,
            "max_calls_per_batch": self.max_calls_per_batch,
            "calls_per_batch": round(self.calls_per_batch, 3),
            "split_retries": self.split_retries,
        }


class BatchingEngine:
    """Engine protocol over a shared engine; merges concurrent callers' requests (module docstring)."""

    def __init__(self, engine: Engine, window: float = 0.02, max_requests: int = 512) -> None:
        if window < 0:
            raise ValueError(f"BatchingEngine.window: must be >= 0 seconds, got {window}")
        if max_requests < 1:
            raise ValueError(f"BatchingEngine.max_requests: must be >= 1, got {max_requests}")
        self.inner = engine
        self.window = window
        self.max_requests = max_requests
        self.adapters = list(getattr(engine, "adapters", []) or [])
        self.tokenizer = getattr(engine, "tokenizer", None)
        self.usage = EngineUsage()  # what the episodes asked for (the wrapped engine keeps its own)
        self.stats = BatchStats()
        self._cond = threading.Condition()
        self._pending: list[_Job] = []
        self._active = 0
        self._closed = False
        self._cancelled: str | None = None
        self._local = threading.local()  # .session: the calling thread's BatchSession
        self._thread = threading.Thread(target=self._loop, name="batching-engine", daemon=True)
        self._thread.start()

    # -- callers ---------------------------------------------------------------------------------
    @contextmanager
    def session(self) -> Iterator[BatchSession]:
        """Mark the calling thread as an active episode (the dispatcher waits for active episodes); yields the
        handle that cancels this episode's calls alone."""
        handle = BatchSession(self)
        with self._cond:
            self._active += 1
            self._cond.notify_all()
        outer, self._local.session = getattr(self._local, "session", None), handle
        try:
            yield handle
        finally:
            self._local.session = outer
            with self._cond:
                self._active -= 1
                self._cond.notify_all()

    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        return self._submit("generate", requests)

    def score(self, requests: list[ScoreRequest]) -> list[ScoreResult]:
        return self._submit("score", requests)

    def embed(self, requests: list[EmbedRequest]) -> list[EmbedResult]:
        if not callable(getattr(self.inner, "embed", None)):
            raise NotImplementedError(f"engine {type(self.inner).__name__}: cannot embed texts (hf can)")
        return self._submit("embed", requests)

    def _submit(self, kind: str, requests: list[Any]) -> list[Any]:
        if not requests:
            return []
        session = getattr(self._local, "session", None)
        job = _Job(kind, list(requests), session)
        with self._cond:
            if self._cancelled is not None:
                raise Cancelled(self._cancelled)
            if session is not None and session.cancelled is not None:
                raise Cancelled(session.cancelled)
            if self._closed:
                raise RuntimeError("BatchingEngine: closed; create a new one")
            self._pending.append(job)
            self._cond.notify_all()
        job.done.wait()
        if job.error is not None:
            raise job.error
        results = job.results or []
        with self._cond:
            usage = EngineUsage(calls=1, requests=len(results))
            for r in results:
                usage.prompt_tokens += r.prompt_tokens
                usage.completion_tokens += getattr(r, "completion_tokens", 0)
                usage.seconds += r.seconds
            self.usage.add(usage)
        return results

    # -- dispatcher ------------------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._closed:
                    self._cond.wait()
                if not self._pending:  # closed and drained
                    return
                deadline = self._pending[0].arrived + self.window
                while not self._closed:
                    waiting = len(self._pending)
                    queued = sum(len(j.requests) for j in self._pending)
                    if waiting >= self._active or queued >= self.max_requests:
                        break
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        break
                    self._cond.wait(remaining)
                jobs, self._pending = self._pending, []
            self._run(jobs)

    def _run(self, jobs: list[_Job]) -> None:
        for kind in ("score", "embed", "generate"):
            group = [j for j in jobs if j.kind == kind]
            if group:
                self._run_group(kind, group)

    def _call(self, kind: str, requests: list[Any]) -> list[Any]:
        fn = getattr(self.inner, kind)
        self.stats.underlying_calls += 1
        results = fn(requests)
        if len(results) != len(requests):
            raise RuntimeError(
                f"engine {type(self.inner).__name__}.{kind}: {len(results)} results for {len(requests)}"
            )
        return results

    def _run_group(self, kind: str, group: list[_Job]) -> None:
        self.stats.episode_calls += len(group)
        self.stats.requests += sum(len(j.requests) for j in group)
        self.stats.max_calls_per_batch = max(self.stats.max_calls_per_batch, len(group))
        flat = [r for j in group for r in j.requests]
        try:
            results = self._call(kind, flat)
        except BaseException as e:  # noqa: BLE001 - handed to the callers, never swallowed
            if len(group) == 1:
                group[0].error = e
                group[0].done.set()
                return
            self.stats.split_retries += 1
            for j in group:
                try:
                    j.results = self._call(kind, j.requests)
                except BaseException as e2:  # noqa: BLE001
                    j.error = e2
                j.done.set()
            return
        i = 0
        for j in group:
            j.results = results[i : i + len(j.requests)]
            i += len(j.requests)
            j.done.set()

    def cancel(self, reason: str) -> None:
        """Refuse every waiting and later call with `Cancelled(reason)`; the call in flight finishes."""
        self._refuse(reason)

    def _cancel_session(self, session: BatchSession, reason: str) -> None:
        self._refuse(reason, session)

    def _refuse(self, reason: str, session: BatchSession | None = None) -> None:
        """Refuse the waiting and later calls of `session` (None: of every caller) with `Cancelled(reason)`."""
        with self._cond:
            if session is None:
                self._cancelled = reason
            else:
                session.cancelled = reason
            jobs, kept = [], []
            for j in self._pending:
                (jobs if session is None or j.session is session else kept).append(j)
            self._pending = kept
            self._cond.notify_all()
        for job in jobs:
            job.error = Cancelled(reason)
            job.done.set()

    def close(self) -> None:
        """Stop the dispatcher (pending calls are served first). The wrapped engine stays open."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout=60)

    def __getattr__(self, attr: str) -> Any:  # backend extras (e.g. model name) pass through
        if attr == "inner":
            raise AttributeError(attr)
        return getattr(self.inner, attr)


def batcher_for(engine: Engine, window: float = 0.02) -> Any:
    """The batcher concurrent episodes share over `engine`: its own where it has one (engine lanes,
    inference/engines/lanes.py `LanedEngine.batcher`: one BatchingEngine per lane), else one BatchingEngine."""
    own = getattr(engine, "batcher", None)
    return own(window) if callable(own) else BatchingEngine(engine, window=window)
