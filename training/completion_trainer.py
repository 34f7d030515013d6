"""The transformers Trainer of a simplan run: the loss at completion positions only, tokens counted, two callbacks.

    from simplan.training.completion_trainer import JsonlMetricsCallback, SimplanTrainer, TimeLimitCallback
    trainer = SimplanTrainer(model=model, args=training_args, train_dataset=train_ds, data_collator=collator,
                             callbacks=[JsonlMetricsCallback(out / "metrics.jsonl"), TimeLimitCallback(30)])

`completion_loss` runs the LM head only at the positions that carry a label (the model's own
`logits_to_keep`), which on the CPU is the largest single saving of training (123.5 -> 159.0 tokens/s on
TWX decider data, 2 cores); the loss is identical. `SimplanTrainer` logs `tokens_seen` and `tokens_per_s`
with the loss; `JsonlMetricsCallback` appends every log record to a JSONL file; `TimeLimitCallback` stops
a run after a wall-clock budget, saving as at a normal end. training/trainer.py's `train` builds it.
"""

from __future__ import annotations

import inspect
import os
import time
from pathlib import Path
from typing import Any

import torch
from transformers import Trainer, TrainerCallback

from simplan.core.io import append_jsonl
from simplan.training.examples import IGNORE_INDEX


# ---------------------------------------------------------------------------------------------
# The trainer: loss at completion positions only
# ---------------------------------------------------------------------------------------------
def completion_loss(
    model: torch.nn.Module,
    inputs: dict[str, torch.Tensor],
    num_items_in_batch: torch.Tensor | int | None = None,
    lm_head_chunk: int = 0,
) -> torch.Tensor:
    """Next-token cross-entropy over labelled positions, running the LM head only where labels are.

    With `lm_head_chunk` > 0 (and a frozen LM head, as under LoRA) the model returns its last hidden state,
    and `ChunkedHeadLoss` runs the LM head on the labelled tokens alone, `lm_head_chunk` of them at a time:
    the [tokens, vocab] logits never exist whole and none are kept for the backward. Otherwise
    `logits_to_keep` (a tensor of sequence positions, shared by the batch) asks the model for logits at the
    union of the batch's labelled positions; with length-grouped batches that is a few dozen columns instead
    of hundreds, and with packing it is exact. Both return the sum over labelled tokens divided by
    `num_items_in_batch` when given (the Trainer's token count over the whole accumulated batch), else the mean.
    """
    labels = inputs["labels"]
    shift_labels = labels[:, 1:]
    valid = labelled_positions(labels)
    model_inputs = {k: v for k, v in inputs.items() if k != "labels"}
    head = _unwrap(model).get_output_embeddings()
    if lm_head_chunk > 0 and not head.weight.requires_grad and not _scales_logits(_unwrap(model).config):
        # logits_to_keep=1: the model's own LM head runs on one position only; hidden_states[-1] is the
        # final-normed state the LM head reads (transformers ties it to last_hidden_state)
        out = model(**model_inputs, logits_to_keep=1, output_hidden_states=True, use_cache=False)
        hidden = out.hidden_states[-1][:, :-1][valid]  # [labelled tokens, hidden]
        del out  # the other layers' states are not needed for the backward
        loss = ChunkedHeadLoss.apply(hidden, head.weight, head.bias, shift_labels[valid], lm_head_chunk)
    else:
        keep = valid.any(dim=0).nonzero().squeeze(-1)  # positions t whose logits predict a label at t+1
        if keep.numel() == 0:
            keep = torch.zeros(1, dtype=torch.long, device=labels.device)
        logits = model(**model_inputs, logits_to_keep=keep, use_cache=False).logits  # [B, len(keep), V]
        targets = shift_labels[:, keep]
        loss = torch.nn.functional.cross_entropy(
            logits.float().reshape(-1, logits.shape[-1]),
            targets.reshape(-1),
            ignore_index=IGNORE_INDEX,
            reduction="sum",
        )
    if num_items_in_batch is None:
        return loss / valid.sum().clamp(min=1)
    if torch.is_tensor(num_items_in_batch):
        num_items_in_batch = num_items_in_batch.to(loss.device)
    return loss / num_items_in_batch


def labelled_positions(labels: torch.Tensor) -> torch.Tensor:
    """Where a next-token label is predicted: [B, T-1] booleans over the shifted labels."""
    return labels[:, 1:] != IGNORE_INDEX


def labelled_tokens(labels: torch.Tensor) -> int:
    """How many tokens a batch's loss is over (the denominator of its token mean)."""
    return int(labelled_positions(labels).sum())


