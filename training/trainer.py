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
"""

from __future__ import annotations

import inspect
import json
import math
import os
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import yaml
from transformers import Trainer, TrainerCallback, TrainingArguments, set_seed

from simplan.data.episode import PromptSettings, read_settings, write_settings
from simplan.data.format import completion_text, eos_ends_assistant_turn, prompt_text
from simplan.data.io import append_jsonl, atomic_dir, atomic_open, iter_jsonl_lines, write_json, write_text
from simplan.training.config import DataArguments, LoraArguments, ModelArguments, TrainArguments
from simplan.training.models import load_tokenizer, resolve_model

IGNORE_INDEX = -100


# ---------------------------------------------------------------------------------------------
# Data: tokenization with completion-only labels, and the two collators
# ---------------------------------------------------------------------------------------------
def tokenize_example(tokenizer: Any, prompt: list[dict[str, str]], completion: str) -> dict[str, list[int]]:
    """input_ids and labels for one example: prompt via the chat template, completion + EOS, prompt masked."""
    prompt_ids = tokenizer(prompt_text(tokenizer, prompt), add_special_tokens=False)["input_ids"]
    completion_ids = tokenizer(completion_text(tokenizer, completion), add_special_tokens=False)["input_ids"]
    return {
        "input_ids": prompt_ids + completion_ids,
        "labels": [IGNORE_INDEX] * len(prompt_ids) + list(completion_ids),
    }


def assistant_spans(
    tokenizer: Any, messages: list[dict[str, str]], weights: list[int]
) -> tuple[str, list[tuple[int, int]]]:
    """The conversation's text (chat template) and the character spans that carry loss: the content of
    every assistant turn with weight > 0 and the EOS the template writes after it (so the model learns
    to stop). Each span is located by rendering the conversation up to that turn with the generation
    prompt, so a template that renders a prefix differently from the whole is caught, not trained on."""
    text = tokenizer.apply_chat_template(messages, tokenize=False)
    eos = tokenizer.eos_token or ""
    spans = []
    for i, (m, w) in enumerate(zip(messages, weights)):
        if m["role"] != "assistant" or not w:
            continue
        head = tokenizer.apply_chat_template(messages[:i], add_generation_prompt=True, tokenize=False)
        end = len(head) + len(m["content"])
        if not text.startswith(head) or text[len(head) : end] != m["content"]:
            raise ValueError(
                f"the chat template does not render assistant turn {i} after its prompt as it renders the prompt "
                "alone (a template that rewrites earlier turns, e.g. drops reasoning); train with `simplan build "
                "--format step` data or a prefix-preserving template"
            )
        if eos and text.startswith(eos, end):
            end += len(eos)
        spans.append((len(head), end))
    return text, spans


def tokenize_conversation(tokenizer: Any, messages: list[dict[str, str]], weights: list[int]) -> dict[str, list[int]]:
    """input_ids and labels of one multi-turn sequence: labels only on the weighted assistant turns (+ EOS)."""
    text, spans = assistant_spans(tokenizer, messages, weights)
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    labels = [IGNORE_INDEX] * len(enc["input_ids"])
    for k, (a, b) in enumerate(enc["offset_mapping"]):
        if any(a < end and b > start for start, end in spans):
            labels[k] = enc["input_ids"][k]
    return {"input_ids": list(enc["input_ids"]), "labels": labels}


def tokenize_dataset(dataset: Any, tokenizer: Any, max_length: int, desc: str = "tokenize") -> tuple[Any, int]:
    """Tokenize a `datasets.Dataset` from `simplan build`; returns (tokenized, number dropped).

    Conversation rows (`messages` + `weights`) carry loss on their weighted assistant turns; per-step
    rows (`prompt` + `completion`) on the completion."""
    columns = dataset.column_names
    if "weights" in columns and "messages" in columns:
        return _tokenize(dataset, max_length, desc, _conversation_encoder(tokenizer))
    for column in ("prompt", "completion"):
        if column not in columns:
            raise ValueError(
                f"dataset has no {column!r} column (columns: {columns}); build it with `simplan build`, which "
                "writes messages + weights (conversation) or prompt + completion (step)"
            )
    return _tokenize(dataset, max_length, desc, _step_encoder(tokenizer))


def _conversation_encoder(tokenizer: Any) -> Any:
    def encode(batch: dict[str, list]) -> dict[str, list]:
        out: dict[str, list] = {"input_ids": [], "labels": [], "length": []}
        for messages, weights in zip(batch["messages"], batch["weights"]):
            ex = tokenize_conversation(tokenizer, messages, weights)
            out["input_ids"].append(ex["input_ids"])
            out["labels"].append(ex["labels"])
            out["length"].append(len(ex["input_ids"]))
        return out

    return encode


def _step_encoder(tokenizer: Any) -> Any:
    def encode(batch: dict[str, list]) -> dict[str, list]:
        prompts = [prompt_text(tokenizer, p) for p in batch["prompt"]]
        completions = [completion_text(tokenizer, c) for c in batch["completion"]]
        p_ids = tokenizer(prompts, add_special_tokens=False)["input_ids"]
        c_ids = tokenizer(completions, add_special_tokens=False)["input_ids"]
        out: dict[str, list] = {"input_ids": [], "labels": [], "length": []}
        for p, c in zip(p_ids, c_ids):
            out["input_ids"].append(p + c)
            out["labels"].append([IGNORE_INDEX] * len(p) + c)
            out["length"].append(len(p) + len(c))
        return out

    return encode


def _tokenize(dataset: Any, max_length: int, desc: str, encode: Any) -> tuple[Any, int]:
    tokenized = dataset.map(encode, batched=True, remove_columns=dataset.column_names, desc=desc)
    before = len(tokenized)
    tokenized = tokenized.filter(lambda n: n <= max_length, input_columns="length", desc=f"{desc}: length filter")
    return tokenized, before - len(tokenized)


@dataclass
class PaddingCollator:
    """Right-pads a batch to its longest example; padding is masked out and carries no loss."""

    pad_token_id: int
    pad_to_multiple_of: int | None = None

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        longest = max(len(f["input_ids"]) for f in features)
        if self.pad_to_multiple_of:
            longest = math.ceil(longest / self.pad_to_multiple_of) * self.pad_to_multiple_of
        ids = torch.full((len(features), longest), self.pad_token_id, dtype=torch.long)
        labels = torch.full((len(features), longest), IGNORE_INDEX, dtype=torch.long)
        mask = torch.zeros((len(features), longest), dtype=torch.long)
        for i, f in enumerate(features):
            n = len(f["input_ids"])
            ids[i, :n] = torch.tensor(f["input_ids"])
            labels[i, :n] = torch.tensor(f["labels"])
            mask[i, :n] = 1
        return {"input_ids": ids, "attention_mask": mask, "labels": labels}


@dataclass
class PackingCollator:
    """Concatenates a batch into one row with position ids restarting at each example, and no padding.

    Without an attention mask, transformers reads example boundaries from the position ids and
    builds a block-diagonal causal mask (sdpa/eager) or calls varlen flash attention, so no token
    attends to another example. Each example's first token is a prompt token (label -100), so no
    loss crosses a boundary either.
    """

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        ids: list[int] = []
        labels: list[int] = []
        positions: list[int] = []
        for f in features:
            ids += f["input_ids"]
            labels += [IGNORE_INDEX] + list(f["labels"][1:])
            positions += range(len(f["input_ids"]))
        return {
            "input_ids": torch.tensor([ids]),
            "labels": torch.tensor([labels]),
            "position_ids": torch.tensor([positions]),
        }


# ---------------------------------------------------------------------------------------------
# The trainer: loss at completion positions only
# ---------------------------------------------------------------------------------------------
def completion_loss(
    model: torch.nn.Module, inputs: dict[str, torch.Tensor], num_items_in_batch: torch.Tensor | int | None = None
) -> torch.Tensor:
    """Next-token cross-entropy over labelled positions, running the LM head only where labels are.

    `logits_to_keep` (a tensor of sequence positions, shared by the batch) asks the model for
    logits at the union of the batch's labelled positions; with length-grouped batches that is a
    few dozen columns instead of hundreds, and with packing it is exact. Returns the sum over
    labelled tokens divided by `num_items_in_batch` when given (the Trainer's token count over the
    whole accumulated batch), else the mean.
    """
    labels = inputs["labels"]
    shift_labels = labels[:, 1:]
    valid = shift_labels != IGNORE_INDEX
    keep = valid.any(dim=0).nonzero().squeeze(-1)  # positions t whose logits predict a label at t+1
    if keep.numel() == 0:
        keep = torch.zeros(1, dtype=torch.long, device=labels.device)
    model_inputs = {k: v for k, v in inputs.items() if k != "labels"}
    logits = model(**model_inputs, logits_to_keep=keep, use_cache=False).logits  # [B, len(keep), V]
    targets = shift_labels[:, keep]
    loss = torch.nn.functional.cross_entropy(
        logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=IGNORE_INDEX, reduction="sum"
    )
    if num_items_in_batch is None:
        return loss / valid.sum().clamp(min=1)
    if torch.is_tensor(num_items_in_batch):
        num_items_in_batch = num_items_in_batch.to(loss.device)
    return loss / num_items_in_batch


def _accepts_logits_to_keep(model: torch.nn.Module) -> bool:
    inner = model
    while True:  # unwrap DDP/FSDP wrappers and peft
        if hasattr(inner, "module") and isinstance(inner.module, torch.nn.Module):
            inner = inner.module
        elif hasattr(inner, "get_base_model"):
            inner = inner.get_base_model()
        else:
            break
    return "logits_to_keep" in inspect.signature(inner.forward).parameters


class SimplanTrainer(Trainer):
    """transformers Trainer that computes the LM head at completion positions only and counts tokens."""

    def __init__(self, *args: Any, completion_only_logits: bool = True, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.completion_only_logits = completion_only_logits and _accepts_logits_to_keep(self.model)
        self.tokens_seen = 0  # non-padding tokens trained on by this process
        self._last_log = (time.perf_counter(), 0)

    def compute_loss(
        self,
        model: torch.nn.Module,
        inputs: dict[str, torch.Tensor],
        return_outputs: bool = False,
        num_items_in_batch: torch.Tensor | int | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, Any]:
        if model.training:
            mask = inputs.get("attention_mask")
            self.tokens_seen += int(mask.sum()) if mask is not None else inputs["input_ids"].numel()
        if not self.completion_only_logits:
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        if not self.model_accepts_loss_kwargs:
            num_items_in_batch = None  # the Trainer then averages over gradient accumulation itself
        loss = completion_loss(model, inputs, num_items_in_batch)
        if self.args.average_tokens_across_devices and num_items_in_batch is not None:
            loss = loss * self.accelerator.num_processes  # DDP averages gradients; undo it for a token mean
        return (loss, {"loss": loss}) if return_outputs else loss

    def log(self, logs: dict[str, float], *args: Any, **kwargs: Any) -> None:
        if "loss" in logs:
            now = time.perf_counter()
            then, tokens_then = self._last_log
            logs["tokens_seen"] = self.tokens_seen
            logs["tokens_per_s"] = round((self.tokens_seen - tokens_then) / max(now - then, 1e-9), 1)
            self._last_log = (now, self.tokens_seen)
        super().log(logs, *args, **kwargs)


class JsonlMetricsCallback(TrainerCallback):
    """Appends every log record (train loss, eval loss, learning rate, tokens/s) to a JSONL file."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)

    def on_log(self, args: Any, state: Any, control: Any, logs: dict | None = None, **kwargs: Any) -> None:
        if state.is_world_process_zero and logs:
            record = {"step": state.global_step, "epoch": state.epoch, "time": round(time.time(), 3), **logs}
            append_jsonl(self.path, [record])


