"""Training throughput on today's format: simplan's trainer against TRL's SFTTrainer on one conversation export.

    flock /tmp/heavy.lock .venv/bin/python bench/bench_train.py --dataset /tmp/bt/decider --steps 12 --warmup 2
    .venv/bin/python bench/bench_train.py --steps 12 --warmup 2          # synthetic toy-env conversations
    .venv/bin/python bench/bench_train.py --halves simplan,simplan-packed,trl-pf,trl --out /tmp/bt/train.json

The data is a conversation dataset from `simplan build` (the default format: one row per episode window,
`messages` + per-message `weights`), or, without --dataset, one built the same way from toy-env expert and
noisy-expert trajectories. Branch rows (`--outcomes`) are left out: TRL has no tree mask for them. Every row
is tokenized once by simplan (training/examples.py `tokenize_dataset`: the chat template, loss on every
assistant turn of weight 1 and the EOS after it, rows over --max-length dropped) and both trainers get those
same token ids and that same supervision:

- TRL's own `assistant_only_loss=True` cannot be used: it needs `{% generation %}` markers that SmolLM2's
  chat template lacks (TRL 1.16 raises "The chat template is not training-compatible ... patching is not
  supported for this template"), and it would train the weight-0 turns (deduplicated or context-only turns)
  too. So TRL gets a pre-tokenized dataset, `input_ids` + `assistant_masks` where the mask is 1 exactly at
  simplan's labelled positions; TRL folds the mask into its labels itself (its documented path for
  pre-tokenized data). Each TRL half checks that its prepared labels equal simplan's, example by example.
- Padding-free where TRL offers it: `trl-pf` is `padding_free=True` (the batch flattened into one row, position
  ids restarting per example; with sdpa transformers builds the block-diagonal mask from the position ids).
  `trl` is TRL padded to the longest row with its default random sampler. TRL's default gradient checkpointing
  is turned off on both sides (the recipes do not checkpoint).
- `simplan` is `simplan train`'s trainer (batches grouped by length, padded, LM head at labelled positions only)
  on batches of --batch-size rows; `simplan-micro1` the same in micro-batches of one row accumulated to
  --batch-size, as the CPU recipes train (the same optimizer step, no padding); `simplan-compiled` that under
  `torch.compile` (inductor; the first steps compile, so time it with --warmup); `simplan-chunked` is `simplan` with
  `--lm_head_chunk 512` (the LM head on each row's own labelled tokens, where the default runs it at the union
  of the batch's labelled positions in every row); `simplan-packed` is its `--batching packed` (one row, no
  padding).

Both load the base model the same way (bf16 weights under bf16 autocast where bf16 is on: --bf16 auto, the
default, turns it on where the hardware has it natively, as `simplan train` does; sdpa) with the same
LoRA (r16, alpha 32, dropout 0.05, every linear layer but the LM head), batch size and seed. Each half runs in
a fresh process of its own, one after the other, so its peak resident memory (ru_maxrss: model load,
tokenization and training) is its own. Over the steps after --warmup it counts, from the batches each
trainer's own collator made: supervised actions (one per trained assistant message: a run of labelled
tokens), supervised tokens, non-padding and padded tokens, wall seconds and process CPU seconds (all threads,
time.process_time), and the positions the half's loss runs the LM head at (`head_positions`, `head_at`: TRL at
every position of its batch). Reported: supervised actions per CPU-second (the comparison the issue asks for),
non-padding tokens per wall second, padding efficiency, peak RSS. The halves draw batches in their own
orders, so they train on different windows of the same data; the per-action and per-token rates normalise
for that, though not for what a window's length does to its cost. With --same-windows every half trains one
epoch over the same seeded sample of --steps x --batch-size rows and times every step (--warmup 0): both sides
then do exactly the same supervised actions, in their own batch orders.

A half named NAME-Np (`simplan-micro1-2p`, `trl-pf-2p`) runs NAME in N data-parallel processes under torchrun
(gloo on the CPU; `--processes N` in the recipes), each with 1/N of every step's rows and of --threads: its counts,
CPU seconds and peak RSS are the processes' sums, its wall time the slowest one's. Prints a Markdown table and
writes JSON with --out.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import TrainerCallback

HALVES = ("simplan", "simplan-micro1", "simplan-compiled", "simplan-chunked", "simplan-packed", "trl-pf", "trl")
IGNORE_INDEX = -100  # training/examples.py's; repeated so that counting needs no simplan import


# ---------------------------------------------------------------------------------------------
# Data: a conversation export, simplan's tokenization of it, and what each batch supervises
# ---------------------------------------------------------------------------------------------
def synthetic_dataset(folder: Path, model: str, role: str = "decider", n_tasks: int = 8) -> Path:
    """A conversation dataset built by `simplan build` from toy-env expert and noisy-expert trajectories."""
    from simplan.data.build import BuildConfig, build
    from simplan.data.collect import CollectConfig, collect

    inputs = []
    for fold, limit in (("train", n_tasks), ("dev", 2)):
        path = folder / f"{fold}.jsonl"
        collect(
            CollectConfig(
                env="toy",
                fold=fold,
                limit=limit,
                policies=["expert", "noisy_expert"],
                branches=0,
                out=str(path),
                progress=False,
            )
        )
        inputs.append(str(path))
    build(BuildConfig(role=role, inputs=inputs, out=str(folder / role), model=model, progress=False))
    return folder / role


def load_train(dataset: str, tokenizer: Any, max_length: int) -> tuple[Any, dict[str, int]]:
    """The train fold of a conversation export tokenized by simplan, without branch rows; and what was left out."""
    from simplan.training.config import DataArguments
    from simplan.training.examples import load_splits, tokenize_dataset

    raw, _ = load_splits(DataArguments(dataset=dataset, eval_split=""))
    if "weights" not in raw.column_names:
        raise ValueError(
            f"dataset: {dataset} has per-step rows (columns {raw.column_names}); this benchmark compares trainers on "
            "conversation windows, the default of `simplan build` (drop --format step)"
        )
    rows = len(raw)
    if "branches" in raw.column_names:
        raw = raw.filter(lambda b: not b, input_columns="branches")
    tokenized, dropped = tokenize_dataset(raw, tokenizer, max_length)
    return tokenized, {"rows": rows, "branch_rows_left_out": rows - len(raw), "over_max_length": dropped}


def supervision(labels: torch.Tensor) -> tuple[int, int]:
    """(supervised actions, supervised tokens) of a batch: every labelled run of tokens is one assistant message
    (its content and EOS; messages are separated by unlabelled template tokens, examples by unlabelled prompts)."""
    valid = labels != IGNORE_INDEX
    starts = valid.clone()
    starts[:, 1:] &= ~valid[:, :-1]
    return int(starts.sum()), int(valid.sum())


@dataclass
class BatchCount:
    real_tokens: int
    padded_tokens: int
    actions: int
    supervised_tokens: int
    head_positions: int  # positions the half's loss runs the LM head at (`HEAD_AT`)


# Where a half's loss runs the LM head: simplan's default at the union of the batch's labelled positions in every
# row, its chunked loss at each row's own labelled tokens, TRL (and simplan without completion-only logits) at
# every position of the batch.
HEAD_AT = ("union", "labelled", "every")


class CountingCollator:
    """Wraps a trainer's collator and records what each batch it makes holds."""

    def __init__(self, inner: Any, head_at: str) -> None:
        if head_at not in HEAD_AT:
            raise ValueError(f"head_at={head_at!r}: one of {HEAD_AT}")
        self.inner = inner
        self.head_at = head_at
        self.batches: list[BatchCount] = []

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, Any]:
        batch = self.inner(features)
        ids = batch["input_ids"]
        mask = batch.get("attention_mask")
        actions, supervised = supervision(batch["labels"])
        real = int(mask.sum()) if mask is not None else ids.numel()  # padding-free rows have no padding
        union = int((batch["labels"][:, 1:] != IGNORE_INDEX).any(dim=0).sum())
        head = {"union": ids.shape[0] * union, "labelled": supervised, "every": ids.numel()}[self.head_at]
        self.batches.append(BatchCount(real, ids.numel(), actions, supervised, head))
        return batch


