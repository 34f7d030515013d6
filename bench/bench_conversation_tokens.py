"""Training tokens per epoch and decider prompt tokens per step: per-step prompts vs one conversation per episode.

    .venv/bin/simplan collect --config recipes/collect/twx-train.yaml --limit 12 --out runs/data/twx-train.jsonl
    .venv/bin/python bench/bench_conversation_tokens.py --inputs runs/data/twx-train.jsonl --budget 640

Builds the decider and simulator datasets from the same trajectories in both formats (`simplan
build --format step|conversation`, same budget, SmolLM2's tokenizer) and counts, on the train fold:
- tokens per epoch: what the trainer reads, prompt + completion per step row, the whole sequence per
  conversation window (the chat template included in both);
- trained tokens: completion tokens (EOS included) that carry loss;
- decider prompt tokens per real step as the planner renders them: the whole prompt, and the tokens
  new since the previous step's prompt of the same window (what a prefix cache has to prefill;
  a new window prefills all of it).
Counts only: deterministic, independent of the machine's load.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from simplan.data.build import BuildConfig, build
from simplan.data.build_rows import step_rows


def _tokenizer(model: str):
    if model == "smollm2":
        from simplan.models.tiny import _tokenizer as smollm2_tokenizer  # SmolLM2's, read from the GGUF

        return smollm2_tokenizer()
    from simplan.models.registry import load_tokenizer

    return load_tokenizer(model)


def measure(inputs: list[str], budget: int, tokenizer, out: Path) -> dict:
    from datasets import load_from_disk

    results: dict = {}
    for role in ("decider", "simulator"):
        for fmt in ("step", "conversation"):
            folder = out / f"{role}-{fmt}"
            cfg = BuildConfig(
                role=role,
                format=fmt,
                inputs=inputs,
                out=str(folder),
                max_prompt_tokens=budget,
                max_history=4,
                progress=False,
                keep_going=True,
            )
            stats = build(cfg, tokenizer=tokenizer).stats
            train = load_from_disk(str(folder / "dataset"))["train"].to_list()
            total = sum(r["prompt_tokens"] + (r["completion_tokens"] if fmt == "step" else 0) for r in train)
            entry = {
                "rows": len(train),
                "tokens_per_epoch": total,
                "trained_tokens": sum(r["completion_tokens"] for r in train),
                "trained_turns": sum(len(step_rows(r)) for r in train),
            }
            if role == "decider":
                entry |= _prompt_tokens(train, fmt, tokenizer)
            results[f"{role}/{fmt}"] = entry
            results.setdefault("dropped", {})[f"{role}/{fmt}"] = stats["dropped"]
    return results


def _prompt_tokens(rows: list[dict], fmt: str, tokenizer) -> dict:
    """Decider prompt tokens per trained step: whole prompt, and new since the previous step of its window."""
    from simplan.data.format import chat_batch_token_counter

    count = chat_batch_token_counter(tokenizer, add_generation_prompt=True)
    whole, new = 0, 0
    n = 0
    for row in rows:
        prompts = [s["prompt"] for s in step_rows(row)]
        if fmt == "step":
            counts = count(prompts)
            whole += sum(counts)
            new += sum(counts)
        else:  # prefixes of one sequence: each step adds what follows the previous step's prompt
            counts = count(prompts)
            whole += sum(counts)
            new += counts[0] + sum(b - a for a, b in zip(counts, counts[1:]))
        n += len(prompts)
    return {
        "prompt_tokens_per_step": round(whole / max(n, 1), 1),
        "new_prompt_tokens_per_step": round(new / max(n, 1), 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--inputs", required=True, help="trajectory JSONL files, comma-separated")
    ap.add_argument("--budget", type=int, default=640, help="max_prompt_tokens of both builds")
    ap.add_argument("--model", default="smollm2", help="tokenizer: smollm2 (from the GGUF) or a model name/folder")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        results = measure(args.inputs.split(","), args.budget, _tokenizer(args.model), Path(tmp))
    print(json.dumps(results, indent=2))
    for role in ("decider", "simulator"):
        step, conv = results[f"{role}/step"], results[f"{role}/conversation"]
        ratio = step["tokens_per_epoch"] / max(conv["tokens_per_epoch"], 1)
        print(
            f"{role}: {step['tokens_per_epoch']:,} tokens/epoch per step vs {conv['tokens_per_epoch']:,} "
            f"as conversations ({ratio:.2f}x fewer); trained turns {step['trained_turns']} vs {conv['trained_turns']}"
        )


if __name__ == "__main__":
    main()
