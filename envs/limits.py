"""Hard limits on environment steps: a wall-clock limit per step and a cap on observation length.

Every env made with `make_env` (envs/registry.py) comes wrapped in `LimitedEnv`, so the planner, the
collector and `simplan envs check` get the limits without knowing about them:

    env = make_env("twx", step_timeout=20)          # seconds; 0 = no limit (default DEFAULT_STEP_TIMEOUT)
    env = make_env("bfcl", max_observation_chars=0)  # 0 = no cap (default DEFAULT_MAX_OBSERVATION_CHARS)
    result = env.step(action)                        # never longer than env.step_timeout (plus a little)

Both keys are ordinary env kwargs, so a suite or recipe sets them in `env_kwargs`.

How a step is stopped depends on what the adapter's code can survive:

- A thread watchdog (the default). The step runs in a daemon thread; past the limit the caller gets a
  FAILED action (`Observation.error=True`, text `TIMEOUT_TEXT`, `info["timed_out"]` = the limit) with
  the last observation's goal, valid actions and score, and the episode goes on. A thread cannot be
  stopped, so the step may still finish in the background and its effect then shows in the next
  observation (as with a network call that timed out). The next step or reset first waits up to one
  more limit for it; if it is still running the env is stuck: `step` raises `EnvStuck` (the episode
  is lost and must be marked errored; the planner and the collector do) and `reset` drops the stuck
  adapter and builds a fresh one. This is what the JVM envs (TWX, ScienceWorld) get: a py4j call
  waits on a socket, so a hung JVM never hangs the caller for more than two limits.
- The adapter's own limit. An adapter whose steps can run Python code that holds the GIL (BFCL's tool
  backends) takes a `step_timeout` constructor argument and keeps it as `self.step_timeout`: it runs
  that code in a `WorkerProcess`, which is killed on a timeout, and rebuilds what the process held
  (envs/bfcl.py). `make_env` hands `step_timeout` to such an adapter and adds no thread watchdog.

Observations (of `reset` and of every step) longer than `max_observation_chars` are cut, with a note
saying how much was cut (`cap_text`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import multiprocessing
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from simplan.envs.base import Action, Env, EnvCrashed, Observation, StepResult, Task

DEFAULT_STEP_TIMEOUT = 30.0  # seconds: JVM steps take well under a second; a stuck one never returns
# The longest observation of any BFCL expert replay is 27,699 characters (multi_turn_long_context
# get_stock_info); TWX and ScienceWorld observations are far shorter.
DEFAULT_MAX_OBSERVATION_CHARS = 40_000
TIMEOUT_TEXT = (
    "Error: the action did not finish within {seconds:g} s (the step time limit) and failed. "
    "If it still completes, its effect shows in the next observation."
)
CUT_NOTE = "\n[... {cut:,} more characters cut: observations are capped at {limit:,} characters]"


class StepTimeout(RuntimeError):
    """A call ran past its wall-clock limit and was stopped (for a `WorkerProcess`: the process was killed)."""

    def __init__(self, what: str, seconds: float) -> None:
        super().__init__(f"{what} did not finish within {seconds:g} s")
        self.seconds = seconds


class WorkerDied(RuntimeError):
    """A `WorkerProcess` exited while running a call (e.g. killed for memory); what it held is lost."""


class WorkerError(RuntimeError):
    """A call raised inside a `WorkerProcess`; the message holds the worker's traceback."""


class EnvStuck(EnvCrashed):
    """A step that timed out is still running: the adapter cannot take another step this episode."""


@dataclass(frozen=True)
class StepLimits:
    """The limits `LimitedEnv` enforces."""

    step_timeout: float = field(
        default=DEFAULT_STEP_TIMEOUT, metadata={"help": "wall-clock seconds per env step (0 = no limit)"}
    )
    max_observation_chars: int = field(
        default=DEFAULT_MAX_OBSERVATION_CHARS,
        metadata={"help": "characters an observation may have; longer ones are cut with a note (0 = no cap)"},
    )

    def __post_init__(self) -> None:
        if not self.step_timeout >= 0:  # also rejects NaN
            raise ValueError(f"step_timeout: must be >= 0 seconds (0 = no limit), got {self.step_timeout!r}")
        if self.max_observation_chars < 0:
            raise ValueError(f"max_observation_chars: must be >= 0 (0 = no cap), got {self.max_observation_chars!r}")


