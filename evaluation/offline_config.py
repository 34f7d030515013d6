"""`simplan eval-model`'s configuration: which role, model, adapter and dataset fold, and how to decode.

    from simplan.evaluation.offline_config import EvalModelConfig
    cfg = EvalModelConfig(role="simulator", dataset="runs/datasets/twx-simulator", adapter="runs/train/sim/adapter")

Every field has a default and a help string (the command's flags); `__post_init__` refuses a bad value or
combination, naming the field. evaluation/offline.py `evaluate(cfg)` runs it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from simplan.inference.planning.sim_accuracy import ACCURACY_FILE

ROLES = ("decider", "simulator")
DECODES = ("free", "choices")


@dataclass
class EvalModelConfig:
    role: str = field(default="decider", metadata={"help": "decider or simulator (which metrics to compute)"})
    dataset: str = field(default="", metadata={"help": "dataset folder from `simplan build`"})
    fold: str = field(default="dev", metadata={"help": "fold to evaluate"})
    model: str = field(
        default="smollm2-135m-instruct", metadata={"help": "base model: registry name, HF folder or hub id"}
    )
    adapter: str = field(default="", metadata={"help": "PEFT adapter folder (train's output_dir/adapter); '' = base"})
    compare_base: bool = field(default=True, metadata={"help": "with --adapter, evaluate the base model too"})
    limit: int = field(
        default=200,
        metadata={"help": "evaluate N rows spread evenly over the fold's task families, in fold order (0: all)"},
    )
    batch_size: int = field(default=16, metadata={"help": "prompts per generate call"})
    max_new_tokens: int = field(
        default=0, metadata={"help": "generation cap (0: longest gold completion in the fold + 16 tokens)"}
    )
    dtype: str = field(default="auto", metadata={"help": "auto (bfloat16 where native, else float32), float32, ..."})
    num_threads: int = field(default=0, metadata={"help": "torch CPU threads (0: torch's default)"})
    device: str = field(default="auto", metadata={"help": "auto (the GPU when there is one, else cpu), cpu, cuda:N"})
    out: str = field(default="", metadata={"help": "output folder (default: next to the adapter, or runs/eval-model)"})
    replay: bool = field(
        default=False,
        metadata={
            "help": "decider: replay each miss in its environment and count a later expert step that is as "
            "short done now as `equivalent` (see simplan.data.replay; needs the trajectories)"
        },
    )
    predictions: str = field(
        default="",
        metadata={
            "help": "score the outputs in an earlier run's predictions.jsonl (same --dataset, --fold, --limit) "
            "instead of generating; e.g. to add --replay"
        },
    )
    trajectories: str = field(
        default="",
        metadata={"help": "with --replay: collection JSONL files, comma-separated ('' = the dataset's build inputs)"},
    )
    write_adapter_accuracy: bool = field(
        default=False,
        metadata={
            "help": f"simulator: also write the adapter's per-verb accuracy ({ACCURACY_FILE}) into --adapter, "
            "where the planner's selective router reads it"
        },
    )
    decode: str = field(
        default="free",
        metadata={
            "help": "decider: free (greedy text) or choices (the most likely of the row's valid actions, "
            "scored whole: the planner's first proposal)"
        },
    )

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"role: {self.role!r} is not one of {ROLES}")
        if not self.dataset:
            raise ValueError("dataset: give the dataset folder written by `simplan build`")
        for name in ("limit", "max_new_tokens", "num_threads"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}: {getattr(self, name)} must be >= 0")
        if self.batch_size <= 0:
            raise ValueError(f"batch_size: {self.batch_size} must be positive")
        if self.replay and self.role != "decider":
            raise ValueError("replay: only the decider's actions can be replayed; drop --replay for the simulator")
        if self.decode not in DECODES:
            raise ValueError(f"decode: {self.decode!r} is not one of {DECODES}")
        if self.decode == "choices" and self.role != "decider":
            raise ValueError("decode: choices picks among a decider's valid actions; use free for the simulator")
        if self.write_adapter_accuracy and (self.role != "simulator" or not self.adapter):
            raise ValueError(
                "write_adapter_accuracy: writes a simulator adapter's per-verb accuracy; give --role simulator and "
                "--adapter DIR, or drop --write_adapter_accuracy"
            )
        if self.decode == "choices" and self.predictions:
            raise ValueError("decode: --predictions scores saved outputs, nothing is decoded; drop --decode")

    def out_dir(self) -> Path:
        if self.out:
            return Path(self.out)
        if self.predictions:
            return Path(self.predictions).parent / "rescored"
        suffix = "-choices" if self.decode == "choices" else ""
        if self.adapter:
            return Path(self.adapter).parent / f"eval-{self.fold}{suffix}"
        return Path("runs/eval-model") / f"{Path(self.model).name}-{self.role}-{self.fold}{suffix}"