class StepClock(TrainerCallback):
    """Wall and process CPU time from the start of step `warmup` to the end of the last step."""

    def __init__(self, warmup: int) -> None:
        self.warmup = warmup
        self.start = (0.0, 0.0)
        self.end = (0.0, 0.0)

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step == self.warmup:
            self.start = (time.perf_counter(), time.process_time())

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.end = (time.perf_counter(), time.process_time())


# ---------------------------------------------------------------------------------------------
# The halves: each builds its trainer, then `measure` trains and counts
# ---------------------------------------------------------------------------------------------
def measure(trainer: Any, steps: int, warmup: int, head_at: str) -> dict[str, Any]:
    clock = StepClock(warmup)
    trainer.add_callback(clock)
    trainer.data_collator = counter = CountingCollator(trainer.data_collator, head_at)
    trainer.train()
    per_step = trainer.args.gradient_accumulation_steps  # the collator makes each micro-batch
    batches = [counter.batches[i : i + per_step] for i in range(0, len(counter.batches), per_step)]
    timed = [b for step in batches[warmup:steps] for b in step]
    total = {k: sum(getattr(b, k) for b in timed) for k in asdict(timed[0])}
    losses = [r["loss"] for r in trainer.state.log_history if "loss" in r]  # in N processes: their mean
    return with_rates(
        total
        | {
            "head_at": head_at,
            "wall_s": clock.end[0] - clock.start[0],
            "cpu_s": clock.end[1] - clock.start[1],
            "timed_steps": len(batches[warmup:steps]),
            "supervised_tokens_per_step": [sum(b.supervised_tokens for b in step) for step in batches[:steps]],
            "first_loss": round(losses[0], 4) if losses else None,
            "final_loss": round(losses[-1], 4) if losses else None,
        }
    )