class TimeLimitCallback(TrainerCallback):
    """Stops training (saving a checkpoint and the adapter as at a normal end) once `minutes` of this
    run's training have passed: equal-compute comparisons on a shared machine need a clock, not a step
    count. 0 = no limit."""

    def __init__(self, minutes: float) -> None:
        self.seconds = minutes * 60.0
        self.started = 0.0
        self.stopped_at: int | None = None

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.started = time.perf_counter()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.seconds and time.perf_counter() - self.started >= self.seconds and not control.should_training_stop:
            control.should_training_stop = True
            control.should_save = True
            self.stopped_at = state.global_step


# ---------------------------------------------------------------------------------------------
# Set-up helpers
# ---------------------------------------------------------------------------------------------
def bf16_supported() -> bool:
    """bf16 autocast pays off on CUDA GPUs with bf16 and on CPUs with native bf16 (AVX512-BF16/AMX)."""
    if torch.cuda.is_available():
        return torch.cuda.is_bf16_supported()
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def use_bf16(train_args: TrainArguments) -> bool:
    if train_args.bf16 == "auto":
        return bf16_supported()
    return train_args.bf16 == "true"


def base_dtype(model_args: ModelArguments, bf16: bool) -> torch.dtype:
    if model_args.dtype == "auto":
        return torch.bfloat16 if bf16 else torch.float32
    return getattr(torch, model_args.dtype)


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


