"""This process's resident memory (Linux /proc), and giving freed memory back: what the pipeline reports per
stage (workflows/pipeline.py), what training calls when a run ends (training/trainer.py) and what
bench/bench_train_memory.py measures a step's phases with.

    from simplan.core.memory import peak_reset, rss_mb, release_memory
    peak_reset()          # VmHWM starts again from today's resident size
    ...                   # a stage
    rss_mb("VmHWM")       # its peak in MB (None off Linux)
    release_memory()      # collect reference cycles, hand glibc's free heap back to the OS
"""

from __future__ import annotations

import ctypes
import gc
from pathlib import Path


def rss_mb(field: str = "VmRSS") -> float | None:
    """The process's resident memory now (VmRSS) or its peak since the last reset (VmHWM), in MB; None where
    /proc/self/status cannot be read."""
    try:
        lines = Path("/proc/self/status").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return None


def peak_reset() -> bool:
    """Start VmHWM again from the current resident size (Linux: write 5 to /proc/self/clear_refs); False where
    the kernel does not allow it."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def release_memory() -> None:
    """Free what finished work left behind: reference cycles (a Trainer holds some), then glibc's free heap.

    `simplan pipeline` trains the decider and then the simulator in one process: without the trim, glibc keeps
    the first run's freed heap and the second run's peak lands on top of it (bench/RESULTS.md "Training
    throughput", memory per pipeline stage)."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to trim
        pass
