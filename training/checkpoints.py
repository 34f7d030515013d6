"""Checkpoints of a run: the last complete one to resume from, metrics logged after it, a changed recipe refused.

    from simplan.training.checkpoints import check_resumable, last_checkpoint, trim_metrics
    checkpoint = last_checkpoint(Path("runs/train/x"))          # "runs/train/x/checkpoint-40", or None
    trim_metrics(Path("runs/train/x/metrics.jsonl"), 40)        # drops the lines logged after step 40

A checkpoint whose save was cut short (a killed job, a full disk) is skipped, said so on stderr, and moved aside
to `torn-checkpoint-N` (a name the Trainer's checkpoint rotation does not match) so the next save of step N starts
clean. Cut short means a file missing or empty, or cut mid-file: every safetensors file is checked against the
sizes its header declares and every torch file (optimizer.pt, scheduler.pt, rng_state.pth, *.bin: zip archives)
for a whole central directory whose members lie inside the file; nothing is loaded, so the check costs
milliseconds however large the checkpoint.
`check_resumable` refuses to continue a checkpoint trained under another configuration, except for the
keys in `RESUMABLE_CHANGES`. training/trainer.py's `train` calls these when it resumes.
"""

from __future__ import annotations

import json
import re
import struct
import sys
import zipfile
from pathlib import Path
from typing import Any

import yaml

from simplan.core.errors import InputError
from simplan.core.io import atomic_open, iter_jsonl_lines

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


TORCH_SUFFIXES = (".pt", ".pth", ".bin")


def checkpoint_problem(folder: Path) -> str | None:
    """Why `folder` (a `checkpoint-N`) cannot be resumed from, or None when it is complete."""
    for names in CHECKPOINT_STATE:
        if not any((folder / name).is_file() and (folder / name).stat().st_size > 0 for name in names):
            return f"no {' or '.join(names)}"
    for path in sorted(folder.iterdir()):
        problem = None
        if path.suffix == ".safetensors":
            problem = safetensors_problem(path)
        elif path.suffix in TORCH_SUFFIXES:
            problem = torch_file_problem(path)
        if problem:
            return f"{path.name} {problem}"
    try:
        step = json.loads((folder / "trainer_state.json").read_text(encoding="utf-8"))["global_step"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        return f"trainer_state.json unreadable ({type(e).__name__})"
    if f"checkpoint-{step}" != folder.name:
        return f"trainer_state.json is at step {step}"
    return None


def safetensors_problem(path: Path) -> str | None:
    """Why the safetensors file `path` is not whole (the sizes its header declares), or None."""
    size = path.stat().st_size
    try:
        with path.open("rb") as f:
            (header_len,) = struct.unpack("<Q", f.read(8))
            if header_len > size - 8:
                return f"is cut short ({size:,} bytes, its header alone declares {header_len + 8:,})"
            header = json.loads(f.read(header_len))
    except (OSError, struct.error, ValueError) as e:
        return f"has no readable header ({type(e).__name__})"
    ends = [t["data_offsets"][1] for k, t in header.items() if k != "__metadata__" and isinstance(t, dict)]
    expected = 8 + header_len + max(ends, default=0)
    if size < expected:
        return f"is cut short ({size:,} of {expected:,} bytes)"
    return None


def torch_file_problem(path: Path) -> str | None:
    """Why the torch.save file `path` is not whole (a zip archive since torch 1.6), or None."""
    size = path.stat().st_size
    try:
        with zipfile.ZipFile(path) as archive:
            for info in archive.infolist():
                if info.header_offset + info.compress_size > size:
                    return f"is cut short (member {info.filename} runs past its {size:,} bytes)"
    except (OSError, zipfile.BadZipFile) as e:
        return f"is cut short or not a torch file ({size:,} bytes; {e})"
    return None


def move_aside(folder: Path) -> Path | None:
    """Rename a torn `checkpoint-N` to `torn-checkpoint-N` (or `-2`, ...); the new path, None if it could not be."""
    for i in range(1, 100):
        target = folder.with_name(f"torn-{folder.name}" + (f"-{i}" if i > 1 else ""))
        if target.exists():
            continue
        try:
            folder.rename(target)
        except OSError:  # another rank of a distributed run moved it first, or the folder is read-only
            return None
        return target
    return None


def last_checkpoint(output_dir: Path) -> str | None:
    """The highest-numbered complete checkpoint in `output_dir`; incomplete ones are skipped, moved aside (module
    docstring) and said so."""
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
        moved = move_aside(folder) if folder.is_dir() else None
        skipped.append(f"{folder.name} is incomplete ({problem})" + (f", moved to {moved.name}" if moved else ""))
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
        "malloc_mmap_threshold",  # where the allocator keeps memory, not what is trained
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
        raise InputError(
            f"output_dir: {out} holds checkpoints of a run with a different configuration ({diffs}); "
            "give a new --output_dir, or --resume false to start over there"
        )