def cap_text(text: str, limit: int) -> str:
    """`text` cut to `limit` characters plus a note of how many were cut (unchanged when it fits or limit is 0)."""
    if not limit or len(text) <= limit:
        return text
    return text[:limit] + CUT_NOTE.format(cut=len(text) - limit, limit=limit)


def enforces_step_timeout(factory: Callable[..., Env]) -> bool:
    """True when an adapter factory takes `step_timeout`: the adapter stops its own steps (module docstring)."""
    try:
        return "step_timeout" in inspect.signature(factory).parameters
    except (TypeError, ValueError):  # no signature to read (a builtin): assume it does not
        return False


def make_limited(factory: Callable[..., Env], kwargs: dict[str, Any]) -> LimitedEnv:
    """`factory(**kwargs)` wrapped in `LimitedEnv`; `step_timeout` and `max_observation_chars` are read from kwargs."""
    kwargs = dict(kwargs)
    max_chars = kwargs.pop("max_observation_chars", DEFAULT_MAX_OBSERVATION_CHARS)
    if enforces_step_timeout(factory):
        env = factory(**kwargs)  # step_timeout, when given, is the adapter's own setting
        own_timeout = float(env.step_timeout)  # type: ignore[attr-defined]
        return LimitedEnv(env, StepLimits(own_timeout, max_chars), watchdog=False)
    limits = StepLimits(float(kwargs.pop("step_timeout", DEFAULT_STEP_TIMEOUT)), max_chars)
    return LimitedEnv(factory(**kwargs), limits, rebuild=lambda: factory(**kwargs))


