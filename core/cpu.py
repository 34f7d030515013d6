"""How busy this machine's cores are, from /proc/stat (Linux): what the CLI reads before it sets OpenMP's
wait policy (scripts/cli.py), and what bench/bench_under_load.py gives its cells.

    from simplan.core.cpu import idle_cores
    idle_cores(0.3)     # e.g. 1.97 on an idle 2-core machine, ~1.0 beside one busy process; None off Linux
"""

from __future__ import annotations

import os
import time
from pathlib import Path


def idle_cores(seconds: float = 0.3) -> float | None:
    """Cores this process may use (its affinity: `taskset -c 0,1` makes a 2-core machine of a big one) that
    everything else left idle over `seconds`; None where /proc/stat cannot be read."""
    allowed = {f"cpu{i}" for i in os.sched_getaffinity(0)}

    def sample() -> tuple[int, int]:
        idle = total = 0
        for line in Path("/proc/stat").read_text().splitlines():
            name, *values = line.split()
            if name in allowed:
                fields = [int(x) for x in values]
                idle, total = idle + fields[3] + fields[4], total + sum(fields)  # idle + iowait, all
        return idle, total

    try:
        idle0, total0 = sample()
        time.sleep(seconds)
        idle1, total1 = sample()
    except (OSError, ValueError, IndexError):
        return None
    return (idle1 - idle0) / max(total1 - total0, 1) * len(allowed)
