"""Engine backends behind the inference/engines/base.py protocol, chosen by name.

    from simplan.inference.engines import make_engine
    engine = make_engine("hf", "smollm2-135m-instruct", {"decider": "runs/decider", "simulator": "runs/sim"})
    engine = make_engine("vllm", model, adapters, dtype="bfloat16", kv_cache_gib=2)
    engine = make_engine("vllm", model, adapters, merge_adapters=True)   # one merged model per adapter, no LoRA
    engine = engine_from_config(cfg)   # cfg: EngineConfig; merge_adapters "auto" merges on the CPU (resolve_merge)
    engine = engine_from_config(cfg, concurrent=True)   # an eval: lanes "auto" runs one engine process per core
                                                        # on a CPU (resolve_lanes, inference/engines/lanes.py)
    engine = make_engine("openai", model, adapters, base_url="http://127.0.0.1:8000/v1")   # simplan serve

Backends import their heavy dependencies lazily, so importing this package is cheap. Measured on
2 CPU cores (docs/serving-and-engines.md, bench/bench_engines.py): with LoRA, transformers+peft is faster than vLLM
on the CPU; on a GPU vLLM is much faster. Choose per platform.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from simplan.core.errors import InputError
from simplan.inference.engines.base import Engine
from simplan.inference.engines.config import (
    BACKEND_OPTIONS,
    KINDS,
    LOCAL_OPTIONS,
    MODEL_FREE_KINDS,
    EngineConfig,
    check_adapter_folders,
    parse_adapters,
    resolve_lanes,
    resolve_merge,
)


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
    valid = accepted_options(kind)
    unknown = sorted(set(opts) - set(valid))
    if unknown:
        raise TypeError(
            f"engine {kind!r}: unknown option(s) {', '.join(unknown)}; valid: {', '.join(valid) or 'none'}"
        )
    if kind in MODEL_FREE_KINDS:  # the model and adapters are not used: the env decides
        from simplan.inference.engines.model_free import ModelFreeEngine

        return ModelFreeEngine(kind, **opts)  # type: ignore[return-value]
    named = checked_adapters(kind, adapters)
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


def checked_adapters(kind: str, adapters: dict[str, str] | list[str] | str | None) -> dict[str, str]:
    """`adapters` as {name: folder}, each a folder the user gave (the openai backend needs only the names)."""
    named = parse_adapters(adapters)
    missing = [name for name, path in named.items() if not path]
    if missing and kind != "openai":
        raise InputError(f"engine {kind!r}: adapter(s) {', '.join(missing)} need a folder: give name=DIR")
    if kind != "openai":
        check_adapter_folders(named)
    return named


def accepted_options(kind: str) -> tuple[str, ...]:
    """The keyword options make_engine takes for `kind`: its section's fields (inference/engines/config.py
    BACKEND_OPTIONS), plus dtype, threads and merge_adapters where the model runs in this process."""
    section = BACKEND_OPTIONS[kind]
    own = tuple(f.name for f in dataclasses.fields(section)) if section is not None else ()
    return (*LOCAL_OPTIONS, *own) if kind in ("hf", "vllm") else own


def engine_from_config(cfg: EngineConfig, concurrent: bool = False) -> Engine:
    """make_engine from an EngineConfig (the flags/YAML keys of `simplan run` and `simplan eval`); `concurrent`: the
    caller runs episodes side by side (an eval), where `lanes: auto` may build engine lanes (resolve_lanes)."""
    values = cfg.options()
    if "merge_adapters" in values:  # hf, vllm: `auto` is decided here, where the platform is known
        choice = resolve_merge(cfg)
        if cfg.adapters:
            print(choice.line(), flush=True)
        values["merge_adapters"] = choice.merge
    lanes = resolve_lanes(cfg, concurrent)
    if lanes.lanes > 1:
        from simplan.inference.engines.lanes import LanedEngine

        print(lanes.line(), flush=True)
        values["threads"] = lanes.threads
        named = checked_adapters(cfg.engine, cfg.adapters)  # before any lane starts: the user's error, once
        return LanedEngine(cfg.engine, cfg.model, named, lanes.lanes, **values)  # type: ignore[return-value]
    return make_engine(cfg.engine, cfg.model, cfg.adapters, **values)


def engine_lanes(engine: Engine) -> int:
    """How many engine processes serve `engine` (inference/engines/lanes.py; 1: the engine itself)."""
    return len(getattr(engine, "lanes", None) or ()) or 1


def is_merged(engine: Engine) -> bool:
    """Whether `engine` serves its adapters from merged copies of the base (what an eval records of it)."""
    from simplan.inference.engines.merged import MergedEngine

    return isinstance(engine, MergedEngine) or getattr(engine, "merged", False) is True


__all__ = [
    "EngineConfig",
    "KINDS",
    "accepted_options",
    "engine_from_config",
    "engine_lanes",
    "is_merged",
    "make_engine",
    "parse_adapters",
    "resolve_lanes",
    "resolve_merge",
]
