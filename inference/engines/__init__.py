"""Engine backends behind the inference/engines/base.py protocol, chosen by name.

    from simplan.inference.engines import make_engine
    engine = make_engine("hf", "smollm2-135m-instruct", {"decider": "runs/decider", "simulator": "runs/sim"})
    engine = make_engine("vllm", model, adapters, dtype="bfloat16", kv_cache_gib=2)
    engine = make_engine("vllm", model, adapters, merge_adapters=True)   # one merged model per adapter, no LoRA
    engine = engine_from_config(cfg)   # cfg: EngineConfig; merge_adapters "auto" merges on the CPU (resolve_merge)
    engine = make_engine("openai", model, adapters, base_url="http://127.0.0.1:8000/v1")   # simplan serve

Backends import their heavy dependencies lazily, so importing this package is cheap. Measured on
2 CPU cores (docs/serving-and-engines.md, bench/bench_engines.py): with LoRA, transformers+peft is faster than vLLM
on the CPU; on a GPU vLLM is much faster. Choose per platform.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from simplan.inference.engines.base import Engine
from simplan.inference.engines.config import KINDS, MODEL_FREE_KINDS, EngineConfig, parse_adapters, resolve_merge

# Options each backend accepts (make_engine rejects others by name instead of ignoring them).
OPTIONS: dict[str, tuple[str, ...]] = {
    "vllm": (
        "dtype",
        "threads",
        "reserved_cpus",
        "kv_cache_gib",
        "max_model_len",
        "max_num_seqs",
        "enforce_eager",
        "seed",
        "merge_adapters",
    ),
    "openai": ("base_url", "api_key", "concurrency", "tokenizer", "timeout", "sequential_scoring"),
    "hf": ("dtype", "threads", "batch_size", "device", "merge_adapters", "prefix_cache_sessions"),
    "expert": (),  # model-free (inference/engines/model_free.py): no model, no options
    "random": ("seed",),
}


def make_engine(
    kind: str, model: str, adapters: dict[str, str] | list[str] | str | None = None, **opts: Any
) -> Engine:
    """Build the `kind` backend ("vllm" | "openai" | "hf") for `model` with named LoRA `adapters`.

    `adapters` is {name: folder}, or "name=DIR,name=DIR"; the openai backend only needs the served names
    (a list of names is enough there). `merge_adapters=True` (hf, vllm) serves each adapter from its own
    merged copy of the base instead of through LoRA (inference/engines/merged.py); this library call
    never merges unless asked, while EngineConfig's default `auto` decides by platform (engine_from_config).
    """
    if kind not in KINDS:
        raise ValueError(f"engine kind {kind!r} is not one of {', '.join(KINDS)}")
    unknown = sorted(set(opts) - set(OPTIONS[kind]))
    if unknown:
        raise TypeError(f"engine {kind!r}: unknown option(s) {', '.join(unknown)}; valid: {', '.join(OPTIONS[kind])}")
    if kind in MODEL_FREE_KINDS:  # the model and adapters are not used: the env decides
        from simplan.inference.engines.model_free import ModelFreeEngine

        return ModelFreeEngine(kind, **opts)  # type: ignore[return-value]
    named = parse_adapters(adapters)
    missing = [name for name, path in named.items() if not path]
    if missing and kind != "openai":
        raise ValueError(f"engine {kind!r}: adapter(s) {', '.join(missing)} need a folder: give name=DIR")
    if opts.pop("merge_adapters", False) and named:
        from simplan.inference.engines.merged import MergedEngine

        engine: Any = MergedEngine(kind, model, named, **opts)
    elif kind == "hf":
        from simplan.inference.engines.hf_peft import HFPeftEngine

        engine = HFPeftEngine(model, named, **opts)
    elif kind == "vllm":
        from simplan.inference.engines.vllm_local import VLLMEngine

        engine = VLLMEngine(model, named, **opts)
    else:
        from simplan.inference.engines.openai_client import OpenAIEngine

        engine = OpenAIEngine(model, list(named), **opts)
    # Local adapter folders, where each adapter's prompt settings are read (inference/planning/prompts.py); an
    # openai engine has them when --adapters names local copies of the served adapters.
    engine.adapter_dirs = {name: path for name, path in named.items() if path and Path(path).is_dir()}
    return engine


def engine_from_config(cfg: EngineConfig) -> Engine:
    """make_engine from an EngineConfig (the flags/YAML keys of `simplan run` and `simplan eval`)."""
    values = {k: getattr(cfg, k) for k in OPTIONS[cfg.engine] if hasattr(cfg, k)}
    if "merge_adapters" in values:  # hf, vllm: `auto` is decided here, where the platform is known
        choice = resolve_merge(cfg)
        if cfg.adapters:
            print(choice.line(), flush=True)
        values["merge_adapters"] = choice.merge
    return make_engine(cfg.engine, cfg.model, cfg.adapters, **values)


def is_merged(engine: Engine) -> bool:
    """Whether `engine` serves its adapters from merged copies of the base (what an eval records of it)."""
    from simplan.inference.engines.merged import MergedEngine

    return isinstance(engine, MergedEngine)


__all__ = [
    "EngineConfig",
    "KINDS",
    "OPTIONS",
    "engine_from_config",
    "is_merged",
    "make_engine",
    "parse_adapters",
    "resolve_merge",
]
