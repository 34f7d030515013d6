"""BFCL's tasks for envs/bfcl.py: questions, ground truth and function docs read from the bfcl-eval wheel; folds.

    from simplan.envs.bfcl_tasks import fold_of, function_docs, load_category, tool_schema
    entry = load_category("multi_turn_base")["multi_turn_base_12"]        # a BFCLEntry
    fold_of(entry.base_id)                                                # "train", "dev" or "test"
    tools = [tool_schema(d) for c in entry.involved_classes for d in function_docs(c)]

Tasks. The four multi-turn categories, 200 tasks each, read from the data files bundled in the
bfcl-eval wheel (no network): multi_turn_base, multi_turn_miss_func, multi_turn_miss_param and
multi_turn_long_context (`Task.family`). `task_id` is bfcl's id ("multi_turn_miss_func_12").

Folds. A task's fold is decided by its BASE id (the number after the category: "multi_turn_base_12"
and "multi_turn_miss_func_12" are variants of base task 12), so variants never cross folds:
the base ids (0-199) are ordered by `sha256(f"bfcl-multi-turn:{base_id}")` and the first 70% go
to train, the next 15% to dev, the rest to test: 140/30/30 base ids, i.e. 560/120/120 tasks (less
one unplayable task, below). `fold_of(base_id)` gives the fold. `tasks()` lists tasks ordered by
(base id, category), so a small `limit` covers all four categories.

Tools. `Observation.tools` holds one JSON schema ({name, description, parameters}) per function
documented by bfcl for the task's involved classes (bfcl's own function docs; its "dict"/"float"
types mapped to JSON-schema "object"/"number"), minus the functions the task withholds:
- miss_func: `missed_function` maps a turn index to functions held out until that turn; as in
  bfcl's inference loop they become available at that turn, whose user message is bfcl's
  "I have updated some more functions you can choose from. What about now?";
- `excluded_function` (18 base tasks and their variants): bfcl ships it but its runner ignores it;
  the ground truth never uses these functions, so they are withheld for the whole episode.
Calling a withheld or unknown function is an error observation; nothing is executed. Tasks whose
ground truth itself calls a function before bfcl makes it available are left out of `tasks()`
(in bfcl-eval 2026.3.23 only multi_turn_miss_func_49, whose turn 1 uses `tail`, held out until
turn 3): bfcl hides the doc but still executes the call, which would make withholding toothless.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from simplan.core.errors import MissingPackageError


def missing_package_error(error: ImportError) -> MissingPackageError:
    """The error raised where bfcl-eval does not import: what to install, and how."""
    return MissingPackageError(
        f"envs/bfcl.py needs bfcl-eval ({error}); install it without its heavy dependencies: "
        "`.venv/bin/pip install --no-deps bfcl-eval==2026.3.23 mpmath==1.3.0` (or run `make setup`)"
    )


try:
    import bfcl_eval
    from bfcl_eval.constants.category_mapping import VERSION_PREFIX
    from bfcl_eval.constants.executable_backend_config import (
        CLASS_FILE_PATH_MAPPING,
        MULTI_TURN_FUNC_DOC_FILE_MAPPING,
    )
except ImportError as e:  # pragma: no cover - exercised only without the package
    raise missing_package_error(e) from e

CATEGORIES: tuple[str, ...] = (
    "multi_turn_base",
    "multi_turn_miss_func",
    "multi_turn_miss_param",
    "multi_turn_long_context",
)
FOLD_SHARES: tuple[float, float] = (0.70, 0.85)  # cumulative cut points of the hash order: train | dev | test
_FOLD_SALT = "bfcl-multi-turn"
# Read the bundled files directly: importing bfcl_eval.utils would create result/ and score/
# folders inside site-packages as an import side effect.
_DATA_DIR = Path(bfcl_eval.__file__).resolve().parent / "data"
_JSON_TYPES = {"dict": "object", "float": "number", "tuple": "array", "any": None}
_CLASS_PREAMBLE = re.compile(r"^This tool belongs to .*?Tool description: ", re.S)


# ---------------------------------------------------------------------------------------------
# Data: bfcl's bundled questions, ground truth and function docs
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class BFCLEntry:
    """One bfcl multi-turn test entry with its ground truth."""

    id: str
    category: str
    base_id: int
    question: list[list[dict[str, str]]]  # per turn, the user messages (empty at miss_func holdout turns)
    initial_config: dict[str, Any]
    involved_classes: list[str]
    missed: dict[int, list[str]]  # turn index -> functions that become available at that turn
    excluded: list[str]
    ground_truth: list[list[str]]  # per turn, bfcl call strings

    def bfcl_entry(self) -> dict[str, Any]:
        """The dict bfcl's checker reads."""
        return {"id": self.id, "initial_config": self.initial_config, "involved_classes": self.involved_classes}


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        raise FileNotFoundError(f"{path}: bfcl data file missing; reinstall bfcl-eval==2026.3.23")
    with path.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def base_id_of(task_id: str) -> int:
    """'multi_turn_miss_func_12' -> 12."""
    return int(task_id.rsplit("_", 1)[1])


