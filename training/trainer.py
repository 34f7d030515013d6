"""LoRA fine-tuning of the decider or the simulator: transformers Trainer + peft, completion-only loss.

    simplan train --config recipes/smollm2-135m-instruct/twx/decider.yaml      # CLI (scripts/train.py)

    from simplan.training.trainer import train
    result = train(ModelArguments(...), LoraArguments(...), DataArguments(dataset="runs/datasets/x"),
                   TrainArguments(output_dir="runs/train/x"))

What happens, in order:
1. Rows from `simplan build` are tokenized with the model's chat template (data/format.py and
   data/episode.py, the prompt formats shared with inference). A conversation row (`messages` +
   `weights`, one window of an episode) carries loss on every assistant turn of weight 1 and on the
   EOS the template writes after it; a per-step row (`prompt` + `completion`) on its completion + EOS.
   Everything else is labelled -100. Examples longer than `max_length` are dropped and counted,
   never cut. The dataset's prompt_settings.json is saved into the adapter folder, where the
   planner reads it.
2. Batches are grouped by length and padded to the longest in the batch (the fast path on a CPU),
   or packed into one row whose position ids restart at every example; transformers then builds a
   block-diagonal causal mask (or uses varlen flash attention), so attention never crosses examples.
3. The loss is computed at completion positions only: the LM head (49k words for SmolLM2) runs on
   the positions that carry a label, via the model's own `logits_to_keep`, which on the CPU is the
   largest single saving (123.5 -> 159.0 tokens/s on TWX decider data, 2 cores). The loss is identical.
4. Checkpoints every `save_steps`; rerunning the same command resumes from the last complete one
   (one whose save was cut short is skipped, and said so), in the same folder or in a copy of it.
   Logs go to output_dir/metrics.jsonl (and TensorBoard when installed); on resume the lines logged
   after the checkpoint are dropped, so no step is there twice. At the end: output_dir/adapter (a
   PEFT adapter folder that peft and vLLM's LoRARequest load, with the tokenizer), config.yaml (the
   resolved config) and metrics.json.

The code: this module holds `train` and its TrainingArguments; training/examples.py tokenizes and
collates, training/completion_trainer.py is the Trainer subclass and its callbacks, training/lora.py loads
the model with its adapters and saves the adapter, training/checkpoints.py finds and checks checkpoints.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import yaml
from transformers import TrainingArguments, set_seed

from simplan.core.io import write_json, write_text
from simplan.core.memory import mmap_threshold, release_memory
from simplan.data.format import eos_ends_assistant_turn
from simplan.models.registry import load_tokenizer
from simplan.training.checkpoints import check_resumable, last_checkpoint, trim_metrics
from simplan.training.completion_trainer import JsonlMetricsCallback, SimplanTrainer, TimeLimitCallback
from simplan.training.config import DataArguments, LoraArguments, ModelArguments, TrainArguments
from simplan.training.examples import (
    PackingCollator,
    PaddingCollator,
    TokenizedSplits,
    dataset_settings,
    tokenized_splits,
)
from simplan.training.lora import load_model_for_training, read_lora_init, save_adapter, use_bf16
from simplan.training.packing import BranchCollator
from simplan.training.processes import launched, peaks_mb, train_in_processes


def report_to(train_args: TrainArguments) -> list[str]:
    if train_args.report_to == "auto":
        try:
            import tensorboard  # noqa: F401

            return ["tensorboard"]
        except ImportError:
            return []
    if train_args.report_to in ("none", ""):
        return []
    return [r.strip() for r in train_args.report_to.split(",") if r.strip()]


def training_arguments(train_args: TrainArguments, bf16: bool, has_eval: bool) -> TrainingArguments:
    eval_strategy = "steps" if has_eval and train_args.eval_steps > 0 else "no"
    return TrainingArguments(
        output_dir=train_args.output_dir,
        num_train_epochs=train_args.num_train_epochs,
        max_steps=train_args.max_steps,
        learning_rate=train_args.learning_rate,
        lr_scheduler_type=train_args.lr_scheduler_type,
        warmup_steps=train_args.warmup_ratio,  # a float < 1 is a ratio of the total steps
        weight_decay=train_args.weight_decay,
        max_grad_norm=train_args.max_grad_norm,
        per_device_train_batch_size=train_args.per_device_train_batch_size,
        per_device_eval_batch_size=train_args.per_device_eval_batch_size,
        gradient_accumulation_steps=train_args.gradient_accumulation_steps,
        bf16=bf16,
        use_cpu=not torch.cuda.is_available(),
        gradient_checkpointing=train_args.gradient_checkpointing,
        gradient_checkpointing_kwargs={"use_reentrant": False},
        # In data-parallel processes: every LoRA weight takes part in each forward, so DDP need not walk the
        # autograd graph after each backward for unused ones (transformers' default without checkpointing); a
        # weight left out would fail the step loudly, not silently.
        ddp_find_unused_parameters=False,
        train_sampling_strategy="group_by_length" if train_args.batching == "group_by_length" else "random",
        length_column_name="length",
        eval_strategy=eval_strategy,
        eval_steps=train_args.eval_steps or None,
        prediction_loss_only=True,
        save_strategy="steps",
        save_steps=train_args.save_steps,
        save_total_limit=train_args.save_total_limit,
        logging_steps=train_args.logging_steps,
        logging_first_step=True,
        seed=train_args.seed,
        data_seed=train_args.seed,
        dataloader_num_workers=train_args.dataloader_num_workers,
        remove_unused_columns=False,
        report_to=report_to(train_args),
        disable_tqdm=False,
    )


# ---------------------------------------------------------------------------------------------
# Entry point
# ---------------------------------------------------------------------------------------------
@dataclass
class TrainResult:
    output_dir: Path
    adapter_dir: Path
    metrics: dict[str, Any]


def train(
    model_args: ModelArguments, lora_args: LoraArguments, data_args: DataArguments, train_args: TrainArguments
) -> TrainResult:
    """Train a LoRA adapter; rerunning with the same output_dir resumes from its last checkpoint. With
    `train_args.processes` > 1 the training runs in that many processes (training/processes.py)."""
    if train_args.processes > 1 and not launched():
        out = Path(train_args.output_dir)
        metrics = train_in_processes(
            run_arguments(model_args, lora_args, data_args, train_args), out, train_args.processes
        )
        return TrainResult(output_dir=out, adapter_dir=out / "adapter", metrics=metrics)
    with mmap_threshold(train_args.malloc_mmap_threshold):
        return _train(model_args, lora_args, data_args, train_args)


def run_arguments(*configs: Any) -> dict[str, Any]:
    """The run's arguments as one flat mapping, as a recipe writes them (config.yaml, processes.yaml)."""
    return {k: v for c in configs for k, v in vars(c).items()}


