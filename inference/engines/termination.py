"""SIGTERM and SIGHUP as SystemExit, so a killed process still stops the children it started.

    from simplan.inference.engines.termination import exit_on_termination
    exit_on_termination()  # in the main thread, before starting vLLM (VLLMEngine and start_server call it)

Python's default action for SIGTERM (`kill PID`, `timeout`, a job scheduler) and SIGHUP (the terminal closed)
ends the process at once: no `finally`, no atexit, no weakref finalizers. vLLM stops its EngineCore process
(which stops its workers) from such a finalizer, so a terminated parent left `VLLM::EngineCore` running at
~190% CPU until killed by hand. Raised as SystemExit instead, the signal unwinds the stack like any exit, and
vLLM's own shutdown runs at interpreter exit. Ctrl-C needs nothing: Python already turns SIGINT into
KeyboardInterrupt, which unwinds the same way.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType

TERMINATION_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


def exit_on_termination() -> list[signal.Signals]:
    """Make SIGTERM and SIGHUP raise SystemExit(128 + signum) where they still have the default action.

    A handler someone else chose is kept: a Python handler already decides what the signal does (pytest's
    conftest and `simplan serve` raise KeyboardInterrupt), and SIG_IGN (nohup) asked for the signal to be
    ignored. Only the main thread may set handlers, so elsewhere this does nothing. Returns the signals it
    took over; calling it again changes nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        return []
    taken = []
    for sig in TERMINATION_SIGNALS:
        if signal.getsignal(sig) is signal.SIG_DFL:
            signal.signal(sig, _exit_on_signal)
            taken.append(sig)
    return taken


def _exit_on_signal(signum: int, frame: FrameType | None) -> None:
    # Later termination signals are ignored while we unwind: one arriving inside vLLM's atexit shutdown would
    # abort it half-way and leak the very processes it is stopping. SIGKILL still ends us at once.
    for sig in TERMINATION_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    raise SystemExit(128 + signum)  # the status a shell reports for a process killed by this signal
