"""Data-parallel training on one machine: with `TrainArguments.processes` > 1, `train` runs the same training in
that many processes under torchrun (gloo on the CPU, NCCL on GPUs), each taking an equal share of every optimizer
step, and waits for them.

    metrics = train_in_processes(arguments, output_dir, processes)   # in the launching process (trainer.py)
    launched()                                                       # True inside one of those processes

Each process gets gradient_accumulation_steps / processes micro-batches of every step and num_threads / processes
threads (at least 1), so the steps are the recipe's: on a 2-core CPU two processes of one thread trained 1.39x
faster than one of two, the losses the same to 0.3% (bench/RESULTS.md "Training throughput"). The processes read
the run's resolved arguments from output_dir/processes.yaml; process 0 writes what one process would (the adapter,
metrics.json); a time budget stops them all at the same step (completion_trainer.py TimeLimitCallback).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from simplan.core.io import write_text
from simplan.core.memory import rss_mb


def launched() -> bool:
    """Whether this process is one of several torchrun started (its WORLD_SIZE)."""
    return int(os.environ.get("WORLD_SIZE", "1") or 1) > 1


def peaks_mb() -> list[float | None]:
    """Each training process's peak resident memory (VmHWM, MB), gathered to every one of them; one process: its
    own. A stage's memory is their sum (workflows/pipeline.py), since the processes hold theirs at the same time."""
    own = rss_mb("VmHWM")
    if not launched():
        return [own]
    import torch.distributed as dist

    gathered: list[float | None] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, own)
    return gathered


def worker_arguments(arguments: dict[str, Any], processes: int) -> dict[str, Any]:
    """One process's share of the run's arguments: its micro-batches and threads of every step."""
    share = dict(arguments, processes=1)
    share["gradient_accumulation_steps"] = arguments["gradient_accumulation_steps"] // processes
    if arguments.get("num_threads"):
        share["num_threads"] = max(1, arguments["num_threads"] // processes)
    return share


def torchrun_command(processes: int, port: int, program: list[str]) -> list[str]:
    """`program` (a module or script and its arguments) in `processes` processes under torchrun on this machine's
    loopback (no dependence on the host name resolving)."""
    node = ["--nnodes=1", f"--nproc_per_node={processes}", "--master_addr=127.0.0.1", f"--master_port={port}"]
    return [sys.executable, "-m", "torch.distributed.run", *node, *program]


def launch_command(config: Path, processes: int, port: int) -> list[str]:
    """The training processes' command: `simplan train` on the processes' config."""
    return torchrun_command(processes, port, ["-m", "simplan.scripts.cli", "train", "--config", str(config)])


def process_environment(threads: int) -> dict[str, str]:
    """This environment for processes of `threads` OpenMP threads each, gloo on the loopback interface."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    if Path("/sys/class/net/lo").exists():
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    return env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def train_in_processes(arguments: dict[str, Any], output_dir: Path, processes: int) -> dict[str, Any]:
    """Run the training of `arguments` in `processes` processes; returns its metrics.json. A failed process fails
    the run with the command to rerun (it resumes from the last checkpoint, as in one process)."""
    output_dir.mkdir(parents=True, exist_ok=True)
    share = worker_arguments(arguments, processes)
    config = output_dir / "processes.yaml"
    write_text(config, yaml.safe_dump(share, sort_keys=False))
    command = launch_command(config, processes, free_port())
    threads = share.get("num_threads") or 1
    env = process_environment(threads)
    print(f"train: {processes} processes of {threads} thread(s): {' '.join(command)}", flush=True)
    rc = subprocess.run(command, env=env, check=False).returncode
    metrics = output_dir / "metrics.json"
    if rc != 0 or not metrics.exists():
        raise RuntimeError(
            f"train: the {processes} training processes failed (exit status {rc}; their output is above). Rerun "
            f"the same command to resume from the last checkpoint in {output_dir}, or train in one process with "
            "--processes 1"
        )
    return json.loads(metrics.read_text())
