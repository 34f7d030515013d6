"""Same seed, same traces: run a fixed set of episodes and write their traces without the fields that vary run to run.

    .venv/bin/python bench/trace_identity.py --out runs/bench/identity-new
    diff <(cat runs/bench/identity-old/*.norm.jsonl) <(cat runs/bench/identity-new/*.norm.jsonl) && echo identical

A refactor that moves code must not change what the agent does: run this at the commit before and the commit
after (each from its own worktree) and compare the normalised traces. It only calls the `simplan` command, so
it runs unchanged at both commits. The episodes:
  1. the toy-tiny pipeline (collect, build, train a tiny random model's two adapters, reactive/plan/simplan on
     toy dev), one episode at a time so batch composition cannot change a floating-point tie;
  2. those adapters on two TextWorld-Express dev tasks per game with reactive, simplan and simplan-oracle
     (the env as simulator), 8 steps each.
Dropped from each event: wall-clock times and seconds, run ids and the per-invocation engine fields; every
action, observation, prediction, score, pivot, token count and model call stays.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
from pathlib import Path

VARYING = {"t", "run_id", "seconds", "wall_seconds", "planning_seconds", "env_seconds", "engine_seconds"}


def normalise(event: object) -> object:
    if isinstance(event, dict):
        return {k: normalise(v) for k, v in event.items() if k not in VARYING and not k.endswith("_seconds")}
    if isinstance(event, list):
        return [normalise(v) for v in event]
    return event


def write_normalised(traces: Path, out: Path) -> str:
    events = [normalise(json.loads(line)) for line in traces.read_text().splitlines() if line.strip()]
    events.sort(key=lambda e: (e.get("episode_id", ""), e.get("seq", 0)))
    text = "".join(json.dumps(e, sort_keys=True) + "\n" for e in events)
    out.write_text(text)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def simplan(*args: str) -> None:
    cmd = [sys.executable, "-m", "simplan.scripts.cli", *args]
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="folder for the runs and the normalised traces")
    args = p.parse_args()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    toy = out / "toy-tiny"
    simplan(
        "pipeline",
        "--config",
        "recipes/pipeline/toy-tiny.yaml",
        "--out",
        str(toy),
        "--engine",
        "{engine: hf, dtype: float32, threads: 1, batch_size: 16, concurrency: 1}",
    )
    model = json.loads((toy / ".stages" / "model.json").read_text())["model_path"]
    adapters = ",".join(f"{role}={toy / 'train' / role / 'adapter'}" for role in ("decider", "simulator"))
    twx = out / "twx"
    simplan(
        "eval",
        "--suite",
        "twx-dev-small",
        "--episodes",
        "2",
        "--max_steps",
        "8",
        "--arms",
        "reactive,simplan,simplan-oracle",
        "--engine",
        "hf",
        "--model",
        model,
        "--adapters",
        adapters,
        "--dtype",
        "float32",
        "--threads",
        "1",
        "--concurrency",
        "1",
        "--planner",
        "{simulator_max_tokens: 16, decider_max_tokens: 8}",
        "--out",
        str(twx),
    )
    for name, run in (("toy", toy / "eval"), ("twx", twx)):
        digest = write_normalised(run / "traces.jsonl", out / f"{name}.norm.jsonl")
        print(f"{name}: {digest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