def _train(
    model_args: ModelArguments, lora_args: LoraArguments, data_args: DataArguments, train_args: TrainArguments
) -> TrainResult:
    if train_args.num_threads:
        torch.set_num_threads(train_args.num_threads)
    out = Path(train_args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    bf16 = use_bf16(train_args)
    arguments = run_arguments(model_args, lora_args, data_args, train_args)
    checkpoint = last_checkpoint(out) if train_args.resume else None
    if checkpoint:
        check_resumable(out, arguments)
    read_lora_init(lora_args)

    tokenizer = load_tokenizer(model_args.model)
    eos_ok = _eos_ends_turn_or_warn(tokenizer)
    splits = tokenized_splits(data_args, tokenizer)

    set_seed(train_args.seed)  # LoRA's A matrices are drawn here, before the Trainer seeds anything
    model, model_path = load_model_for_training(model_args, lora_args, bf16)
    if train_args.gradient_checkpointing:
        model.enable_input_require_grads()  # checkpointed blocks need a grad-requiring input under LoRA

    resolved = {
        **arguments,
        "resolved_model": model_path,
        "resolved_bf16": bf16,
    }
    write_text(out / "config.yaml", yaml.safe_dump(resolved, sort_keys=False))

    timer = TimeLimitCallback(train_args.max_minutes)
    trainer = _make_trainer(
        model, tokenizer, splits, train_args, bf16, [JsonlMetricsCallback(out / "metrics.jsonl"), timer]
    )
    _prepare_start(trainer, out, checkpoint)
    started = time.perf_counter()
    result = trainer.train(resume_from_checkpoint=checkpoint)
    seconds = time.perf_counter() - started

    metrics = _run_metrics(
        trainer,
        result,
        splits,
        model,
        seconds,
        timer=timer,
        checkpoint=checkpoint,
        bf16=bf16,
        eos_ok=eos_ok,
        model_path=model_path,
    )
    adapter_dir = out / "adapter"
    if trainer.is_world_process_zero():
        _write_outputs(trainer, model, tokenizer, out, adapter_dir, data_args, metrics)
    del trainer, model, splits
    release_memory()
    return TrainResult(output_dir=out, adapter_dir=adapter_dir, metrics=metrics)


def _eos_ends_turn_or_warn(tokenizer: Any) -> bool:
    """Whether the tokenizer's EOS is what the chat template writes after an assistant turn; warns when not."""
    eos_ok, turn_end = eos_ends_assistant_turn(tokenizer)
    if not eos_ok:
        print(
            f"train: WARNING the tokenizer's eos_token {tokenizer.eos_token!r} is not what the chat template "
            f"writes after an assistant turn ({turn_end!r}); every completion is trained to end with "
            f"{tokenizer.eos_token!r}, so the adapter stops only under a tokenizer with that same eos. Fix the "
            "model folder's tokenizer_config.json (simplan's own conversions are fixed by `simplan models fetch` "
            "into a fresh cache) unless this is intended.",
            file=sys.stderr,
            flush=True,
        )
    return eos_ok


def _make_trainer(
    model: Any, tokenizer: Any, splits: TokenizedSplits, train_args: TrainArguments, bf16: bool, callbacks: list
) -> SimplanTrainer:
    """The Trainer over the tokenized splits, with the batching the run asks for."""
    if "segment_ids" in splits.train.column_names:  # branch rows (data/build_branches.py): a tree mask per row
        dtype = model.get_input_embeddings().weight.dtype  # the attention scores' dtype, which sdpa's mask must match
        collator: Any = BranchCollator(tokenizer.pad_token_id, dtype=dtype)
    elif train_args.batching == "packed":
        collator = PackingCollator()
    else:
        collator = PaddingCollator(tokenizer.pad_token_id, pad_to_multiple_of=8 if torch.cuda.is_available() else None)
    return SimplanTrainer(
        model=model,
        args=training_arguments(train_args, bf16, splits.dev is not None),
        train_dataset=splits.train,
        eval_dataset=splits.dev,
        data_collator=collator,
        processing_class=tokenizer,
        callbacks=callbacks,
        completion_only_logits=train_args.completion_only_logits,
        lm_head_chunk=train_args.lm_head_chunk,
    )


def _prepare_start(trainer: SimplanTrainer, out: Path, checkpoint: str | None) -> None:
    """Say where the run starts, and drop the metrics lines a resumed run will log again."""
    if checkpoint:
        print(f"train: resuming from {checkpoint}", flush=True)
    if trainer.is_world_process_zero():  # steps after the starting point are logged again, so not kept twice
        start_step = int(Path(checkpoint).name.split("-")[-1]) if checkpoint else 0
        if dropped := trim_metrics(out / "metrics.jsonl", start_step):
            print(f"train: dropped {dropped} metrics.jsonl line(s) logged after step {start_step}", flush=True)


def _run_metrics(
    trainer: SimplanTrainer,
    result: Any,
    splits: TokenizedSplits,
    model: Any,
    seconds: float,
    *,
    timer: TimeLimitCallback,
    checkpoint: str | None,
    bf16: bool,
    eos_ok: bool,
    model_path: str,
) -> dict[str, Any]:
    """metrics.json: the Trainer's metrics, the final eval losses and what the run trained on."""
    metrics: dict[str, Any] = dict(result.metrics)
    if splits.dev is not None:
        step = trainer.state.global_step
        final = [r for r in trainer.state.log_history if "eval_loss" in r and r.get("step") == step]
        metrics.update({k: v for k, v in final[-1].items() if k.startswith("eval_")} if final else trainer.evaluate())
    trainable, total = model.get_nb_trainable_parameters()
    metrics.update(
        {
            "global_step": trainer.state.global_step,
            "stopped_by_max_minutes_at_step": timer.stopped_at,
            "resumed_from": checkpoint,
            "train_examples": len(splits.train),
            "train_dropped_over_max_length": splits.dropped_train,
            "eval_examples": len(splits.dev) if splits.dev is not None else 0,
            "eval_dropped_over_max_length": splits.dropped_dev,
            "tokens_seen_this_run": trainer.tokens_seen,
            "tokens_per_s": round(trainer.tokens_seen / max(seconds, 1e-9), 1),
            "trainable_params": trainable,
            "total_params": total,
            "bf16": bf16,
            "eos_matches_chat_template": eos_ok,
            "model": model_path,
            "peak_rss_mb_per_process": [None if mb is None else round(mb) for mb in peaks_mb()],
        }
    )
    return metrics


def _write_outputs(
    trainer: SimplanTrainer,
    model: Any,
    tokenizer: Any,
    out: Path,
    adapter_dir: Path,
    data_args: DataArguments,
    metrics: dict[str, Any],
) -> None:
    """The adapter (with the dataset's prompt settings) and metrics.json; the losses printed."""
    save_adapter(trainer.accelerator.unwrap_model(model), tokenizer, adapter_dir, dataset_settings(data_args))
    write_json(out / "metrics.json", metrics)
    print(json.dumps({k: metrics[k] for k in sorted(metrics) if "loss" in k or k == "global_step"}), flush=True)
    print(f"train: adapter saved to {adapter_dir}", flush=True)