# ---------------------------------------------------------------------------------------------
# The wrapper every made env wears
# ---------------------------------------------------------------------------------------------
class LimitedEnv:
    """Implements `envs.base.Env` by delegating to an adapter under `StepLimits` (module docstring).

    `watchdog=False`: the adapter enforces `step_timeout` itself; only observations are capped.
    `rebuild`: makes a fresh adapter when a stuck one must be dropped (without it, `reset` raises `EnvStuck`).
    """

    def __init__(
        self, env: Env, limits: StepLimits, rebuild: Callable[[], Env] | None = None, watchdog: bool = True
    ) -> None:
        self.env = env
        self.limits = limits
        self._rebuild = rebuild
        self._watchdog = watchdog and limits.step_timeout > 0
        self._running: threading.Thread | None = None  # a timed-out step that may still be running
        self._last: StepResult = StepResult(observation=Observation(text=""))
        self.timeouts = 0  # over the wrapper's life
        self.rebuilds = 0

    @property
    def name(self) -> str:
        return self.env.name

    @property
    def step_timeout(self) -> float:
        """Seconds a step may take (0 = no limit), whoever enforces it."""
        return self.limits.step_timeout

    @property
    def unwrapped(self) -> Env:
        """The adapter itself (as in gymnasium): for its type, docstring and adapter-only methods."""
        return self.env

    def __getattr__(self, attr: str) -> Any:  # adapter extras: error_patterns, families, available_tools ...
        if attr == "env":
            raise AttributeError(attr)
        return getattr(self.env, attr)

    # -- Env protocol --------------------------------------------------------------------------
    def tasks(self, fold: str, families: list[str] | None = None, limit: int | None = None) -> list[Task]:
        return self.env.tasks(fold, families=families, limit=limit)

    def reset(self, task: Task) -> Observation:
        if not self._finished_late():
            self._replace_stuck_env()
        obs = self._capped(self.env.reset(task))
        self._last = StepResult(observation=obs)
        return obs

    def step(self, action: Action) -> StepResult:
        if not self._watchdog:
            result = self.env.step(action)
        else:
            if not self._finished_late():
                raise EnvStuck(
                    f"{self.name}: a step that timed out {self.limits.step_timeout:g} s ago is still running "
                    f"after another {self.limits.step_timeout:g} s; the adapter cannot take another step. The "
                    "episode is lost (mark it errored); the next reset() starts a fresh adapter."
                )
            result = self._guarded_step(action)
        result = dataclasses.replace(result, observation=self._capped(result.observation))
        self._last = result
        return result

    def expert_plan(self) -> list[Action]:
        return self.env.expert_plan()

    def parse_action(self, text: str) -> Action:
        return self.env.parse_action(text)  # our own strict parser: bounded by the text's length

    def close(self) -> None:
        if self._running is not None and self._running.is_alive():
            _close_in_background(self.env)  # closing may block on the stuck call; do not wait for it
        else:
            self.env.close()
        self._running = None

    # -- limits --------------------------------------------------------------------------------
    def _guarded_step(self, action: Action) -> StepResult:
        box: dict[str, Any] = {}

        def run() -> None:
            try:
                box["result"] = self.env.step(action)
            except BaseException as e:  # noqa: BLE001 - handed to the caller's thread below
                box["error"] = e

        # A daemon thread: a step that never returns must not keep the interpreter from exiting.
        thread = threading.Thread(target=run, name=f"{self.name}-step", daemon=True)
        thread.start()
        thread.join(self.limits.step_timeout)
        if thread.is_alive():
            self._running = thread
            self.timeouts += 1
            return self._timed_out()
        if "error" in box:
            raise box["error"]
        return box["result"]

    def _timed_out(self) -> StepResult:
        seconds = self.limits.step_timeout
        last = self._last
        obs = dataclasses.replace(last.observation, text=TIMEOUT_TEXT.format(seconds=seconds), error=True)
        return StepResult(obs, reward=0.0, score=last.score, done=False, won=False, info={"timed_out": seconds})

    def _finished_late(self) -> bool:
        """Wait up to one limit for a timed-out step still running; True when none is running any more."""
        if self._running is None:
            return True
        self._running.join(self.limits.step_timeout)
        if self._running.is_alive():
            return False
        self._running = None
        return True

    def _replace_stuck_env(self) -> None:
        if self._rebuild is None:
            raise EnvStuck(
                f"{self.name}: a timed-out step is still running and this wrapper cannot build a fresh adapter; "
                "make the env with envs.registry.make_env so it can be rebuilt"
            )
        _close_in_background(self.env)
        self.env = self._rebuild()
        self._running = None
        self.rebuilds += 1

    def _capped(self, obs: Observation) -> Observation:
        text = cap_text(obs.text, self.limits.max_observation_chars)
        return obs if text is obs.text else dataclasses.replace(obs, text=text)


def _close_in_background(env: Env) -> None:
    def close() -> None:
        try:
            env.close()
        except Exception:  # noqa: BLE001 - the adapter is being dropped as stuck; nothing more to do
            pass

    threading.Thread(target=close, name=f"{env.name}-close", daemon=True).start()


