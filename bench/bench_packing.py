"""Branch packing against one sequence per branch: tokens and seconds of forward+backward per labelled outcome.

    OMP_NUM_THREADS=1 .venv/bin/python bench/bench_packing.py                      # SmolLM2-135M, bf16 autocast
    OMP_NUM_THREADS=1 .venv/bin/python bench/bench_packing.py --dtype float32 --prefix 400 --branches 8
    OMP_NUM_THREADS=1 .venv/bin/python bench/bench_packing.py --model tiny         # the tiny random llama

One state (a prefix of `--prefix` tokens) with `--branches` alternatives, each `--action` unlabelled action
tokens and `--reply` labelled reply tokens (random token ids: the cost does not depend on which). The
packed layout is one row [prefix][branch 1]...[branch K] under training/packing.py's tree mask; the other
is K rows prefix + branch in one padded batch (training/examples.py's PaddingCollator). Both run the
trainer's loss (training/completion_trainer.py `completion_loss`, LM head at labelled positions only) and
its backward through a LoRA (r16, all linear layers, dropout 0 so that both compute the same loss); with
bfloat16 the base weights are bf16 under bf16 autocast (the recipes' `dtype: auto` on a CPU with bf16).
The layouts alternate for `--repeats` rounds after one untimed warm-up each, and the median counts. Prints
a Markdown table and the relative gap between the two summed losses (float noise). The tiny model is no
guide to the speed-up: its LM head over 49k words, the same in both layouts, outweighs its two layers.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import time

import torch


def timed_step(model: torch.nn.Module, batch: dict[str, torch.Tensor], bf16: bool) -> tuple[float, float]:
    """Seconds of one forward+backward of the summed token loss, and that loss."""
    from simplan.training.completion_trainer import completion_loss

    model.zero_grad(set_to_none=True)
    start = time.perf_counter()
    with torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext():
        loss = completion_loss(model, batch, 1)
    loss.backward()
    return time.perf_counter() - start, loss.item()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m-instruct", help="registry name, HF folder, or `tiny`")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    p.add_argument("--prefix", type=int, default=400, help="tokens of the shared state")
    p.add_argument("--branches", type=int, default=8, help="alternative actions of the state (K)")
    p.add_argument("--action", type=int, default=8, help="unlabelled action tokens per branch")
    p.add_argument("--reply", type=int, default=22, help="labelled reply tokens per branch")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default="", help="write the results as JSON here")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)

    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from simplan.models.registry import resolve_model
    from simplan.models.tiny import tiny_model
    from simplan.training.examples import IGNORE_INDEX, PaddingCollator
    from simplan.training.lora import linear_module_names
    from simplan.training.packing import BranchCollator, one_by_one, pack_branches

    bf16 = args.dtype == "bfloat16"
    dtype = getattr(torch, args.dtype)
    path = tiny_model("llama") if args.model == "tiny" else resolve_model(args.model)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation="sdpa")
    lora = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules=linear_module_names(model))
    model = get_peft_model(model, lora).train()

    g = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    prefix = torch.randint(0, vocab, (args.prefix,), generator=g).tolist()
    branches = []
    for _ in range(args.branches):
        ids = torch.randint(0, vocab, (args.action + args.reply,), generator=g).tolist()
        branches.append((ids, [IGNORE_INDEX] * args.action + ids[args.action :]))
    pad = model.config.pad_token_id or 0
    batches = {
        "packed": BranchCollator(pad, dtype=dtype)([pack_branches(prefix, branches)]),
        "one by one": PaddingCollator(pad)(one_by_one(prefix, branches)),
    }
    times: dict[str, list[float]] = {name: [] for name in batches}
    losses: dict[str, float] = {}
    for batch in batches.values():
        timed_step(model, batch, bf16)  # warm-up: allocator, one-off kernels
    for _ in range(args.repeats):
        for name, batch in batches.items():
            seconds, losses[name] = timed_step(model, batch, bf16)
            times[name].append(seconds)

    rows = {}
    for name, batch in batches.items():
        tokens = batch["input_ids"].numel()  # no padding in either layout: every branch has the same length
        median = statistics.median(times[name])
        rows[name] = {
            "tokens": tokens,
            "tokens_per_outcome": tokens / args.branches,
            "s_per_outcome": median / args.branches,
            "s_per_step": median,
            "s_per_step_all": times[name],
        }
    gap = abs(losses["packed"] - losses["one by one"]) / abs(losses["one by one"])
    print(
        f"model {args.model}, {args.dtype}, {args.threads} thread(s); prefix {args.prefix}, K={args.branches} "
        f"branches of {args.action} + {args.reply} labelled tokens; median of {args.repeats}\n"
    )
    print("| layout | tokens processed | tokens / outcome | s / outcome (fwd+bwd) | s / step |")
    print("|---|---:|---:|---:|---:|")
    for name, r in rows.items():
        print(
            f"| {name} | {r['tokens']} | {r['tokens_per_outcome']:.0f} | {r['s_per_outcome']:.3f} | "
            f"{r['s_per_step']:.2f} |"
        )
    speedup = rows["one by one"]["s_per_outcome"] / rows["packed"]["s_per_outcome"]
    print(f"\npacked is {speedup:.2f}x faster per outcome; summed losses differ by {gap:.1e} relative")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"args": vars(args), "rows": rows, "speedup": speedup, "loss_gap": gap}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
