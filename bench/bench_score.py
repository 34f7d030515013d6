"""Scoring valid actions on the hf backend: one token tree over the shared prompt vs one full row each.

    .venv/bin/python bench/bench_score.py --dataset runs/pipeline/twx-s10/datasets/decider \\
        --adapter runs/train/s10-decider-r64-640/adapter --rows 12 --threads 2

The planner's decider (`propose: score`) and `eval-model --decode choices` score every valid action
of a state: one `ScoreRequest` per state. `HFPeftEngine` runs the prompt once and all candidates as
one token trie over its KV cache (`shared_prefix_scoring`, the default); the reference runs every
candidate as its own prompt + candidate row (`shared_prefix_scoring=False`). Both run here on the
same engine, on real decider prompts of a built dataset (rows spread over its task families), in
interleaved repeats (fastest of each counts), and the report says how often the two pick the same
best action and how far their logprobs are apart (float rounding only; bf16 moves more than fp32).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", required=True, help="decider dataset folder from `simplan build`")
    p.add_argument("--fold", default="dev")
    p.add_argument("--rows", type=int, default=12, help="states to score, spread over the task families")
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--adapter", default="", help="decider adapter folder ('' = the base model)")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--out", default="", help="also write the numbers as JSON here")
    args = p.parse_args(argv)

    from simplan.evaluation.offline import EvalModelConfig, _load_rows
    from simplan.inference.engines.base import ScoreRequest
    from simplan.inference.engines.common import score_rows
    from simplan.inference.engines.hf_peft import HFPeftEngine
    from simplan.inference.engines.token_trie import token_trie

    rows, _ = _load_rows(EvalModelConfig(role="decider", dataset=args.dataset, fold=args.fold, limit=args.rows))
    rows = [r for r in rows if r.get("valid_actions")]
    if not rows:
        print(f"bench_score: no row of {args.dataset} ({args.fold}) lists valid actions", file=sys.stderr)
        return 2
    adapter = "decider" if args.adapter else None
    engine = HFPeftEngine(
        args.model, {"decider": args.adapter} if args.adapter else None, dtype=args.dtype, threads=args.threads
    )
    requests = [ScoreRequest(candidates=list(r["valid_actions"]), adapter=adapter, messages=r["prompt"]) for r in rows]
    score, lengths = score_rows(engine.tokenizer, requests)
    tails = [[row.ids[row.start :] for row in score if row.request == i] for i in range(len(requests))]
    trie_nodes = sum(len(token_trie(t)[0]) for t in tails)
    candidate_tokens = sum(len(x) for t in tails for x in t)

    engine.score(requests[:1])  # warm-up (first-call allocations)
    seconds = {"tree": [], "rows": []}
    results = {}
    for _ in range(args.repeats):
        for mode in ("tree", "rows"):
            engine.shared_prefix_scoring = mode == "tree"
            started = time.perf_counter()
            results[mode] = engine.score(requests)
            seconds[mode].append(time.perf_counter() - started)
    best = {m: min(s) for m, s in seconds.items()}

    def argmax(values: list[float]) -> int:
        return max(range(len(values)), key=values.__getitem__)

    same = sum(argmax(t.logprobs) == argmax(r.logprobs) for t, r in zip(results["tree"], results["rows"]))
    diff = max(abs(a - b) for t, r in zip(results["tree"], results["rows"]) for a, b in zip(t.logprobs, r.logprobs))
    report = {
        "model": args.model,
        "adapter": args.adapter or None,
        "dtype": args.dtype,
        "threads": args.threads,
        "states": len(requests),
        "candidates": sum(len(r.candidates) for r in requests),
        "prompt_tokens_mean": round(sum(lengths) / len(lengths)),
        "candidate_tokens": candidate_tokens,
        "trie_nodes": trie_nodes,
        "tree_s": round(best["tree"], 2),
        "rows_s": round(best["rows"], 2),
        "speedup": round(best["rows"] / best["tree"], 1),
        "same_best_action": f"{same}/{len(requests)}",
        "max_abs_logprob_diff": round(diff, 4),
    }
    print(json.dumps(report, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
