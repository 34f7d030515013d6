"""Decoding on the hf engine with the growing KV cache vs transformers' DynamicCache, side by side.

    .venv/bin/python bench/bench_kv_cache.py                          # SmolLM2-135M, 8 x 1500 tokens, 48 new
    .venv/bin/python bench/bench_kv_cache.py --batch 6 --length 2500 --new 64 --dtype bfloat16 --out kv.json

DynamicCache appends every decoded token by `torch.cat` of each layer's whole keys and values (30 layers x 2
copies of O(prompt length) per token); `HFPeftEngine.growing_kv` decodes into preallocated buffers instead
(inference/engines/kv_cache.py). One engine, one greedy batch of B prompts of about L tokens each (distinct
rows, no sessions: the plain generate path), N new tokens; the two settings alternate over the repeats (the
fastest of each counts) after one warm-up each, and the generated token ids must be identical. Sized to run in
about 2 minutes on 2 CPU cores.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

TEXT = (
    "The expedition reached the old lighthouse at dusk. Its keeper had left a ledger on the table, listing "
    "every ship that passed the cape for forty years, the weather of each day and the lamp oil burned. "
)


def prompts(tokenizer, batch: int, length: int) -> list[str]:
    """`batch` distinct prompts of about `length` tokens (re-tokenizing the cut text may shift it by a token)."""
    base = tokenizer(TEXT * (length // 20 + 2))["input_ids"]
    out = []
    for i in range(batch):
        head = f"Log {i}: "
        ids = tokenizer(head)["input_ids"] + base[: max(1, length - 12)]
        out.append(tokenizer.decode(ids) + "\nContinue the ledger:")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m-instruct", help="model name or folder (as resolve_model reads)")
    p.add_argument("--batch", type=int, default=8, help="prompts decoded together (B)")
    p.add_argument("--length", type=int, default=1500, help="tokens per prompt (L)")
    p.add_argument("--new", type=int, default=48, help="new tokens per prompt (N, greedy)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default="", help="also write the numbers as JSON here")
    args = p.parse_args(argv)

    from simplan.inference.engines.base import GenerationRequest
    from simplan.inference.engines.hf_peft import HFPeftEngine

    engine = HFPeftEngine(
        args.model, dtype=args.dtype, threads=args.threads, batch_size=args.batch, prefix_cache_sessions=0
    )
    if not engine.growing_kv:
        print(f"bench_kv_cache: {args.model}'s cache is not a plain DynamicCache: nothing to compare", file=sys.stderr)
        return 2
    requests = [
        GenerationRequest(prompt=text, max_tokens=args.new, temperature=0.0)
        for text in prompts(engine.tokenizer, args.batch, args.length)
    ]
    prompt_tokens = [len(engine.tokenizer(r.prompt)["input_ids"]) for r in requests]

    def run(growing: bool) -> tuple[float, list[list[int]]]:
        engine.growing_kv = growing
        start = time.perf_counter()
        results = engine.generate(requests)
        return time.perf_counter() - start, [c.token_ids for r in results for c in r.completions]

    settings = {"growing": True, "dynamic": False}
    ids = {name: run(growing)[1] for name, growing in settings.items()}  # warm-up
    seconds: dict[str, list[float]] = {name: [] for name in settings}
    for _ in range(args.repeats):
        for name, growing in settings.items():
            t, got = run(growing)
            seconds[name].append(t)
            if got != ids[name]:
                print(f"bench_kv_cache: {name} gave different ids across repeats", file=sys.stderr)
                return 1
    if ids["growing"] != ids["dynamic"]:
        print("bench_kv_cache: the growing cache generated other token ids than DynamicCache", file=sys.stderr)
        return 1
    generated = sum(len(t) for t in ids["growing"])
    best = {name: min(s) for name, s in seconds.items()}
    report = {
        "model": args.model,
        "batch": args.batch,
        "prompt_tokens": [min(prompt_tokens), max(prompt_tokens)],
        "new_tokens": generated,
        "seconds": seconds,
        "tokens_per_s": {name: generated / s for name, s in best.items()},
        "speedup": best["dynamic"] / best["growing"],
    }
    lengths = f"{min(prompt_tokens)}-{max(prompt_tokens)}"
    print(f"B={args.batch} prompts of {lengths} tokens, {generated} new tokens (ids identical)")
    for name in settings:
        rate = report["tokens_per_s"][name]
        print(f"  {name:8s} best {best[name]:7.2f}s  {rate:8.1f} tokens/s  all {[round(t, 2) for t in seconds[name]]}")
    print(f"  growing / dynamic speed: x{report['speedup']:.2f}")
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    engine.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