def with_rates(counts: dict[str, Any]) -> dict[str, Any]:
    """The rates of a half's counts over its timed steps (wall and CPU seconds, summed over its processes' CPU)."""
    actions, tokens, wall, cpu = counts["actions"], counts["real_tokens"], counts["wall_s"], counts["cpu_s"]
    return counts | {
        "actions_per_cpu_s": round(actions / cpu, 3),
        "actions_per_s": round(actions / wall, 3),
        "tokens_per_s": round(tokens / wall, 1),
        "tokens_per_cpu_s": round(tokens / cpu, 1),
        "padding_efficiency": round(tokens / max(counts["padded_tokens"], 1), 3),
        "wall_s": round(wall, 1),
        "cpu_s": round(cpu, 1),
        "cpu_per_wall": round(cpu / wall, 2),
    }


SUMMED = ("actions", "supervised_tokens", "head_positions", "real_tokens", "padded_tokens", "cpu_s", "peak_rss_mb")


def merged(ranks: list[dict[str, Any]]) -> dict[str, Any]:
    """One half's result from its data-parallel processes' own: their batches, CPU time and resident memory
    summed, the wall time the slowest one's, the losses process 0's (the Trainer logs the processes' mean)."""
    first = ranks[0]
    counts = {k: sum(r[k] for r in ranks) for k in SUMMED} | {"wall_s": max(r["wall_s"] for r in ranks)}
    per_step = [sum(step) for step in zip(*(r["supervised_tokens_per_step"] for r in ranks), strict=True)]
    result = first | counts | {"supervised_tokens_per_step": per_step, "processes": len(ranks)}
    result["peak_rss_mb_per_process"] = [r["peak_rss_mb"] for r in ranks]
    if "same_labels_as_simplan" in first:
        result["same_labels_as_simplan"] = all(r["same_labels_as_simplan"] for r in ranks)
    return with_rates(result)