class ChunkedHeadLoss(torch.autograd.Function):
    """Summed cross-entropy of the LM head's logits `hidden @ weight.T (+ bias)` against `targets`, for a frozen
    LM head, computed `chunk` tokens at a time.

    The forward makes each chunk's logits (in the autocast dtype, as the LM head would), its float32 log-softmax
    loss and, when a gradient is wanted, the gradient of that loss w.r.t. the chunk's hidden states, which is
    all the backward needs (the weights get none); the logits are freed chunk by chunk. Memory: one chunk's
    logits (~10 bytes x chunk x vocab) instead of ~14 bytes x tokens x vocab, and no extra matmul."""

    @staticmethod
    def forward(
        ctx: Any,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        targets: torch.Tensor,
        chunk: int,
    ) -> torch.Tensor:
        wants_grad = ctx.needs_input_grad[0]
        loss = torch.zeros((), dtype=torch.float32, device=hidden.device)
        grad = torch.empty_like(hidden) if wants_grad else None
        for start in range(0, hidden.shape[0], chunk):
            h, t = hidden[start : start + chunk], targets[start : start + chunk]
            # The head's dtype: accelerate hands the model's outputs back in float32, outside autocast
            logits = torch.nn.functional.linear(h.to(weight.dtype), weight, bias).float()
            log_probs = torch.log_softmax(logits, dim=-1)
            del logits
            rows = torch.arange(t.shape[0], device=t.device)
            loss -= log_probs[rows, t].sum()
            if wants_grad:  # d(-log p_t)/d logits = softmax - one_hot(t)
                probs = log_probs.exp_()
                probs[rows, t] -= 1.0
                grad[start : start + chunk] = torch.matmul(probs.to(weight.dtype), weight).to(hidden.dtype)
            del log_probs
        ctx.save_for_backward(grad)
        return loss

    @staticmethod
    def backward(ctx: Any, grad_loss: torch.Tensor) -> tuple[torch.Tensor | None, None, None, None, None]:
        (grad,) = ctx.saved_tensors
        return grad * grad_loss.to(grad.dtype), None, None, None, None


def _scales_logits(config: Any) -> bool:
    """Whether the model changes its logits after the LM head (softcapping, a logit scale), which the chunked
    loss would not do."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    return any(getattr(text, k, None) not in (None, 1.0) for k in ("final_logit_softcapping", "logit_scale"))


def _unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The transformers model inside DDP/FSDP wrappers and peft."""
    inner = model
    while True:
        if hasattr(inner, "module") and isinstance(inner.module, torch.nn.Module):
            inner = inner.module
        elif hasattr(inner, "get_base_model"):
            inner = inner.get_base_model()
        else:
            return inner


def _accepts_logits_to_keep(model: torch.nn.Module) -> bool:
    return "logits_to_keep" in inspect.signature(_unwrap(model).forward).parameters


def real_tokens(inputs: dict[str, torch.Tensor]) -> int:
    """Non-padding tokens of a batch. A 4D tree mask (training/packing.py) has no padding column to sum: a real
    token attends to the sequence's first token, a padding token only to itself."""
    mask = inputs.get("attention_mask")
    if mask is None:
        return inputs["input_ids"].numel()
    if mask.dim() == 4:
        return int((mask[:, 0, :, 0] == 0).sum())
    return int(mask.sum())


class SimplanTrainer(Trainer):
    """transformers Trainer that computes the LM head at completion positions only and counts tokens.

    Its eval loss is the mean over every labelled token of the eval set (the training loss's definition), not
    the Trainer's mean of per-batch means, which moves with `per_device_eval_batch_size` when completions differ
    in length (one simulator adapter: 0.754 at batch 8, 0.975 at batch 1)."""

    def __init__(self, *args: Any, completion_only_logits: bool = True, lm_head_chunk: int = 0, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.completion_only_logits = completion_only_logits and _accepts_logits_to_keep(self.model)
        self.lm_head_chunk = lm_head_chunk
        self.tokens_seen = 0  # non-padding tokens trained on by this process
        self._last_log = (time.perf_counter(), 0)
        self._eval_sum = [0.0, 0]  # summed loss and labelled tokens of the evaluation running now

    def compute_loss(
        self,
        model: torch.nn.Module,
        inputs: dict[str, torch.Tensor],
        return_outputs: bool = False,
        num_items_in_batch: torch.Tensor | int | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, Any]:
        if model.training:
            self.tokens_seen += real_tokens(inputs)
        if not self.completion_only_logits:
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        if not model.training:  # evaluation: the batch's summed loss, counted toward the eval set's token mean
            summed = completion_loss(model, inputs, 1, self.lm_head_chunk)  # divided by 1: the sum
            tokens = labelled_tokens(inputs["labels"])
            self._eval_sum[0] += float(summed.detach())
            self._eval_sum[1] += tokens
            loss = summed / max(tokens, 1)
            return (loss, {"loss": loss}) if return_outputs else loss
        if not self.model_accepts_loss_kwargs:
            num_items_in_batch = None  # the Trainer then averages over gradient accumulation itself
        loss = completion_loss(model, inputs, num_items_in_batch, self.lm_head_chunk)
        if self.args.average_tokens_across_devices and num_items_in_batch is not None:
            loss = loss * self.accelerator.num_processes  # DDP averages gradients; undo it for a token mean
        return (loss, {"loss": loss}) if return_outputs else loss

    def evaluation_loop(self, *args: Any, **kwargs: Any) -> Any:
        """The Trainer's loop, its loss replaced by the token mean over the whole eval set (every process's)."""
        self._eval_sum = [0.0, 0]
        output = super().evaluation_loop(*args, **kwargs)
        prefix = kwargs.get("metric_key_prefix", args[4] if len(args) > 4 else "eval")
        totals = torch.tensor(self._eval_sum, dtype=torch.float64, device=self.args.device)
        summed, tokens = self.accelerator.reduce(totals, reduction="sum").tolist()
        if tokens > 0 and f"{prefix}_loss" in output.metrics:
            output.metrics[f"{prefix}_loss"] = summed / tokens
        return output

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
        if not self.seconds:
            return
        over = time.perf_counter() - self.started >= self.seconds
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            # every process stops at the same step (one that went on alone would wait forever for the others):
            # process 0's clock decides
            flag = torch.tensor([int(over)])
            torch.distributed.broadcast(flag, src=0)
            over = bool(flag.item())
        if over and not control.should_training_stop:
            control.should_training_stop = True
            control.should_save = True
            self.stopped_at = state.global_step
