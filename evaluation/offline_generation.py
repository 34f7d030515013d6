"""The outputs `simplan eval-model` scores: greedy generation with transformers (+ peft), or `--decode choices`.

    outputs, facts = generate_variants(cfg, rows)     # {"base"/"adapter": (texts, stopped with EOS, seconds)}

With an adapter the base model is generated too (`compare_base`), from the same loaded weights with the
adapter disabled. `--decode choices` scores each row's valid actions whole through the planner's hf engine
(inference/engines/hf_peft.py) and takes the most likely one. torch and transformers are imported on the
first call. evaluation/offline.py describes the decoding modes.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from simplan.data.format import prompt_text
from simplan.evaluation.offline_config import EvalModelConfig

Outputs = dict[str, tuple[list[str], list[bool] | None, float]]  # variant -> (texts, stopped EOS, seconds)


def generate(
    model: Any, tokenizer: Any, prompts: list[list[dict[str, str]]], batch_size: int, max_new_tokens: int
) -> tuple[list[str], list[bool]]:
    """Greedy completions (text without EOS) and whether each stopped with EOS, in input order."""
    import torch
    from tqdm.auto import tqdm

    texts = [prompt_text(tokenizer, p) for p in prompts]
    lengths = [len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]
    order = sorted(range(len(texts)), key=lambda i: -lengths[i])  # similar lengths batch with little padding
    outputs: list[str] = [""] * len(texts)
    stopped: list[bool] = [False] * len(texts)
    tokenizer.padding_side = "left"  # generation continues every row from its own last token
    for start in tqdm(range(0, len(order), batch_size), desc="generate", unit="batch"):
        idx = order[start : start + batch_size]
        enc = tokenizer([texts[i] for i in idx], add_special_tokens=False, padding=True, return_tensors="pt")
        enc = enc.to(model.device)
        with torch.no_grad():
            out = model.generate(
                **enc,
                max_new_tokens=max_new_tokens,
                do_sample=False,
                pad_token_id=tokenizer.pad_token_id,
                eos_token_id=tokenizer.eos_token_id,
            )
        for row, i in zip(out[:, enc["input_ids"].shape[1] :].tolist(), idx):
            if tokenizer.eos_token_id in row:
                row = row[: row.index(tokenizer.eos_token_id)]
                stopped[i] = True
            outputs[i] = tokenizer.decode(row, skip_special_tokens=True)
    return outputs, stopped


def generate_variants(cfg: EvalModelConfig, rows: list[dict[str, Any]]) -> tuple[Outputs, dict[str, Any]]:
    """Greedy outputs of the base model and/or the adapter; also the run's facts (device, token cap)."""
    import torch
    from transformers import AutoModelForCausalLM

    from simplan.models.registry import load_tokenizer, pick_device, resolve_model
    from simplan.training.lora import bf16_supported

    if cfg.num_threads:
        torch.set_num_threads(cfg.num_threads)
    if cfg.adapter and not (Path(cfg.adapter) / "adapter_config.json").exists():
        raise FileNotFoundError(f"adapter: {cfg.adapter} has no adapter_config.json; give train's output/adapter")
    device = pick_device(cfg.device)
    tokenizer = load_tokenizer(cfg.model)
    dtype = getattr(torch, cfg.dtype) if cfg.dtype != "auto" else None
    if dtype is None:
        dtype = torch.bfloat16 if bf16_supported() else torch.float32
    max_new = cfg.max_new_tokens or (
        max(len(ids) for ids in tokenizer([r["completion"] for r in rows], add_special_tokens=False)["input_ids"]) + 16
    )
    variants: list[str] = (["base"] if not cfg.adapter or cfg.compare_base else []) + (
        ["adapter"] if cfg.adapter else []
    )
    facts = {"device": device, "max_new_tokens": max_new}
    if cfg.decode == "choices":
        return choose_variants(cfg, rows, variants, str(dtype).removeprefix("torch."), device, max_new), facts
    model = AutoModelForCausalLM.from_pretrained(resolve_model(cfg.model), dtype=dtype).to(device).eval()
    if cfg.adapter:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, cfg.adapter).eval()
    prompts = [r["prompt"] for r in rows]
    outputs: Outputs = {}
    for variant in variants:
        started = time.perf_counter()
        if variant == "base" and cfg.adapter:
            with model.disable_adapter():
                preds, stopped = generate(model, tokenizer, prompts, cfg.batch_size, max_new)
        else:
            preds, stopped = generate(model, tokenizer, prompts, cfg.batch_size, max_new)
        outputs[variant] = (preds, stopped, time.perf_counter() - started)
    return outputs, facts


def choose_variants(
    cfg: EvalModelConfig, rows: list[dict[str, Any]], variants: list[str], dtype: str, device: str, max_new: int
) -> Outputs:
    """`--decode choices`: each variant's most likely valid action per row, through the planner's hf engine."""
    from tqdm.auto import tqdm

    from simplan.inference.engines.base import GenerationRequest, checked_generation
    from simplan.inference.engines.hf_peft import HFPeftEngine

    engine = HFPeftEngine(
        cfg.model,
        {"adapter": cfg.adapter} if cfg.adapter else None,
        dtype=dtype,
        batch_size=cfg.batch_size,
        device=device,
    )
    outputs: Outputs = {}
    for variant in variants:
        started = time.perf_counter()
        preds: list[str] = []
        stopped: list[bool] = []
        for r in tqdm(rows, desc=f"choose ({variant})", unit="row"):
            request = GenerationRequest(
                adapter="adapter" if variant == "adapter" else None,
                messages=r["prompt"],
                choices=list(r.get("valid_actions") or []) or None,  # none listed: free text, as the planner
                max_tokens=max_new,
            )
            # Checked and sanitized at the same engine boundary as the planner's (inference/engines/base.py).
            (result,) = checked_generation(engine, [request], engine.generate([request]))
            preds.append(result.completions[0].text)
            stopped.append(result.completions[0].finish_reason == "stop")
        outputs[variant] = (preds, stopped, time.perf_counter() - started)
    engine.close()
    return outputs
