"""Engine throughput: the three backends on the same batch of planner-like requests, side by side.

    .venv/bin/python bench/bench_engines.py                                   # SmolLM2 + random adapters
    .venv/bin/python bench/bench_engines.py --adapters decider=runs/d/adapter,simulator=runs/s/adapter
    .venv/bin/python bench/bench_engines.py --backends hf,vllm --dtype bfloat16 --out bench/engines.json

The batch mixes decider requests (K candidate actions sampled, as the planner's imagine step does)
and simulator requests (greedy next observation), on prompts built by data/format.py from a
TextWorld-like state. Without --adapters, random-init rank-16 LoRA adapters on all linear layers
are made in a temp folder (same cost as trained ones). Each backend gets one warm-up call; the
timed call is one `generate` over the whole batch, then one `score` over the valid actions.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

GOAL = "Your task is to find the key and unlock the chest in the attic."
OBSERVATION = (
    "You are in the kitchen. In one part of the room you see a fridge that is closed. There is also a "
    "counter, that has a knife and a red apple on it. To the north you see a door to the hallway."
)
VALID = ["go north", "open fridge", "take knife", "take red apple", "look around", "inventory", "eat red apple"]
PAST = [("go west", "You are in the hallway. A staircase leads up."), ("go east", OBSERVATION)]


def planner_requests(n_decider: int, n_simulator: int, k: int, max_tokens: int):
    from simplan.data.format import decider_messages, simulator_messages, state_from_steps
    from simplan.envs.base import Action
    from simplan.inference.engines.base import GenerationRequest

    past = [(Action(text=a), o, False) for a, o in PAST]
    reqs = []
    for i in range(n_decider):
        state = state_from_steps(GOAL, OBSERVATION + f" (turn {i})", past, valid_actions=VALID)
        reqs.append(
            GenerationRequest(
                adapter="decider",
                messages=decider_messages(state),
                n=k,
                temperature=0.8,
                max_tokens=max_tokens,
                seed=i,
            )
        )
    for i in range(n_simulator):
        state = state_from_steps(GOAL, OBSERVATION + f" (turn {i})", past, valid_actions=VALID)
        msgs = simulator_messages(state, Action(text=VALID[i % len(VALID)]))
        reqs.append(GenerationRequest(adapter="simulator", messages=msgs, max_tokens=max_tokens))
    return reqs


def score_requests(n: int):
    from simplan.data.format import decider_messages, state_from_steps
    from simplan.inference.engines.base import ScoreRequest

    return [
        ScoreRequest(
            candidates=VALID,
            adapter="decider",
            messages=decider_messages(state_from_steps(GOAL, OBSERVATION + f" (turn {i})", valid_actions=VALID)),
        )
        for i in range(n)
    ]


def random_adapters(model_path: str, out: Path, rank: int = 16) -> dict[str, str]:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    adapters = {}
    for seed, name in enumerate(("decider", "simulator")):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
        cfg = LoraConfig(r=rank, lora_alpha=2 * rank, target_modules="all-linear", task_type="CAUSAL_LM")
        peft_model = get_peft_model(model, cfg)
        with torch.no_grad():
            for pname, p in peft_model.named_parameters():
                if "lora_B" in pname:
                    p.normal_(0.0, 0.01)  # peft starts B at zero (adapter == base); make it do work
        peft_model.save_pretrained(out / name)
        adapters[name] = str(out / name)
    return adapters


def run_backend(kind: str, engine, args) -> dict:
    reqs = planner_requests(args.decider, args.simulator, args.k, args.max_tokens)
    engine.generate(reqs[:1])  # warm-up (first LoRA load, kernels)
    start = time.perf_counter()
    results = engine.generate(reqs)
    wall = time.perf_counter() - start
    prompt = sum(r.prompt_tokens for r in results)
    gen = sum(r.completion_tokens for r in results)
    sreqs = score_requests(args.score)
    s0 = time.perf_counter()
    engine.score(sreqs)
    score_wall = time.perf_counter() - s0
    return {
        "backend": kind,
        "requests": len(reqs),
        "sequences": sum(r.n for r in reqs),
        "prompt_tokens": prompt,
        "generated_tokens": gen,
        "generate_s": round(wall, 2),
        "gen_tok_per_s": round(gen / wall, 1),
        "score_requests": len(sreqs),
        "score_rows": sum(len(r.candidates) for r in sreqs),
        "score_s": round(score_wall, 2),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--adapters", default="", help="name=DIR,... (decider and simulator); default: random adapters")
    p.add_argument("--backends", default="hf,vllm,openai")
    p.add_argument("--dtype", default="auto", help="auto: bf16 where the CPU has it natively, else fp32")
    p.add_argument("--threads", type=int, default=None, help="CPU threads (default: all cores)")
    p.add_argument("--decider", type=int, default=8, help="decider requests (each samples --k actions)")
    p.add_argument("--simulator", type=int, default=8, help="simulator requests (greedy)")
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--score", type=int, default=8, help="score requests over the valid actions")
    p.add_argument("--enforce-eager", action="store_true", help="vLLM without torch.compile (faster start)")
    p.add_argument("--port", type=int, default=8011)
    p.add_argument("--out", default="", help="write the rows as JSON here")
    args = p.parse_args(argv)

    from simplan.core.io import write_json
    from simplan.inference.engines import make_engine, parse_adapters
    from simplan.inference.serving.server import ServeConfig, start_server
    from simplan.models.registry import resolve_model

    model_path = resolve_model(args.model)
    tmp = tempfile.TemporaryDirectory(prefix="bench-adapters-")
    adapters = parse_adapters(args.adapters) or random_adapters(model_path, Path(tmp.name))
    rows = []
    for kind in [b.strip() for b in args.backends.split(",") if b.strip()]:
        print(f"bench: {kind} ...", file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        server = None
        if kind == "hf":
            engine = make_engine("hf", model_path, adapters, dtype=args.dtype, threads=args.threads)
        elif kind == "vllm":
            engine = make_engine(
                "vllm", model_path, adapters, dtype=args.dtype, threads=args.threads, enforce_eager=args.enforce_eager
            )
        elif kind == "openai":
            cfg = ServeConfig(
                model=model_path,
                adapters=",".join(f"{k}={v}" for k, v in adapters.items()),
                port=args.port,
                dtype=args.dtype,
                threads=args.threads,
                enforce_eager=args.enforce_eager,
            )
            server = start_server(cfg, log_file=Path(tmp.name) / "server.log")
            engine = make_engine("openai", model_path, list(adapters), base_url=server.base_url)
        else:
            raise SystemExit(f"--backends: unknown backend {kind!r} (hf, vllm, openai)")
        startup = time.perf_counter() - t0
        try:
            row = run_backend(kind, engine, args)
        finally:
            engine.close()
            if server is not None:
                server.stop()
        row["startup_s"] = round(startup, 1)
        rows.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)
    cols = ["backend", "startup_s", "sequences", "prompt_tokens", "generated_tokens", "generate_s", "gen_tok_per_s"]
    cols += ["score_rows", "score_s"]
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for row in rows:
        print("| " + " | ".join(str(row[c]) for c in cols) + " |")
    meta = {k: v for k, v in vars(args).items() if k != "out"}
    meta.update(cpu_count=os.cpu_count(), adapters="given" if args.adapters else "random rank-16")
    if args.out:
        write_json(args.out, {"config": meta, "rows": rows})
    tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