def linear_module_names(model: torch.nn.Module) -> list[str]:
    """Short names of every linear layer but the LM head ("q_proj", ..., "down_proj").

    peft's own "all-linear" writes one full path per layer into adapter_config.json; short names
    are what vLLM's LoRA loader and other tools expect, and they read the same for any depth.
    """
    head = model.get_output_embeddings()
    names = {
        name.rsplit(".", 1)[-1]
        for name, module in model.named_modules()
        if isinstance(module, torch.nn.Linear) and module is not head
    }
    return sorted(names)


def read_lora_init(lora_args: LoraArguments) -> Any | None:
    """`lora_init`'s saved LoRA config after checking its folder, rank and alpha (None without `lora_init`).

    Cheap (one JSON file), so `train` calls it before tokenizing: a wrong path fails at once."""
    from peft import PeftConfig

    if not lora_args.lora_init:
        return None
    init = Path(lora_args.lora_init)
    if not (init / "adapter_config.json").exists():
        raise FileNotFoundError(f"lora_init: {init} has no adapter_config.json; give a run's output_dir/adapter")
    saved = PeftConfig.from_pretrained(str(init))
    _check_lora_init(
        init, [("lora_r", saved.r, lora_args.lora_r), ("lora_alpha", saved.lora_alpha, lora_args.lora_alpha)]
    )
    return saved