def run_simplan(args: argparse.Namespace, train_ds: Any, tokenizer: Any, out: Path) -> dict[str, Any]:
    from transformers import set_seed

    from simplan.training.completion_trainer import SimplanTrainer
    from simplan.training.config import LoraArguments, ModelArguments, TrainArguments
    from simplan.training.examples import PackingCollator, PaddingCollator
    from simplan.training.lora import load_model_for_training
    from simplan.training.trainer import training_arguments

    packed, chunked, micro1, compiled = (
        args.half == f"simplan-{variant}" for variant in ("packed", "chunked", "micro1", "compiled")
    )
    micro1 = micro1 or compiled
    rows = args.batch_size // args.processes  # this process's share of each step
    targs = TrainArguments(
        output_dir=str(out),
        max_steps=args.steps,
        per_device_train_batch_size=1 if micro1 else rows,
        gradient_accumulation_steps=rows if micro1 else 1,
        bf16=str(args.bf16).lower(),
        batching="packed" if packed else "group_by_length",
        logging_steps=1,
        save_steps=10**6,
        report_to="none",
        seed=args.seed,
        resume=False,
    )
    set_seed(args.seed)  # as `train` does: the LoRA A matrices are drawn when the model is made (TRL does the same)
    model, _ = load_model_for_training(
        ModelArguments(model=args.model, dtype=args.dtype), LoraArguments(lora_r=16, lora_alpha=32), args.bf16
    )
    training_args = training_arguments(targs, args.bf16, False)
    if compiled:  # the Trainer hands these to accelerate's dynamo plugin when it makes its accelerator
        training_args.torch_compile, training_args.torch_compile_backend = True, "inductor"
    trainer = SimplanTrainer(
        model=model,
        args=training_args,
        train_dataset=train_ds,
        data_collator=PackingCollator() if packed else PaddingCollator(tokenizer.pad_token_id),
        processing_class=tokenizer,
        completion_only_logits=targs.completion_only_logits,
        lm_head_chunk=512 if chunked else targs.lm_head_chunk,
    )
    head_at = "labelled" if chunked else "union" if targs.completion_only_logits else "every"
    return measure(trainer, args.steps, args.warmup, head_at)


def trl_dataset(train_ds: Any) -> Any:
    """simplan's tokenized rows as TRL's pre-tokenized format: input_ids + assistant_masks (1 where simplan labels)."""
    return train_ds.map(
        lambda labels: {"assistant_masks": [int(t != IGNORE_INDEX) for t in labels]},
        input_columns="labels",
        remove_columns=["labels", "length"],
        desc="assistant_masks",
    )


def run_trl(args: argparse.Namespace, train_ds: Any, tokenizer: Any, out: Path, padding_free: bool) -> dict[str, Any]:
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM
    from trl import SFTConfig, SFTTrainer

    from simplan.models.registry import resolve_model
    from simplan.training.config import ModelArguments
    from simplan.training.lora import base_dtype, linear_module_names

    model = AutoModelForCausalLM.from_pretrained(
        resolve_model(args.model),
        dtype=base_dtype(ModelArguments(model=args.model, dtype=args.dtype), args.bf16),
        attn_implementation="sdpa",
    )
    lora = LoraConfig(
        r=16, lora_alpha=32, lora_dropout=0.05, target_modules=linear_module_names(model), task_type="CAUSAL_LM"
    )
    config = SFTConfig(
        output_dir=str(out),
        max_steps=args.steps,
        per_device_train_batch_size=args.batch_size // args.processes,
        learning_rate=2e-4,
        bf16=args.bf16,
        use_cpu=not torch.cuda.is_available(),
        # Rows are already cut to simplan's max_length (longer ones dropped); TRL refuses a max_length with
        # padding_free and no packing, since it would not be enforced.
        max_length=None if padding_free else args.max_length,
        padding_free=padding_free,
        gradient_checkpointing=False,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        seed=args.seed,
        train_sampling_strategy="group_by_length" if args.trl_group_by_length else "random",
    )
    trainer = SFTTrainer(
        model=model, args=config, train_dataset=trl_dataset(train_ds), processing_class=tokenizer, peft_config=lora
    )
    same = list(trainer.train_dataset["labels"]) == list(train_ds["labels"])
    if not same:
        raise AssertionError("TRL's prepared labels differ from simplan's: the halves would not supervise the same")
    return measure(trainer, args.steps, args.warmup, "every") | {"same_labels_as_simplan": same}


