"""Peak resident memory of a CPU LoRA training step, and where it goes.

    flock /tmp/heavy.lock .venv/bin/python bench/bench_train_memory.py --dataset /tmp/bt/simulator
    flock /tmp/heavy.lock env MALLOC_ARENA_MAX=2 .venv/bin/python bench/bench_train_memory.py --dataset ...
    flock /tmp/heavy.lock .venv/bin/python bench/bench_train_memory.py --dataset ... --settings 4x1,2x2,1x4,4x1+gc
    .venv/bin/python bench/bench_train_memory.py --model TINY_FOLDER --dataset DATASET --steps 2 --bf16 false

Loads the model with its LoRA as `simplan train` does (training/lora.py), tokenizes the train fold
(training/examples.py) and trains `--steps` steps on the longest batches of `--batch-size` rows (the first
step of a length-grouped run is its longest batch; HF's sampler puts it first on purpose), each step a
forward and backward of the trainer's loss (training/completion_trainer.py `completion_loss`) under bf16
autocast, gradient clipping and an AdamW step, as the Trainer does. For every step it prints the peak resident
memory of the forward, the backward and the optimizer step (VmHWM, reset before each phase through
/proc/self/clear_refs) and what autograd saved for the backward, by part of the model (LM head and loss,
attention, MLP, norms, LoRA and its dropout copies, other), each storage counted once, weights left out.
Settings: `--lm-head-chunk`, `--lora-dropout`, `--gradient-checkpointing`, `--completion-only-logits`, and
allocator variables in the environment (MALLOC_ARENA_MAX, MALLOC_MMAP_THRESHOLD_, ...), which glibc reads at
start-up. Prints a Markdown table and writes JSON with --out.

`--micro-batch N` runs each optimizer step's `--batch-size` rows as micro-batches of N rows, each its own forward
and backward, the loss summed over the step's labelled tokens and divided by their count, as the Trainer's
gradient accumulation does (`num_items_in_batch`): the same gradient with 1/(batch/N) of the activations alive.
`--settings MICROxACCUM[+gc],...` runs each setting in its own process (a fresh heap and peak) on the same
optimizer batches and prints them side by side: peak RSS, seconds per optimizer step, and each step's loss and
gradient norm before clipping (equal up to bf16 rounding, and exactly equal draws only with --lora-dropout 0).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import torch

from simplan.core.memory import peak_reset, rss_mb

MB = 2**20


# ---------------------------------------------------------------------------------------------
# What autograd keeps for the backward, by part of the model
# ---------------------------------------------------------------------------------------------
def part_of(module_path: str) -> str:
    """The part of the model a module belongs to, from its dotted name (peft's names included)."""
    if "lora_dropout" in module_path:
        return "LoRA dropout copies"
    if "lora_" in module_path:
        return "LoRA A/B"
    if "lm_head" in module_path or not module_path:  # outside the model: the loss after the logits
        return "LM head + loss"
    for key, part in (("self_attn", "attention"), ("mlp", "MLP"), ("norm", "norms")):
        if key in module_path:
            return part
    return "other (embeddings, rotary)"


class SavedTensors:
    """Bytes saved for the backward while this is entered, by `part_of` the innermost running module."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.stack: list[str] = []
        self.bytes: Counter = Counter()
        self.seen: set[int] = set()
        self.weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
        self.handles: list[Any] = []

    def __enter__(self) -> SavedTensors:
        for name, module in self.model.named_modules():
            self.handles.append(module.register_forward_pre_hook(lambda m, a, name=name: self.stack.append(name)))
            self.handles.append(module.register_forward_hook(self.leave))
        self.hooks = torch.autograd.graph.saved_tensors_hooks(self.pack, lambda t: t)
        self.hooks.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.hooks.__exit__(*exc)
        for h in self.handles:
            h.remove()

    def leave(self, module: torch.nn.Module, inputs: Any, output: Any) -> None:
        self.stack.pop()  # returns None: a forward hook's return value would replace the module's output

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        key = storage.data_ptr()
        if key not in self.seen and key not in self.weights:
            self.seen.add(key)
            self.bytes[part_of(self.stack[-1] if self.stack else "")] += storage.nbytes()
        return t


# ---------------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------------
def longest_batches(train_ds: Any, batch_size: int, steps: int) -> list[list[dict[str, Any]]]:
    lengths = list(train_ds["length"])
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    return [[train_ds[i] for i in order[s * batch_size : (s + 1) * batch_size]] for s in range(steps)]


def micro_batches(features: list[dict[str, Any]], size: int) -> list[list[dict[str, Any]]]:
    return [features[i : i + size] for i in range(0, len(features), size)]


def run(args: argparse.Namespace) -> dict[str, Any]:
    from transformers import set_seed

    from simplan.models.registry import load_tokenizer
    from simplan.training.completion_trainer import completion_loss
    from simplan.training.config import DataArguments, LoraArguments, ModelArguments
    from simplan.training.examples import PaddingCollator, tokenized_splits
    from simplan.training.lora import load_model_for_training

    torch.set_num_threads(args.threads)
    start_rss = rss_mb()
    tokenizer = load_tokenizer(args.model)
    splits = tokenized_splits(
        DataArguments(dataset=args.dataset, max_length=args.max_length, eval_split=""), tokenizer
    )
    set_seed(0)
    model, _ = load_model_for_training(
        ModelArguments(model=args.model), LoraArguments(lora_dropout=args.lora_dropout), args.bf16
    )
    if args.gradient_checkpointing:
        model.enable_input_require_grads()
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    collate = PaddingCollator(tokenizer.pad_token_id)
    loaded_rss = rss_mb()
    autocast = torch.autocast("cpu", dtype=torch.bfloat16) if args.bf16 else contextlib.nullcontext()
    rows = []
    for features in longest_batches(splits.train, args.batch_size, args.steps):
        batches = [collate(f) for f in micro_batches(features, args.micro_batch or args.batch_size)]
        # the Trainer's num_items_in_batch: labelled next-token targets over the whole accumulated batch
        labelled = sum(int((b["labels"][:, 1:] != -100).sum()) for b in batches)
        began = time.perf_counter()
        loss_sum, forward_peak, backward_peak, saved_parts = 0.0, 0.0, 0.0, Counter()
        for batch in batches:
            peak_reset()
            with SavedTensors(model) as saved, autocast:
                if args.completion_only_logits:
                    loss = completion_loss(model, batch, labelled, lm_head_chunk=args.lm_head_chunk)
                else:
                    loss = model(**batch, use_cache=False).loss / len(batches)
            forward_peak = max(forward_peak, rss_mb("VmHWM"))
            peak_reset()
            loss.backward()
            backward_peak = max(backward_peak, rss_mb("VmHWM"))
            loss_sum += loss.item()
            if sum(saved.bytes.values()) > sum(saved_parts.values()):
                saved_parts = saved.bytes  # the largest micro-batch's: what is alive at the backward's start
            del loss
        peak_reset()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        rows.append(
            {
                "rows": len(features),
                "micro_batches": len(batches),
                "padded_length": max(b["input_ids"].shape[1] for b in batches),
                "tokens": sum(int(b["attention_mask"].sum()) for b in batches),
                "labelled": labelled,
                "loss": round(loss_sum, 5),
                "grad_norm": round(float(grad_norm), 5),
                "forward_peak_mb": round(forward_peak),
                "backward_peak_mb": round(backward_peak),
                "optimizer_peak_mb": round(rss_mb("VmHWM")),
                "rss_after_mb": round(rss_mb()),
                "saved_mb": {k: round(v / MB) for k, v in saved_parts.most_common()},
                "saved_total_mb": round(sum(saved_parts.values()) / MB),
                "seconds": round(time.perf_counter() - began, 2),
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    allocator = {k: v for k, v in os.environ.items() if k.startswith("MALLOC_") or k in ("LD_PRELOAD",)}
    return {
        "start_rss_mb": round(start_rss),
        "loaded_rss_mb": round(loaded_rss),
        "peak_rss_mb": round(max(max(r["forward_peak_mb"], r["backward_peak_mb"]) for r in rows)),
        "steps": rows,
        "allocator_env": allocator,
    }


# ---------------------------------------------------------------------------------------------
# Settings side by side, each in its own process
# ---------------------------------------------------------------------------------------------
def parse_setting(setting: str) -> tuple[int, int, bool]:
    """'2x2' -> (micro-batch 2, accumulation 2, no checkpointing); '4x1+gc' checkpoints."""
    shape, _, extra = setting.partition("+")
    micro, _, accum = shape.partition("x")
    if not (micro.isdigit() and accum.isdigit() and extra in ("", "gc")):
        raise ValueError(f"--settings: {setting!r} is not MICROxACCUM or MICROxACCUM+gc (e.g. 1x4, 4x1+gc)")
    return int(micro), int(accum), extra == "gc"


def compare(args: argparse.Namespace, argv: list[str]) -> dict[str, Any]:
    """Run every setting of --settings in a child process of this script, on the same optimizer batches."""
    settings = [s.strip() for s in args.settings.split(",") if s.strip()]
    shapes = {s: parse_setting(s) for s in settings}
    if len({m * a for m, a, _ in shapes.values()}) != 1:
        raise ValueError(f"--settings: {args.settings!r} mixes optimizer batch sizes; keep MICRO x ACCUM the same")
    passed = [a for i, a in enumerate(argv) if not _is_own_flag(argv, i)]
    results = {}
    for setting, (micro, accum, gc) in shapes.items():
        out = Path(args.out or "bench_train_memory.json").with_suffix(f".{setting.replace('+', '-')}.json")
        cmd = [sys.executable, __file__, *passed, "--batch-size", str(micro * accum), "--micro-batch", str(micro)]
        cmd += ["--out", str(out)] + (["--gradient-checkpointing"] if gc else [])
        print(f"\n## {setting}: {' '.join(cmd[1:])}", flush=True)
        subprocess.run(cmd, check=True)
        results[setting] = json.loads(out.read_text())
    return results


def _is_own_flag(argv: list[str], i: int) -> bool:
    """Flags `compare` sets per child (and their values), which the parent's command line must not repeat."""
    own = ("--settings", "--batch-size", "--micro-batch", "--out", "--gradient-checkpointing")
    if argv[i].split("=")[0] in own:
        return True
    return i > 0 and argv[i - 1] in own[:-1] and "=" not in argv[i - 1]


def print_comparison(results: dict[str, Any]) -> None:
    base = next(iter(results.values()))
    base_s = _seconds_per_step(base)
    print("\n| setting | peak RSS | seconds / optimizer step | vs first | loss per step | grad norm per step |")
    print("|---|---:|---:|---:|---|---|")
    for setting, r in results.items():
        s = _seconds_per_step(r)
        losses = ", ".join(f"{x['loss']:.4f}" for x in r["steps"])
        norms = ", ".join(f"{x['grad_norm']:.4f}" for x in r["steps"])
        print(
            f"| {setting} | {r['peak_rss_mb']:,} MB | {s:.2f} | {s / base_s:.2f}x | {losses} | {norms} |", flush=True
        )


def _seconds_per_step(result: dict[str, Any]) -> float:
    """Mean over the steps after the first (the first also pays one-time allocations), or the one step."""
    seconds = [r["seconds"] for r in result["steps"]]
    return sum(seconds[1:]) / len(seconds[1:]) if len(seconds) > 1 else seconds[0]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--dataset", required=True, help="dataset folder from `simplan build`")
    p.add_argument("--batch-size", type=int, default=4, help="rows per optimizer step")
    p.add_argument("--micro-batch", type=int, default=0, help="rows per forward/backward (0: the whole batch)")
    p.add_argument("--settings", default="", help="MICROxACCUM[+gc],... each in its own process, side by side")
    p.add_argument("--max-length", type=int, default=1280, help="rows longer than this are dropped (as in train)")
    p.add_argument("--steps", type=int, default=3, help="steps, on the longest batches first")
    p.add_argument("--bf16", type=lambda v: v.lower() in ("1", "true", "yes"), default=True)
    p.add_argument("--lora-dropout", type=float, default=0.05)
    p.add_argument("--gradient-checkpointing", action="store_true")
    p.add_argument("--completion-only-logits", type=lambda v: v.lower() in ("1", "true", "yes"), default=True)
    p.add_argument("--lm-head-chunk", type=int, default=0, help="labelled tokens per LM-head chunk (0: at once)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default="", help="write the results as JSON here")
    argv = sys.argv[1:] if argv is None else argv
    args = p.parse_args(argv)
    if args.settings:
        results = compare(args, argv)
        print_comparison(results)
        if args.out:
            Path(args.out).write_text(json.dumps(results, indent=2))
        return 0
    if args.micro_batch and args.batch_size % args.micro_batch:
        p.error(f"--micro-batch {args.micro_batch} does not divide --batch-size {args.batch_size}")
    result = run(args)
    print(
        f"\nloaded (model, LoRA, tokenized data): {result['loaded_rss_mb']:,} MB; allocator {result['allocator_env']}"
    )
    parts = sorted({k for r in result["steps"] for k in r["saved_mb"]})
    print(
        "| step | rows x length | forward peak | backward peak | after step | saved total | "
        + " | ".join(parts)
        + " |"
    )
    print("|---" * (6 + len(parts)) + "|")
    for i, r in enumerate(result["steps"], 1):
        cells = [f"{r['saved_mb'].get(k, 0):,}" for k in parts]
        print(
            f"| {i} | {r['rows']} x {r['padded_length']} | {r['forward_peak_mb']:,} | {r['backward_peak_mb']:,} | "
            f"{r['rss_after_mb']:,} | {r['saved_total_mb']:,} | " + " | ".join(cells) + " |"
        )
    if args.out:
        Path(args.out).write_text(json.dumps({"args": vars(args), **result}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
