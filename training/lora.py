"""The model a run trains: its dtype, the base model with LoRA adapters (fresh, or `lora_init`'s), the saved adapter.

    from simplan.training.lora import load_model_for_training, save_adapter, use_bf16
    model, path = load_model_for_training(ModelArguments(model="smollm2-135m-instruct"), LoraArguments(), bf16=False)
    save_adapter(model, tokenizer, Path("runs/train/x/adapter"), settings)   # peft and vLLM load this folder

`target_modules: all-linear` is written as the short names of the linear layers (`linear_module_names`),
which vLLM's LoRA loader reads. `lora_init` continues a saved adapter, after checking that its rank, alpha
and target modules are the run's (`read_lora_init`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from simplan.core.cpu import native_bf16
from simplan.core.errors import InputError, MissingInputError
from simplan.core.io import atomic_dir
from simplan.data.episode import PromptSettings, write_settings
from simplan.models.registry import resolve_model
from simplan.training.config import LoraArguments, ModelArguments, TrainArguments


def bf16_supported() -> bool:
    """bf16 autocast pays off on CUDA GPUs with bf16 and on CPUs with native bf16 (AVX512-BF16/AMX)."""
    if torch.cuda.is_available():
        return torch.cuda.is_bf16_supported()
    return native_bf16()


def use_bf16(train_args: TrainArguments) -> bool:
    if train_args.bf16 == "auto":
        return bf16_supported()
    return train_args.bf16 == "true"


def base_dtype(model_args: ModelArguments, bf16: bool) -> torch.dtype:
    if model_args.dtype == "auto":
        return torch.bfloat16 if bf16 else torch.float32
    return getattr(torch, model_args.dtype)


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
        raise MissingInputError(f"lora_init: {init} has no adapter_config.json; give a run's output_dir/adapter")
    saved = PeftConfig.from_pretrained(str(init))
    _check_lora_init(
        init, [("lora_r", saved.r, lora_args.lora_r), ("lora_alpha", saved.lora_alpha, lora_args.lora_alpha)]
    )
    return saved


def _check_lora_init(init: Path, pairs: list[tuple[str, Any, Any]]) -> None:
    differ = [f"{name} {have!r} (given {want!r})" for name, have, want in pairs if have != want]
    if differ:
        raise InputError(f"lora_init: {init} was trained with {', '.join(differ)}; give its values")


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
        return with_mask_dropout(get_peft_model(model, config)), path
    init = Path(lora_args.lora_init)
    _check_lora_init(init, [("target modules", sorted(saved.target_modules), sorted(config.target_modules))])
    # Our config (same shape) rather than the saved one, so this run's dropout applies.
    return with_mask_dropout(PeftModel.from_pretrained(model, str(init), config=config, is_trainable=True)), path


class MaskDropout(torch.nn.Dropout):
    """nn.Dropout through `torch.native_dropout`, whose backward keeps a bool mask (1 byte an element). On the
    CPU `F.dropout` keeps a float32 noise tensor instead (4 bytes), and peft's LoRA dropout runs on the float32
    copy of every adapted layer's input: at 4 x 1,024 tokens on SmolLM2-135M that noise is 2.3 GB of the
    6.4 GB the backward keeps. Same distribution (keep with 1 - p, scale by 1 / (1 - p)); CUDA's F.dropout is
    this kernel already."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0:
            return x
        return torch.native_dropout(x, self.p, True)[0]


def with_mask_dropout(model: torch.nn.Module) -> torch.nn.Module:
    """`model` with every LoRA dropout (peft's `lora_dropout` nn.Dropout modules) a `MaskDropout` of the same p."""
    for module in model.modules():
        dropouts = getattr(module, "lora_dropout", None)
        if isinstance(dropouts, torch.nn.ModuleDict):
            for name, d in dropouts.items():
                if type(d) is torch.nn.Dropout:
                    dropouts[name] = MaskDropout(d.p)
    return model


def save_adapter(model: Any, tokenizer: Any, out: Path, settings: PromptSettings | None) -> None:
    """Write the PEFT adapter + tokenizer (+ the dataset's prompt settings) to `out` atomically (a crash
    leaves the old one intact)."""
    with atomic_dir(out) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        if settings is not None:
            write_settings(tmp, settings)