def _check_lora_init(init: Path, pairs: list[tuple[str, Any, Any]]) -> None:
    differ = [f"{name} {have!r} (given {want!r})" for name, have, want in pairs if have != want]
    if differ:
        raise ValueError(f"lora_init: {init} was trained with {', '.join(differ)}; give its values")


def load_model_for_training(model_args: ModelArguments, lora_args: LoraArguments, bf16: bool) -> tuple[Any, str]:
    """The base model with fresh LoRA adapters on it (or `lora_init`'s, trainable), and the resolved folder/id."""
    from peft import LoraConfig, PeftModel, get_peft_model
    from transformers import AutoModelForCausalLM

    saved = read_lora_init(lora_args)
    path = resolve_model(model_args.model)
    model = AutoModelForCausalLM.from_pretrained(
        path, dtype=base_dtype(model_args, bf16), attn_implementation=model_args.attn_implementation
    )
    config = LoraConfig(
        r=lora_args.lora_r,
        lora_alpha=lora_args.lora_alpha,
        lora_dropout=lora_args.lora_dropout,
        target_modules=targets
        if (targets := lora_args.target_modules()) != "all-linear"
        else linear_module_names(model),
        task_type="CAUSAL_LM",
    )
    if saved is None:
        return get_peft_model(model, config), path
    init = Path(lora_args.lora_init)
    _check_lora_init(init, [("target modules", sorted(saved.target_modules), sorted(config.target_modules))])
    # Our config (same shape) rather than the saved one, so this run's dropout applies.
    return PeftModel.from_pretrained(model, str(init), config=config, is_trainable=True), path


def load_splits(data_args: DataArguments) -> tuple[Any, Any | None]:
    from datasets import load_from_disk

    folder = Path(data_args.dataset)
    if (folder / "dataset" / "dataset_dict.json").exists():  # the `simplan build --out` folder
        folder = folder / "dataset"
    if not folder.exists():
        raise FileNotFoundError(f"dataset: {folder} does not exist; build it with `simplan build --out {folder} ...`")
    data = load_from_disk(str(folder))
    if not hasattr(data, "keys"):
        raise ValueError(
            f"dataset: {folder} holds a single Dataset; expected a DatasetDict by fold from `simplan build`"
        )
    if data_args.train_split not in data:
        raise ValueError(f"train_split: {data_args.train_split!r} is not a fold of {folder} (folds: {list(data)})")
    train = data[data_args.train_split]
    if data_args.max_train_examples:
        train = train.select(range(min(len(train), data_args.max_train_examples)))
    dev = None
    if data_args.eval_split and data_args.eval_split in data and len(data[data_args.eval_split]):
        dev = data[data_args.eval_split]
        if data_args.max_eval_examples:
            dev = dev.shuffle(seed=0).select(range(min(len(dev), data_args.max_eval_examples)))
    return train, dev


