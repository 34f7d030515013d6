"""The planning loop's own overhead: wall time outside engine calls and env steps, as a share of episode time.

Target: under 5% (issue 4). Overhead = episode wall time - time inside engine calls - time inside
env.reset/step, so it is everything the loop adds: prompt rendering and token budgeting,
parsing, judging, pivot rules, cache look-ups and trace events.

    # scripted engine (toy oracle) that sleeps like a model: per call + per completion token
    OMP_NUM_THREADS=1 .venv/bin/python bench/bench_loop_overhead.py --engine scripted --latency 0.02 \\
        --token-latency 0.002 --episodes 10 --tokenizer smollm2-135m-instruct
    # a real engine (transformers + peft on the CPU), SmolLM2 base model as decider and simulator
    OMP_NUM_THREADS=1 .venv/bin/python bench/bench_loop_overhead.py --engine hf --model smollm2-135m-instruct \\
        --episodes 1 --max-steps 4 --horizon 2 --simulator-max-tokens 24

With `--tokenizer` the scripted run counts prompt tokens with that model's chat template (what a
real engine costs the loop); without it a 4-characters-per-token estimate is used.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any

from tqdm import tqdm

from simplan.envs.toy import ToyEnv
from simplan.evaluation.runner import ARMS  # the default comparison (the router arm needs an accuracy table)
from simplan.inference.engines.scripted import ScriptedEngine, ToyOracle
from simplan.inference.planning.planner import Planner, PlannerConfig


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--engine", default="scripted", choices=["scripted", "hf", "vllm"])
    p.add_argument("--model", default="smollm2-135m-instruct", help="hf/vllm: base model")
    p.add_argument("--adapters", default="", help="hf/vllm: decider=DIR,simulator=DIR (empty: base model)")
    p.add_argument("--arms", default=",".join(ARMS))
    p.add_argument("--episodes", type=int, default=10, help="toy dev tasks per arm")
    p.add_argument("--max-steps", type=int, default=20)
    p.add_argument("--horizon", type=int, default=None, help="override the arms' horizon H")
    p.add_argument("--simulator-max-tokens", type=int, default=128, help="max new tokens of a prediction")
    p.add_argument("--latency", type=float, default=0.02, help="scripted: seconds per engine call")
    p.add_argument("--token-latency", type=float, default=0.002, help="scripted: seconds per completion token")
    p.add_argument("--tokenizer", default="", help="scripted: count prompt tokens with this model's tokenizer")
    p.add_argument("--threads", type=int, default=1, help="hf: torch threads")
    p.add_argument("--out", default="", help="write the numbers as JSON here")
    return p.parse_args(argv)


def make_engine(args: argparse.Namespace) -> tuple[Any, Any]:
    """(engine or None for per-task scripted engines, tokenizer or None)."""
    if args.engine == "scripted":
        tokenizer = None
        if args.tokenizer:
            from simplan.models.registry import load_tokenizer, resolve_model

            tokenizer = load_tokenizer(resolve_model(args.tokenizer))
        return None, tokenizer
    from simplan.inference.engines import make_engine as build

    opts: dict[str, Any] = {"threads": args.threads} if args.engine == "hf" else {}
    return build(args.engine, args.model, args.adapters or None, **opts), None


def bench(args: argparse.Namespace) -> dict[str, Any]:
    shared, tokenizer = make_engine(args)
    env = ToyEnv()
    tasks = env.tasks("dev", limit=args.episodes)
    rows = {}
    for arm in args.arms.split(","):
        overrides: dict[str, Any] = {
            "max_steps": args.max_steps,
            "max_history": 50,
            "simulator_max_tokens": args.simulator_max_tokens,
        }
        if args.horizon is not None and arm != "reactive":
            overrides["horizon"] = args.horizon
        if shared is not None and not args.adapters:
            overrides.update(decider_adapter="", simulator_adapter="")
        cfg = PlannerConfig.from_dict({"arm": arm, **overrides})
        wall = engine = env_s = planning = 0.0
        steps = calls = 0
        shares = []
        for task in tqdm(tasks, desc=arm, file=sys.stderr):
            if shared is None:
                oracle = ToyOracle(task, confidence=1.0)
                eng = ScriptedEngine(
                    oracle.decide,
                    oracle.simulate,
                    oracle.score,
                    latency=args.latency,
                    token_latency=args.token_latency,
                )
            else:
                eng = shared
            result = Planner(eng, env, cfg, tokenizer=tokenizer).run(task)
            end = result.trace.end
            overhead = end.wall_seconds - end.engine_seconds - end.env_seconds
            shares.append(overhead / end.wall_seconds)
            wall += end.wall_seconds
            engine += end.engine_seconds
            env_s += end.env_seconds
            planning += end.planning_seconds
            steps += end.steps
            calls += end.model_calls
        overhead = wall - engine - env_s
        rows[arm] = {
            "episodes": len(tasks),
            "steps": steps,
            "model_calls": calls,
            "wall_s": round(wall, 3),
            "engine_s": round(engine, 3),
            "env_s": round(env_s, 4),
            "overhead_s": round(overhead, 4),
            "overhead_share": round(overhead / wall, 4),
            "overhead_share_max_episode": round(max(shares), 4),
            "overhead_ms_per_step": round(1000 * overhead / max(steps, 1), 3),
            "overhead_ms_per_call": round(1000 * overhead / max(calls, 1), 3),
            "planning_share": round(planning / wall, 4),
        }
    if shared is not None:
        shared.close()
    return rows


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    t0 = time.perf_counter()
    rows = bench(args)
    print(
        f"loop overhead, engine={args.engine}, {args.episodes} toy episodes per arm ({time.perf_counter() - t0:.1f}s)"
    )
    cols = [
        "steps",
        "model_calls",
        "wall_s",
        "engine_s",
        "overhead_share",
        "overhead_ms_per_step",
        "overhead_ms_per_call",
    ]
    print("| arm | " + " | ".join(cols) + " |")
    print("|---" * (len(cols) + 1) + "|")
    for arm, row in rows.items():
        print(f"| {arm} | " + " | ".join(str(row[c]) for c in cols) + " |")
    worst = max(r["overhead_share"] for r in rows.values())
    print(
        f"worst arm overhead share: {worst:.2%} (target < 5%); median over arms "
        f"{statistics.median(r['overhead_share'] for r in rows.values()):.2%}"
    )
    if args.out:
        from simplan.core.io import write_json

        write_json(args.out, {"args": vars(args), "arms": rows})
    return 0 if worst < 0.05 else 1


if __name__ == "__main__":
    sys.exit(main())