def category_of(task_id: str) -> str:
    category = task_id.rsplit("_", 1)[0]
    if category not in CATEGORIES:
        raise ValueError(f"task id {task_id!r}: category {category!r} is not one of {CATEGORIES}")
    return category


@functools.cache
def load_category(category: str) -> dict[str, BFCLEntry]:
    """All entries of a category by id, read once per process from the bfcl-eval wheel."""
    if category not in CATEGORIES:
        raise ValueError(f"category {category!r}: expected one of {CATEGORIES}")
    questions = _read_jsonl(_DATA_DIR / f"{VERSION_PREFIX}_{category}.json")
    answers = {
        a["id"]: a["ground_truth"]
        for a in _read_jsonl(_DATA_DIR / "possible_answer" / f"{VERSION_PREFIX}_{category}.json")
    }
    entries = {}
    for q in questions:
        if q["id"] not in answers:
            raise ValueError(f"{category}: no ground truth for {q['id']} in bfcl's possible_answer file")
        entries[q["id"]] = BFCLEntry(
            id=q["id"],
            category=category,
            base_id=base_id_of(q["id"]),
            question=q["question"],
            initial_config=q.get("initial_config", {}),
            involved_classes=list(q["involved_classes"]),
            missed={int(k): list(v) for k, v in q.get("missed_function", {}).items()},
            excluded=list(q.get("excluded_function", [])),
            ground_truth=answers[q["id"]],
        )
    return entries


@functools.cache
def function_docs(class_name: str) -> tuple[dict[str, Any], ...]:
    """bfcl's function docs for one backend class (name, description, parameters, response)."""
    if class_name not in MULTI_TURN_FUNC_DOC_FILE_MAPPING:
        raise ValueError(f"no bfcl function docs for class {class_name!r}")
    return tuple(_read_jsonl(_DATA_DIR / "multi_turn_func_doc" / MULTI_TURN_FUNC_DOC_FILE_MAPPING[class_name]))


def _json_schema(node: Any) -> Any:
    """bfcl's parameter types -> JSON-schema types (dict -> object, float -> number)."""
    if isinstance(node, list):
        return [_json_schema(v) for v in node]
    if not isinstance(node, dict):
        return node
    out = {}
    for key, value in node.items():
        if key == "type" and isinstance(value, str):
            mapped = _JSON_TYPES.get(value, value)
            if mapped is not None:
                out[key] = mapped
        else:
            out[key] = _json_schema(value)
    return out


def tool_schema(doc: dict[str, Any], compact: bool = False) -> dict[str, Any]:
    """One tool description; `compact` drops the class preamble bfcl repeats in every description."""
    description = doc.get("description", "")
    if compact:
        description = _CLASS_PREAMBLE.sub("", description)
    return {"name": doc["name"], "description": description, "parameters": _json_schema(doc["parameters"])}


def unplayable_reason(entry: BFCLEntry) -> str | None:
    """Why the ground truth cannot be replayed under the withholding rules, or None."""
    released = {name: turn for turn, names in entry.missed.items() for name in names}
    for turn, calls in enumerate(entry.ground_truth):
        for call in calls:
            name = call.split("(", 1)[0].strip()
            if name in entry.excluded:
                return f"turn {turn} calls {name!r}, which the task excludes"
            if released.get(name, -1) > turn:
                return f"turn {turn} calls {name!r}, which becomes available only at turn {released[name]}"
    return None


@functools.cache
def fold_table() -> dict[int, str]:
    """Base id -> fold: base ids in sha256 order, cut 70/15/15 (see the module docstring)."""
    base_ids = sorted({e.base_id for c in CATEGORIES for e in load_category(c).values()})
    order = sorted(base_ids, key=lambda i: hashlib.sha256(f"{_FOLD_SALT}:{i}".encode()).hexdigest())
    cut_train, cut_dev = (round(share * len(order)) for share in FOLD_SHARES)
    return {i: "train" if rank < cut_train else "dev" if rank < cut_dev else "test" for rank, i in enumerate(order)}


def fold_of(base_id: int) -> str:
    """The fold of a base task id."""
    table = fold_table()
    if base_id not in table:
        raise ValueError(f"base id {base_id}: not a bfcl multi-turn base id (0-{max(table)})")
    return table[base_id]


@functools.cache
def backend_class(class_name: str) -> type:
    """bfcl's backend class (its methods' signatures name the ground truth's positional arguments)."""
    return getattr(importlib.import_module(CLASS_FILE_PATH_MAPPING[class_name]), class_name)


__all__ = [
    "CATEGORIES",
    "BFCLEntry",
    "base_id_of",
    "category_of",
    "fold_of",
    "fold_table",
    "function_docs",
    "load_category",
    "unplayable_reason",
    "tool_schema",
]