# What `Trainer._save_checkpoint` writes, in this order: the weights (a PEFT adapter, or a whole model
# when not LoRA), optimizer and scheduler, RNG state, and trainer_state.json last. A save cut short
# (a killed job, a full disk) leaves a prefix of these; resuming from it fails on every rerun.
CHECKPOINT_WEIGHTS = (
    "adapter_model.safetensors",
    "adapter_model.bin",
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
)
CHECKPOINT_NAME = re.compile(r"checkpoint-(\d+)")
CHECKPOINT_STATE = (("trainer_state.json",), ("optimizer.pt", "optimizer.bin"), ("scheduler.pt",), CHECKPOINT_WEIGHTS)


def checkpoint_problem(folder: Path) -> str | None:
    """Why `folder` (a `checkpoint-N`) cannot be resumed from, or None when it is complete."""
    for names in CHECKPOINT_STATE:
        if not any((folder / name).is_file() and (folder / name).stat().st_size > 0 for name in names):
            return f"no {' or '.join(names)}"
    try:
        step = json.loads((folder / "trainer_state.json").read_text(encoding="utf-8"))["global_step"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        return f"trainer_state.json unreadable ({type(e).__name__})"
    if f"checkpoint-{step}" != folder.name:
        return f"trainer_state.json is at step {step}"
    return None


def _last_checkpoint(output_dir: Path) -> str | None:
    """The highest-numbered complete checkpoint in `output_dir`; incomplete ones are skipped, and said so."""
    if not output_dir.is_dir():
        return None
    numbered = [(int(m.group(1)), d) for d in output_dir.iterdir() if (m := CHECKPOINT_NAME.fullmatch(d.name))]
    skipped: list[str] = []
    found = None
    for _, folder in sorted(numbered, reverse=True):
        problem = checkpoint_problem(folder) if folder.is_dir() else "not a folder"
        if problem is None:
            found = folder
            break
        skipped.append(f"{folder.name} is incomplete ({problem})")
    if skipped:
        then = f"resuming from {found.name}" if found else "no complete checkpoint: starting over"
        print(f"train: {'; '.join(skipped)}: {then}", file=sys.stderr, flush=True)
    return str(found) if found else None


def trim_metrics(path: Path, global_step: int) -> int:
    """Drop the records of `path` logged after `global_step` (rewritten atomically); returns how many.

    A run resumed from checkpoint-N trains and logs steps N+1... again: without this the steps an
    interrupted run logged after its last checkpoint would appear twice. A line that does not read
    (a torn last line) is dropped too; a record with no step is kept."""
    if not path.exists():
        return 0
    kept: list[bytes] = []
    dropped = 0
    for line in iter_jsonl_lines(path):
        try:
            record = json.loads(line.text) if line.text is not None else None
        except ValueError:
            record = None
        step = record.get("step") if isinstance(record, dict) else None
        if record is None or (isinstance(step, int) and step > global_step):
            dropped += 1
        else:
            kept.append(line.raw if line.raw.endswith(b"\n") else line.raw + b"\n")
    if dropped:
        with atomic_open(path, "wb") as f:
            f.writelines(kept)
    return dropped


# Keys that may change between an interrupted run and its resumption without changing what is trained.
RESUMABLE_CHANGES = frozenset(
    {
        "max_steps",
        "max_minutes",
        "num_threads",
        "logging_steps",
        "save_steps",
        "save_total_limit",
        "eval_steps",
        "max_eval_examples",
        "per_device_eval_batch_size",
        "dataloader_num_workers",
        "report_to",
        "resume",
        "output_dir",  # a copied or renamed run folder resumes where it is now
    }
)


def check_resumable(out: Path, resolved: dict[str, Any]) -> None:
    """Refuse to continue a checkpoint trained under a different recipe: the mix would be neither run."""
    saved_path = out / "config.yaml"
    if not saved_path.exists():
        return
    saved = yaml.safe_load(saved_path.read_text()) or {}
    changed = sorted(
        k for k in resolved.keys() & saved.keys() if k not in RESUMABLE_CHANGES and saved[k] != resolved[k]
    )
    if changed:
        diffs = ", ".join(f"{k}: {saved[k]!r} -> {resolved[k]!r}" for k in changed)
        raise ValueError(
            f"output_dir: {out} holds checkpoints of a run with a different configuration ({diffs}); "
            "give a new --output_dir, or --resume false to start over there"
        )


def _save_adapter(model: Any, tokenizer: Any, out: Path, settings: PromptSettings | None) -> None:
    """Write the PEFT adapter + tokenizer (+ the dataset's prompt settings) to `out` atomically (a crash
    leaves the old one intact)."""
    with atomic_dir(out) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        if settings is not None:
            write_settings(tmp, settings)


def dataset_settings(data_args: DataArguments) -> PromptSettings | None:
    """The prompt settings the dataset was built with (None for a dataset built before they travelled)."""
    folder = Path(data_args.dataset)
    return read_settings(folder) or (read_settings(folder.parent) if folder.name == "dataset" else None)


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
    """Train a LoRA adapter; rerunning with the same output_dir resumes from its last checkpoint."""
    if train_args.num_threads:
        torch.set_num_threads(train_args.num_threads)
    out = Path(train_args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    bf16 = use_bf16(train_args)
    arguments = {k: v for c in (model_args, lora_args, data_args, train_args) for k, v in vars(c).items()}
    checkpoint = _last_checkpoint(out) if train_args.resume else None
    if checkpoint:
        check_resumable(out, arguments)
    read_lora_init(lora_args)

    tokenizer = load_tokenizer(model_args.model)
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
    train_raw, dev_raw = load_splits(data_args)
    train_ds, dropped_train = tokenize_dataset(train_raw, tokenizer, data_args.max_length, "tokenize train")
    if len(train_ds) == 0:
        raise ValueError(
            f"max_length: all {dropped_train} training examples of {data_args.dataset} are longer than "
            f"{data_args.max_length} tokens; raise max_length or rebuild the dataset with a smaller prompt budget"
        )
    dev_ds, dropped_dev = (None, 0)
    if dev_raw is not None:
        dev_ds, dropped_dev = tokenize_dataset(dev_raw, tokenizer, data_args.max_length, "tokenize dev")
        dev_ds = dev_ds if len(dev_ds) else None

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

    collator = (
        PackingCollator()
        if train_args.batching == "packed"
        else PaddingCollator(tokenizer.pad_token_id, pad_to_multiple_of=8 if torch.cuda.is_available() else None)
    )
    timer = TimeLimitCallback(train_args.max_minutes)
    trainer = SimplanTrainer(
        model=model,
        args=training_arguments(train_args, bf16, dev_ds is not None),
        train_dataset=train_ds,
        eval_dataset=dev_ds,
        data_collator=collator,
        processing_class=tokenizer,
        callbacks=[JsonlMetricsCallback(out / "metrics.jsonl"), timer],
        completion_only_logits=train_args.completion_only_logits,
    )
    if checkpoint:
        print(f"train: resuming from {checkpoint}", flush=True)
    if trainer.is_world_process_zero():  # steps after the starting point are logged again, so not kept twice
        start_step = int(Path(checkpoint).name.split("-")[-1]) if checkpoint else 0
        if dropped := trim_metrics(out / "metrics.jsonl", start_step):
            print(f"train: dropped {dropped} metrics.jsonl line(s) logged after step {start_step}", flush=True)
    started = time.perf_counter()
    result = trainer.train(resume_from_checkpoint=checkpoint)
    seconds = time.perf_counter() - started

    metrics: dict[str, Any] = dict(result.metrics)
    if dev_ds is not None:
        step = trainer.state.global_step
        final = [r for r in trainer.state.log_history if "eval_loss" in r and r.get("step") == step]
        metrics.update({k: v for k, v in final[-1].items() if k.startswith("eval_")} if final else trainer.evaluate())
    trainable, total = model.get_nb_trainable_parameters()
    metrics.update(
        {
            "global_step": trainer.state.global_step,
            "stopped_by_max_minutes_at_step": timer.stopped_at,
            "resumed_from": checkpoint,
            "train_examples": len(train_ds),
            "train_dropped_over_max_length": dropped_train,
            "eval_examples": len(dev_ds) if dev_ds is not None else 0,
            "eval_dropped_over_max_length": dropped_dev,
            "tokens_seen_this_run": trainer.tokens_seen,
            "tokens_per_s": round(trainer.tokens_seen / max(seconds, 1e-9), 1),
            "trainable_params": trainable,
            "total_params": total,
            "bf16": bf16,
            "eos_matches_chat_template": eos_ok,
            "model": model_path,
        }
    )
    adapter_dir = out / "adapter"
    if trainer.is_world_process_zero():
        _save_adapter(trainer.accelerator.unwrap_model(model), tokenizer, adapter_dir, dataset_settings(data_args))
        write_json(out / "metrics.json", metrics)
        print(json.dumps({k: metrics[k] for k in sorted(metrics) if "loss" in k or k == "global_step"}), flush=True)
        print(f"train: adapter saved to {adapter_dir}", flush=True)
    return TrainResult(output_dir=out, adapter_dir=adapter_dir, metrics=metrics)
