"""This process's resident memory (Linux /proc), and giving freed memory back: what the pipeline reports per
stage (workflows/pipeline.py), what training sets for a run and calls when it ends (training/trainer.py) and what
bench/bench_train_memory.py measures a step's phases with.

    from simplan.core.memory import mmap_threshold, peak_reset, rss_mb, release_memory
    peak_reset()          # VmHWM starts again from today's resident size
    ...                   # a stage
    rss_mb("VmHWM")       # its peak in MB (None off Linux)
    release_memory()      # collect reference cycles, hand glibc's free heap back to the OS
    with mmap_threshold(128 << 10): ... # glibc: blocks of 128 KiB and more in their own maps, unmapped when freed
"""

from __future__ import annotations

import ctypes
import gc
from collections.abc import Iterator
from contextlib import contextmanager
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


M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter number
GLIBC_MMAP_THRESHOLD_MAX = 32 * 1024 * 1024  # the ceiling of glibc's own threshold on 64-bit Linux


@contextmanager
def mmap_threshold(nbytes: int) -> Iterator[None]:
    """`set_mmap_threshold(nbytes)` for the block, then glibc's largest threshold (its own, grown, cannot be had back
    once fixed: the largest is where it grows to). Nothing at all when `nbytes` is 0."""
    if not nbytes:
        yield
        return
    set_mmap_threshold(nbytes)
    try:
        yield
    finally:
        set_mmap_threshold(GLIBC_MMAP_THRESHOLD_MAX)


def set_mmap_threshold(nbytes: int) -> bool:
    """glibc: serve allocations of at least `nbytes` from their own memory maps, given back to the OS when freed.

    glibc's own threshold starts at 128 KiB and grows to the largest block freed (up to 32 MiB), so after a training
    step's first frees its activations come from the heap, where freed blocks stay resident and fragment: whole runs
    of one recipe on the same data peaked 0.6-1.0 GiB apart (bench/RESULTS.md "Training throughput"). A fixed
    threshold also turns that growth off for the rest of the process. False where the C library is not glibc."""
    try:
        return bool(ctypes.CDLL("libc.so.6").mallopt(M_MMAP_THRESHOLD, int(nbytes)))
    except (OSError, AttributeError):
        return False
