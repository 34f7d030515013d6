"""This machine's CPU: how busy its cores are, from /proc/stat (Linux), what the CLI reads before it sets
OpenMP's wait policy (scripts/cli.py) and what bench/bench_under_load.py gives its cells; and whether it
computes bf16 natively, which decides the dtype a model runs in on the CPU (models/registry.py `resolve_dtype`)
and whether training autocasts (training/lora.py).

    from simplan.core.cpu import idle_cores, native_bf16
    idle_cores(0.3)     # e.g. 1.97 on an idle 2-core machine, ~1.0 beside one busy process; None off Linux
    native_bf16()       # True on CPUs with AVX512-BF16 or AMX (recent Xeons), False on others (e.g. AMD Zen 3)
"""

from __future__ import annotations

import os
import time
from pathlib import Path


def idle_cores(seconds: float = 0.3) -> float | None:
    """Cores this process may use (its affinity: `taskset -c 0,1` makes a 2-core machine of a big one) that
    everything else left idle over `seconds`; None where /proc/stat cannot be read."""
    allowed = {f"cpu{i}" for i in os.sched_getaffinity(0)}
    try:
        before = Path("/proc/stat").read_text()
        time.sleep(seconds)
        after = Path("/proc/stat").read_text()
        return idle_between(before, after, allowed)
    except (OSError, ValueError, IndexError):
        return None


def idle_between(before: str, after: str, cpus: set[str]) -> float:
    """Cores of `cpus` left idle between two /proc/stat readings: per core, its idle + iowait share of the time it
    ran. The hypervisor's steal time is left out of that time (a virtual core it did not run is not busy with
    another job here: at 15-30% steal an idle 2-core VM read as 1.4-1.7 idle cores), and so are guest times (user
    and nice already count them)."""

    def times(stat: str) -> dict[str, tuple[int, int]]:  # core -> (idle + iowait, user..softirq)
        out = {}
        for line in stat.splitlines():
            name, *values = line.split()
            if name in cpus:
                fields = [int(x) for x in values]
                out[name] = (fields[3] + fields[4], sum(fields[:7]))
        return out

    t0, t1 = times(before), times(after)
    return sum((t1[c][0] - t0[c][0]) / max(t1[c][1] - t0[c][1], 1) for c in t1 if c in t0)


def native_bf16(cpuinfo: str | Path = "/proc/cpuinfo") -> bool:
    """Whether the CPU has bf16 arithmetic (AVX512-BF16 or AMX flags in /proc/cpuinfo). Without it torch emulates
    bf16: a SmolLM2-135M prefill of 4 x 300 tokens took 13.3 s in bf16 against 1.9 s in float32 on a 2-core AMD
    EPYC (Zen 3), while on a Xeon with AMX bf16 ran 2.7x faster than float32 (bench/RESULTS.md)."""
    try:
        flags = Path(cpuinfo).read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags
