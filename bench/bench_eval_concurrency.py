"""Concurrent vs sequential episode throughput of `simplan eval` on the same engine, side by side.

    python bench/bench_eval_concurrency.py                                   # hf + tiny model, toy env
    python bench/bench_eval_concurrency.py --model smollm2-135m-instruct --suite twx-dev-small \\
        --episodes 1 --max-steps 10 --concurrency 8 --dtype bfloat16 --threads 2

Loads ONE engine, then runs the same suite twice through `simplan.evaluation.runner`:
sequential (1 episode at a time, no batching) and concurrent (`--concurrency` episodes whose model
calls merge into batched engine calls). Decoding is greedy, so both runs play the same episodes;
the table shows wall time, episodes per minute, engine calls, and model tokens per second.
Without adapters the planner uses the base model for both roles. Results: bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")


def run_mode(engine, args, out: Path, concurrency: int, batching: bool) -> dict:
    from simplan.evaluation.metrics import aggregate, load_run
    from simplan.evaluation.runner import EvalConfig, evaluate

    planner = {
        "max_history": 4,
        "prompt_budget": args.prompt_budget,
        "simulator_max_tokens": args.simulator_max_tokens,
        "decider_max_tokens": 16,
    }
    if not args.adapters:
        planner.update(decider_adapter="", simulator_adapter="")
    cfg = EvalConfig(
        suite=args.suite,
        arms=args.arms.split(","),
        episodes=args.episodes,
        max_steps=args.max_steps,
        out=str(out),
        planner=planner,
        batching=batching,
        progress=True,
        fresh=True,
    )
    calls0 = engine.usage.calls
    t0 = time.perf_counter()
    outcome = evaluate(cfg, engine, concurrency=concurrency)
    wall = time.perf_counter() - t0
    records = load_run(out)
    tokens = sum(r.summary.total_tokens for r in records)
    arms = {m.arm: f"{m.successes}/{m.episodes}" for m in aggregate(records)}
    return {
        "mode": f"concurrent x{concurrency}" if concurrency > 1 else "sequential",
        "episodes": outcome.ran,
        "wall_s": round(wall, 2),
        "episodes_per_min": round(60 * outcome.ran / wall, 2),
        "engine_calls": engine.usage.calls - calls0,
        "episode_calls": sum(r.summary.model_calls for r in records),
        "tokens": tokens,
        "tokens_per_s": round(tokens / wall, 1),
        "successes": arms,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--engine", default="hf", help="engine kind (hf | vllm | openai)")
    p.add_argument("--model", default="tiny-llama", help="model name/folder; tiny-llama = tiny random model")
    p.add_argument("--adapters", default="", help="decider=DIR,simulator=DIR (default: base model for both)")
    p.add_argument("--suite", default="toy-dev")
    p.add_argument("--arms", default="reactive,plan,simplan")
    p.add_argument("--episodes", type=int, default=4, help="tasks per family")
    p.add_argument("--max-steps", type=int, default=8)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--prompt-budget", type=int, default=512)
    p.add_argument("--simulator-max-tokens", type=int, default=24)
    p.add_argument("--out", default="", help="write the JSON results here too")
    args = p.parse_args(argv)

    from simplan.inference.engines import make_engine
    from simplan.workflows.pipeline_stages import resolve_base_model

    model = resolve_base_model(args.model)
    opts = {"dtype": args.dtype, "threads": args.threads} if args.engine != "openai" else {}
    engine = make_engine(args.engine, model, args.adapters or None, **opts)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        rows.append(run_mode(engine, args, Path(tmp) / "seq", 1, batching=False))
        rows.append(run_mode(engine, args, Path(tmp) / "conc", args.concurrency, batching=True))
    engine.close()
    speedup = rows[0]["wall_s"] / rows[1]["wall_s"]
    cmd = "python bench/bench_eval_concurrency.py " + " ".join(argv if argv is not None else sys.argv[1:])
    print(f"\n`{cmd.strip()}` ({args.engine}, {args.model}, suite {args.suite}, threads {args.threads})\n")
    print("| mode | episodes | wall s | episodes/min | engine calls | episode calls | tokens/s | successes |")
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    for r in rows:
        print(
            f"| {r['mode']} | {r['episodes']} | {r['wall_s']} | {r['episodes_per_min']} | {r['engine_calls']} | "
            f"{r['episode_calls']} | {r['tokens_per_s']} | {r['successes']} |"
        )
    print(f"\nconcurrent / sequential throughput: {speedup:.2f}x")
    if args.out:
        Path(args.out).write_text(json.dumps({"args": vars(args), "rows": rows, "speedup": speedup}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