# ---------------------------------------------------------------------------------------------
# A child process for code a thread cannot stop
# ---------------------------------------------------------------------------------------------
def _serve(conn: Any) -> None:
    """The worker's loop: run (function, args) messages until the parent closes the pipe."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle; it kills us
    while True:
        try:
            fn, args = conn.recv()
        except (EOFError, OSError):  # the parent closed the pipe or died
            return
        try:
            reply = ("ok", fn(*args))
        except BaseException as e:  # noqa: BLE001 - reported to the parent, which decides
            where = f"{getattr(fn, '__qualname__', fn)}"
            reply = ("error", f"{where} raised {type(e).__name__}: {e}\n{traceback.format_exc(limit=8)}")
        try:
            conn.send(reply)
        except Exception as e:  # noqa: BLE001 - an unpicklable result: say so instead
            conn.send(("error", f"{getattr(fn, '__qualname__', fn)} returned an unpicklable value: {e}"))


@contextlib.contextmanager
def main_module_hidden() -> Iterator[None]:
    """Start a spawned child without the parent's `__main__`: spawn runs the parent's main script again in the
    child (to find functions defined there), and a user script that makes an env at module level, without an
    `if __name__ == "__main__":` guard, then starts a worker inside the worker, which dies ("bfcl worker process
    died"). The worker only runs functions of importable modules, so it needs no main script."""
    main = sys.modules.get("__main__")
    saved = {k: main.__dict__[k] for k in ("__file__", "__spec__") if main is not None and k in main.__dict__}
    if "__spec__" in saved:
        main.__spec__ = None  # type: ignore[union-attr]
    if "__file__" in saved:
        del main.__file__  # type: ignore[union-attr]
    try:
        yield
    finally:
        for key, value in saved.items():
            setattr(main, key, value)


class WorkerProcess:
    """A child process that runs module-level functions under a wall-clock limit, killed when one runs over.

        worker = WorkerProcess("bfcl")
        value = worker.call(some_module_function, arg1, arg2, timeout=10.0)   # StepTimeout after 10 s

    The child is started on first use (spawn: a fresh interpreter, safe from a threaded parent) and
    keeps module globals between calls, so it can hold state (BFCL's backend instances). A call past
    its limit kills it (SIGKILL works on code that holds the GIL) and raises `StepTimeout`; a child
    that dies during a call raises `WorkerDied`; both lose everything the child held, and the next
    call starts a fresh child. A function that raises gives `WorkerError` with its traceback.
    """

    def __init__(self, label: str) -> None:
        self.label = label
        self._process: Any = None
        self._conn: Any = None
        self.starts = 0

    @property
    def alive(self) -> bool:
        return self._process is not None and self._process.is_alive()

    def start(self) -> None:
        if self._process is not None:
            return
        ctx = multiprocessing.get_context("spawn")
        parent, child = ctx.Pipe()
        # daemon: the child is killed when the parent exits normally; if the parent is killed, the
        # child's recv() fails on the closed pipe and it exits by itself.
        process = ctx.Process(target=_serve, args=(child,), name=f"simplan-{self.label}-worker", daemon=True)
        with main_module_hidden():
            process.start()
        child.close()
        self._process, self._conn = process, parent
        self.starts += 1

    def call(self, fn: Callable[..., Any], *args: Any, timeout: float) -> Any:
        """`fn(*args)` in the child; `timeout` seconds at most (0 = no limit)."""
        self.start()
        t0 = time.monotonic()
        try:
            self._conn.send((fn, args))
            ready = self._conn.poll(timeout if timeout > 0 else None)
        except (BrokenPipeError, EOFError, OSError) as e:
            self.kill()
            raise WorkerDied(f"{self.label} worker process is gone ({type(e).__name__}: {e})") from e
        if not ready:
            self.kill()
            raise StepTimeout(f"{self.label} worker: {fn.__name__}", timeout)
        try:
            status, value = self._conn.recv()
        except (EOFError, OSError) as e:
            code = self._exit_code()
            self.kill()
            raise WorkerDied(
                f"{self.label} worker process died during {fn.__name__} after {time.monotonic() - t0:.1f} s "
                f"(exit code {code})"
            ) from e
        if status == "error":
            raise WorkerError(f"{self.label} worker: {value}")
        return value

    def _exit_code(self) -> int | None:
        self._process.join(timeout=1)
        return self._process.exitcode

    def kill(self) -> None:
        """Stop the child at once (idempotent); what it held is lost."""
        process, conn = self._process, self._conn
        self._process = self._conn = None
        if conn is not None:
            conn.close()
        if process is not None:
            if process.is_alive():
                process.kill()
            process.join(timeout=5)
            if process.exitcode is not None:
                process.close()  # frees its pipe and sentinel now, not at garbage collection

    close = kill
