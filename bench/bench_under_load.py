"""Training steps/s idle vs beside one competing single-threaded busy process, under old and new thread settings.

    .venv/bin/python bench/bench_under_load.py --out runs/bench/under_load.json    # SmolLM2-135M: ~20 min, 2 cores
    .venv/bin/python bench/bench_under_load.py --model tiny-llama --steps 3        # a quick check of the script
    .venv/bin/python bench/bench_under_load.py --settings old,passive --steps 8
    taskset -c 0,1 .venv/bin/python bench/bench_under_load.py     # a 2-core machine on a bigger one

Run it on an otherwise idle machine (the "idle" cells must be idle). Each (setting, load) cell is a
fresh Python process, because the OpenMP runtime reads its settings once, when torch loads it. The
process loads the model with fresh LoRA adapters as `simplan train` does (training/trainer.py
`load_model_for_training`, r16 on every linear layer), then times --steps optimizer steps (AdamW,
loss on every token) on fixed random batches of --batch x --length tokens after --warmup untimed
ones. "loaded" runs the same cell beside one competitor: a subprocess spinning a pure-Python loop (one
core busy, no OpenMP), started before the cell and killed after it.

Settings (threads: torch.set_num_threads):
    old           OMP_WAIT_POLICY unset (libgomp spins while waiting), --threads threads: the demo before
    passive       OMP_WAIT_POLICY=PASSIVE (waiting threads sleep), --threads threads: what `simplan` now
                  sets for every command but serve (scripts/cli.py)
    passive-free  PASSIVE, threads = the cores free when the cell starts (from /proc/stat over 0.5 s)
    spin-short    OMP_WAIT_POLICY unset, GOMP_SPINCOUNT=10000: spin briefly, then sleep

Target (issue 19): loaded >= 40% of idle steps/s; the old settings gave ~15% (a demo training step
went from ~8 s to ~50 s beside one busy job). Prints a Markdown table (setting, threads idle/loaded,
idle and loaded steps/s, loaded/idle, idle relative to old idle) and writes JSON with --out.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

SETTINGS: dict[str, dict[str, str]] = {
    "old": {},
    "passive": {"OMP_WAIT_POLICY": "PASSIVE"},
    "passive-free": {"OMP_WAIT_POLICY": "PASSIVE"},
    "spin-short": {"GOMP_SPINCOUNT": "10000"},
}
OPENMP_KEYS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OMP_NUM_THREADS")
SPIN = "while True:\n    pass\n"  # the competitor: one core busy, no threads


def free_cores(seconds: float = 0.5) -> int:
    """Cores this process may use that everything else left idle over `seconds` (core/cpu.py); at least 1."""
    from simplan.core.cpu import idle_cores

    return max(1, round(idle_cores(seconds) or 1))


# ---------------------------------------------------------------------------------------------
# One cell, in its own process
# ---------------------------------------------------------------------------------------------
def worker(args: argparse.Namespace) -> dict[str, Any]:
    threads = free_cores() if args.setting == "passive-free" else args.threads
    import torch

    from simplan.training.config import LoraArguments, ModelArguments
    from simplan.training.lora import load_model_for_training
    from simplan.workflows.pipeline_stages import resolve_base_model

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model, _ = load_model_for_training(ModelArguments(model=resolve_base_model(args.model)), LoraArguments(), False)
    model.train()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    vocab = model.get_input_embeddings().num_embeddings
    batch = torch.randint(0, vocab, (args.batch, args.length))
    times = []
    for _ in range(args.warmup + args.steps):
        t0 = time.perf_counter()
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t0)
    timed = times[args.warmup :]
    return {
        "setting": args.setting,
        "threads": threads,
        "steps_per_s": round(len(timed) / sum(timed), 4),
        "seconds_per_step": round(sum(timed) / len(timed), 2),
        "openmp_env": {k: os.environ[k] for k in OPENMP_KEYS if k in os.environ},
    }


# ---------------------------------------------------------------------------------------------
# The grid
# ---------------------------------------------------------------------------------------------
def run_cell(args: argparse.Namespace, setting: str, loaded: bool) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k not in OPENMP_KEYS}
    env.update(SETTINGS[setting])
    command = [sys.executable, __file__, "--worker", "--setting", setting, "--model", args.model]
    command += ["--threads", str(args.threads), "--steps", str(args.steps), "--warmup", str(args.warmup)]
    command += ["--batch", str(args.batch), "--length", str(args.length)]
    competitor = subprocess.Popen([sys.executable, "-c", SPIN]) if loaded else None
    try:
        if competitor is not None:
            time.sleep(1.0)  # let it take its core before the cell measures free cores
        done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    finally:
        if competitor is not None:
            competitor.kill()
            competitor.wait()
    if done.returncode != 0:
        raise RuntimeError(f"{setting} ({'loaded' if loaded else 'idle'}) failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def table(rows: list[dict[str, Any]]) -> str:
    old_idle = next((r["idle"]["steps_per_s"] for r in rows if r["setting"] == "old"), None)
    lines = [
        "| setting | threads idle/loaded | idle steps/s | loaded steps/s | loaded/idle | idle vs old idle |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        idle, loaded = r["idle"], r["loaded"]
        vs_old = f"{idle['steps_per_s'] / old_idle:.2f}x" if old_idle else "-"
        lines.append(
            f"| {r['setting']} | {idle['threads']}/{loaded['threads']} | {idle['steps_per_s']:.3f} | "
            f"{loaded['steps_per_s']:.3f} | {100 * r['loaded_share']:.0f}% | {vs_old} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m-instruct", help="registry name, HF folder, or tiny-llama")
    p.add_argument("--settings", default=",".join(SETTINGS), help=f"comma-separated, of {', '.join(SETTINGS)}")
    p.add_argument("--threads", type=int, default=2, help="torch threads of the fixed-thread settings")
    p.add_argument("--steps", type=int, default=5, help="timed optimizer steps per cell")
    p.add_argument("--warmup", type=int, default=1, help="untimed steps first")
    p.add_argument("--batch", type=int, default=4, help="sequences per step (the demo recipes: 4)")
    p.add_argument("--length", type=int, default=512, help="tokens per sequence")
    p.add_argument("--out", default="", help="write the results as JSON here")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--setting", default="old", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args)), flush=True)
        return 0
    settings = [s for s in args.settings.split(",") if s]
    unknown = sorted(set(settings) - set(SETTINGS))
    if unknown:
        p.error(f"--settings: unknown {unknown}; choose from {', '.join(SETTINGS)}")
    rows = []
    for setting in settings:
        idle = run_cell(args, setting, loaded=False)
        loaded = run_cell(args, setting, loaded=True)
        share = loaded["steps_per_s"] / idle["steps_per_s"]
        rows.append({"setting": setting, "idle": idle, "loaded": loaded, "loaded_share": round(share, 3)})
        print(
            f"{setting}: idle {idle['seconds_per_step']} s/step, loaded {loaded['seconds_per_step']} s/step",
            flush=True,
        )
    print(f"\nmodel {args.model}, batch {args.batch} x {args.length} tokens, {len(os.sched_getaffinity(0))} cores\n")
    print(table(rows))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({"args": vars(args), "rows": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
