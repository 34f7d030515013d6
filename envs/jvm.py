"""One JVM-backed environment process, owned by one adapter: lazy start, crash detection, restart, shutdown.

TextWorld-Express and ScienceWorld run their simulators in a JVM reached through py4j. An adapter holds
one `JvmHandle`, so one adapter object = one JVM, reused across episodes. Any py4j error during a call
means the episode's state is lost: the handle tears the process down and raises `EnvCrashed`; the
adapter's next `reset` starts a fresh JVM. A start that fails is tried once more, then raises `EnvCrashed`
naming why. Every JVM starts without an hsperfdata file (`JVM_OPTIONS`, through JAVA_TOOL_OPTIONS). Used by
envs/textworld_express.py and envs/scienceworld.py; not a public API.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

from simplan.envs.base import EnvCrashed

T = TypeVar("T")
R = TypeVar("R")

# Options every JVM an adapter starts is given (the JVM reads JAVA_TOOL_OPTIONS and names it on stderr): no hsperfdata
# file. With one, a JVM whose pid names a file another process holds locked prints a warning on stdout, where py4j
# reads the gateway's port, and the start fails (one TWX reset of 80 in session 32).
JVM_OPTIONS = ("-XX:-UsePerfData",)
START_TRIES = 2


def use_jvm_options() -> None:
    """Add JVM_OPTIONS to this process's JAVA_TOOL_OPTIONS (what the user set there is kept)."""
    current = os.environ.get("JAVA_TOOL_OPTIONS", "").split()
    missing = [o for o in JVM_OPTIONS if o not in current]
    if missing:
        os.environ["JAVA_TOOL_OPTIONS"] = " ".join(current + missing)


@contextlib.contextmanager
def quiet_py4j() -> Iterator[None]:
    """py4j logs a traceback per reconnect attempt to a dead JVM; we report the crash ourselves."""
    logger = logging.getLogger("py4j")
    level = logger.level
    logger.setLevel(logging.CRITICAL + 1)
    try:
        yield
    finally:
        logger.setLevel(level)


def _py4j_error() -> type[BaseException]:
    from py4j.protocol import Py4JError

    return Py4JError


def _describe(error: BaseException) -> str:
    try:
        with quiet_py4j():
            lines = str(error).strip().splitlines()
    except Exception:
        lines = []
    java = [ln.strip() for ln in lines if ln.strip().startswith(("java.", "scala.", "Caused by"))]
    return (java or lines or ["no message"])[0][:300]


class JvmHandle(Generic[T]):
    """Starts `factory()` (a py4j wrapper object that launches a JVM) on first use and owns it."""

    def __init__(self, factory: Callable[[], T], label: str) -> None:
        self._factory = factory
        self.label = label
        self._obj: T | None = None
        self.starts = 0  # JVMs started by this handle (1 + restarts after crashes)
        self.crashes = 0

    @property
    def started(self) -> bool:
        return self._obj is not None

    def get(self) -> T:
        """The live wrapper object, starting a JVM if there is none (first use or after a crash)."""
        if self._obj is None:
            if shutil.which("java") is None:
                raise RuntimeError(
                    f"{self.label} needs Java 11+ but `java` is not on PATH; install it "
                    "(e.g. `apt-get install openjdk-17-jre-headless`) or run `make setup`"
                )
            use_jvm_options()
            for attempt in range(1, START_TRIES + 1):
                try:
                    self._obj = self._factory()
                    break
                except Exception as e:  # the JVM did not come up (py4j read no port, java exited): try again
                    if attempt == START_TRIES:
                        raise EnvCrashed(
                            f"{self.label} JVM did not start in {START_TRIES} tries ({type(e).__name__}: {e}); the "
                            "episode is lost and must be marked errored. Check `java -version` (Java 11+) and "
                            "free memory; the next reset() tries again."
                        ) from e
            self.starts += 1
        return self._obj

    def call(self, fn: Callable[[T], R], what: str) -> R:
        """Run `fn(wrapper)`; a py4j failure kills the JVM and becomes `EnvCrashed`."""
        obj = self.get()
        try:
            with quiet_py4j():
                return fn(obj)
        except _py4j_error() as e:
            first_line = _describe(e)  # before close(): a Java exception's text is fetched from the JVM
            self.crashes += 1
            self.close()
            raise EnvCrashed(
                f"{self.label} JVM failed during {what} ({type(e).__name__}: {first_line}); the episode is lost "
                "and must be marked errored. The next reset() starts a fresh JVM."
            ) from e

    def process(self) -> Any:
        """The JVM's subprocess.Popen (for tests and diagnostics), or None when not started."""
        if self._obj is None:
            return None
        return self._obj._gateway.java_process  # type: ignore[attr-defined]

    def close(self) -> None:
        """Shut the JVM down (idempotent); safe on a JVM that already died."""
        obj, self._obj = self._obj, None
        if obj is None:
            return
        proc = getattr(getattr(obj, "_gateway", None), "java_process", None)
        with quiet_py4j(), contextlib.suppress(Exception):
            obj.close()  # type: ignore[attr-defined]
        # The wrappers call close() again from __del__, and py4j's finalizers of remote objects try to
        # reach the JVM; on a dead JVM both only log reconnect tracebacks. Mark the client disconnected.
        with contextlib.suppress(Exception):
            obj.close = lambda: None  # type: ignore[attr-defined,method-assign]
        with contextlib.suppress(Exception):
            obj._gateway._gateway_client.is_connected = False  # type: ignore[attr-defined]
        if proc is not None and proc.poll() is None:
            try:
                proc.wait(timeout=2)  # it exits by itself after the shutdown handshake
            except Exception:
                with contextlib.suppress(Exception):
                    proc.kill()
                    proc.wait(timeout=10)


class JvmEnvLifecycle:
    """Shared lifecycle of the JVM-backed adapters: `self._jvm` is their JvmHandle."""

    _jvm: JvmHandle[Any]

    @property
    def jvm(self) -> JvmHandle[Any]:
        """The JVM handle (starts/crashes counters; tests kill its process to exercise recovery)."""
        return self._jvm

    def close(self) -> None:
        self._jvm.close()
        self._task = None

    def __enter__(self):
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass
