"""Which similarity should the expectation-mismatch pivot use? Token F1 against model embeddings, on traces.

    .venv/bin/python bench/bench_mismatch_similarity.py --runs runs/eval/twx-dev --model smollm2-135m-instruct \
        --adapters simulator=runs/train/simulator/adapter --out runs/bench/mismatch

Every real step of the runs that had an expectation (the simulating arms' committed predictions) is one
(expected, observed) pair, labelled by whether its episode failed and whether the step itself failed
(evaluation/mismatch.py). Scored with token F1 and difflib's ratio (core/text.py), and with the cosine of
mean-pooled last hidden states of the base model and of each adapter given (the engine's `embed`, hf). Prints
and writes (OUT/mismatch.json, OUT/mismatch.md) each method's AUROC for both labels and its firing at the
pivot's threshold, and at the threshold that fires as often as token F1 at 0.75 (the default).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from simplan.core.io import write_json, write_text
from simplan.evaluation.mismatch import embedding_similarities, expectation_pairs, mismatch_table, text_similarities
from simplan.inference.engines import make_engine
from simplan.inference.engines.config import parse_adapters


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", required=True, help="eval run folders, comma-separated")
    ap.add_argument("--arms", default="", help="only these arms (comma-separated; default: all)")
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--adapters", default="", help="name=DIR,...: also embed with each adapter")
    ap.add_argument("--threshold", type=float, default=0.75, help="token F1 threshold (the pivot's default)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    arms = [a for a in args.arms.split(",") if a] or None
    pairs = expectation_pairs([r for r in args.runs.split(",") if r], arms)
    if not pairs:
        raise SystemExit("no act event with an expectation in these runs: evaluate a simulating arm")
    sims = {"token_f1": text_similarities(pairs, "token_f1"), "ratio": text_similarities(pairs, "ratio")}
    seconds = {}
    adapters = parse_adapters(args.adapters)
    engine = make_engine("hf", args.model, adapters, dtype="bfloat16", threads=args.threads)
    for name in [None, *adapters]:
        t0 = time.perf_counter()
        key = f"embedding[{name or 'base'}]"
        sims[key] = embedding_similarities(pairs, engine, adapter=name)
        seconds[key] = round(time.perf_counter() - t0, 1)
    table = mismatch_table(pairs, sims, {"token_f1": args.threshold, "ratio": args.threshold})
    out = Path(args.out)
    write_json(out / "mismatch.json", {"runs": args.runs, "pairs": len(pairs), "seconds": seconds, "table": table})
    cols = ["auroc_episode_failed", "auroc_step_failed", "threshold", "fires", "fire_rate"]
    cols += ["fired_on_failing_episode", "fired_on_failed_step", "quiet_on_failed_step"]
    lines = [f"| method | {' | '.join(cols)} |", "|---" * (len(cols) + 1) + "|"]
    for name, row in table.items():
        cells = [
            "-" if row[c] is None else (f"{row[c]:.3f}" if isinstance(row[c], float) else str(row[c])) for c in cols
        ]
        lines.append(f"| {name} | {' | '.join(cells)} |")
    failing = sum(p.episode_failed for p in pairs)
    head = f"{len(pairs)} pairs ({failing} in failing episodes, {sum(p.step_failed for p in pairs)} failed steps)"
    write_text(out / "mismatch.md", head + "\n\n" + "\n".join(lines) + "\n")
    print(head)
    print("\n".join(lines))
    print(json.dumps(seconds))


if __name__ == "__main__":
    main()