def run_half(args: argparse.Namespace) -> dict[str, Any]:
    """One half in this process: tokenize, train --steps, count; with the peak RSS of the process."""
    import transformers

    from simplan.models.registry import load_tokenizer

    torch.set_num_threads(max(1, args.threads // args.processes))
    transformers.logging.set_verbosity_error()
    tokenizer = load_tokenizer(args.model)
    train_ds, data = load_train(args.dataset, tokenizer, args.max_length)
    if args.same_windows:  # one epoch over the same seeded sample of rows in every half, every step timed
        rows = args.steps * args.batch_size
        if rows > len(train_ds):
            raise ValueError(
                f"--same-windows: {rows} rows asked (--steps x --batch-size), the dataset has {len(train_ds)}"
            )
        train_ds = train_ds.shuffle(seed=args.seed).select(range(rows))
        data["same_windows"] = rows
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / args.half
        if args.half.startswith("simplan"):
            result = run_simplan(args, train_ds, tokenizer, out)
        else:
            result = run_trl(args, train_ds, tokenizer, out, padding_free=args.half == "trl-pf")
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # kilobytes on Linux
    return result | {"peak_rss_mb": round(peak_kb / 1024), "data": data}


# ---------------------------------------------------------------------------------------------
# Entry point: each half in a fresh process, one after the other; one table
# ---------------------------------------------------------------------------------------------
def half_processes(half: str) -> tuple[str, int]:
    """A half's trainer and its data-parallel processes: `trl-pf-2p` is `trl-pf` in 2 processes."""
    name, _, count = half.rpartition("-")
    if name in HALVES and count[:-1].isdigit() and count.endswith("p") and int(count[:-1]) >= 1:
        return name, int(count[:-1])
    return half, 1


def run_child(args: argparse.Namespace, half: str, dataset: str, result: Path) -> dict[str, Any]:
    """One half in fresh processes (torchrun's for more than one), its result read back."""
    from simplan.training.processes import free_port, process_environment, torchrun_command

    name, processes = half_processes(half)
    script = [str(Path(__file__).resolve()), *_child_argv(args, name, processes, dataset, result)]
    env = process_environment(max(1, args.threads // processes)) | {"TOKENIZERS_PARALLELISM": "false"}
    command = [sys.executable, *script] if processes == 1 else torchrun_command(processes, free_port(), script)
    subprocess.run(command, check=True, env=env)
    if processes == 1:
        return json.loads(result.read_text())
    return merged([json.loads(Path(f"{result}.rank{rank}").read_text()) for rank in range(processes)])


def _child_argv(args: argparse.Namespace, half: str, processes: int, dataset: str, result: Path) -> list[str]:
    argv = ["--half", half, "--processes", str(processes), "--result", str(result)]
    argv += ["--dataset", dataset, "--model", args.model, "--steps", str(args.steps), "--warmup", str(args.warmup)]
    argv += ["--batch-size", str(args.batch_size), "--max-length", str(args.max_length), "--dtype", args.dtype]
    argv += ["--bf16", str(args.bf16), "--threads", str(args.threads), "--seed", str(args.seed)]
    argv += ["--same-windows"] if args.same_windows else []
    return argv + (["--trl-group-by-length"] if args.trl_group_by_length else [])


def table(results: dict[str, dict[str, Any]], baseline: str) -> str:
    base = results.get(baseline, {}).get("actions_per_cpu_s")
    lines = [
        "| trainer | supervised actions / CPU-s | vs " + baseline + " | non-pad tokens / s | non-pad tokens / CPU-s "
        "| padding efficiency | CPU-s / s | peak RSS (MB) | actions, tokens timed | final loss |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, r in results.items():
        ratio = f"{r['actions_per_cpu_s'] / base:.2f}x" if base else "-"
        lines.append(
            f"| {name} | {r['actions_per_cpu_s']} | {ratio} | {r['tokens_per_s']} | {r['tokens_per_cpu_s']} | "
            f"{r['padding_efficiency']} | {r['cpu_per_wall']} | {r['peak_rss_mb']:,} | "
            f"{r['actions']}, {r['real_tokens']:,} | {r['final_loss']} |"
        )
    return "\n".join(lines)


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m-instruct", help="registry name or HF folder")
    p.add_argument("--dataset", default="", help="conversation dataset from `simplan build` (default: toy-env one)")
    p.add_argument("--role", default="decider", choices=["decider", "simulator"], help="role of the toy dataset")
    p.add_argument(
        "--halves",
        default="simplan,trl-pf,trl",
        help=f"comma-separated, from {','.join(HALVES)}; NAME-Np runs NAME in N data-parallel processes (torchrun, "
        "gloo on the CPU) that share each step's rows and --threads",
    )
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--warmup", type=int, default=2, help="steps not timed")
    p.add_argument("--batch-size", type=int, default=4, help="rows per step (the CPU recipes' 4)")
    p.add_argument("--max-length", type=int, default=1024, help="rows longer than this are dropped, on both sides")
    p.add_argument("--dtype", default="auto", help="base weights dtype for both trainers")
    p.add_argument(
        "--bf16",
        default="auto",
        help="bf16 autocast for both trainers: true, false or auto (on where the CPU or GPU has native bf16, as "
        "`simplan train` decides; emulated bf16 was 19x slower per step on a CPU without AVX-512)",
    )
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--trl-group-by-length", action="store_true", help="give TRL length-grouped batches too")
    p.add_argument(
        "--same-windows",
        action="store_true",
        help="every half trains one epoch over the same seeded sample of --steps x --batch-size rows, every step "
        "timed (--warmup 0): the same supervised actions on both sides, in each trainer's own order",
    )
    p.add_argument("--out", default="", help="write the results as JSON here")
    p.add_argument("--half", default="", choices=["", *HALVES], help=argparse.SUPPRESS)  # one half, in a child
    p.add_argument("--result", default="", help=argparse.SUPPRESS)
    p.add_argument("--processes", type=int, default=1, help=argparse.SUPPRESS)  # the child's half's processes
    args = p.parse_args(argv)
    halves = [h for h in args.halves.split(",") if h]
    if bad := [h for h in halves if half_processes(h)[0] not in HALVES]:
        p.error(f"--halves: {bad} not among {list(HALVES)} (or one of them with -Np)")
    if uneven := [h for h in halves if args.batch_size % half_processes(h)[1]]:
        p.error(f"--halves {uneven}: --batch-size {args.batch_size} does not split evenly into their processes")
    if args.steps <= args.warmup:
        p.error(f"--steps {args.steps} must be more than --warmup {args.warmup}")
    if args.same_windows and args.warmup:
        p.error("--same-windows times every step of the epoch: give --warmup 0")
    args.halves = halves
    if args.bf16.lower() == "auto":
        from simplan.training.lora import bf16_supported

        args.bf16 = bf16_supported()
    else:
        args.bf16 = args.bf16.lower() in ("1", "true", "yes")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.half:
        rank = os.environ.get("RANK")  # one of torchrun's processes: each writes its own counts
        Path(args.result if rank is None else f"{args.result}.rank{rank}").write_text(json.dumps(run_half(args)))
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        dataset = args.dataset or str(synthetic_dataset(tmp_path / "synthetic", args.model, args.role))
        results = {}
        for half in args.halves:
            results[half] = run_child(args, half, dataset, tmp_path / f"{half}.json")
    baseline = next((h for h in ("trl-pf", "trl") if h in results), args.halves[0])
    print(
        f"\nmodel {args.model}, data {args.dataset or 'toy-env ' + args.role + ' conversations'}, batch "
        f"{args.batch_size}, {args.steps} steps ({args.warmup} warm-up), bf16 {args.bf16}, {args.threads} thread(s)\n"
    )
    print(table(results, baseline))
    if args.out:
        Path(args.out).write_text(json.dumps({"args": vars(args), "results": results}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
