"""Training configuration: one dataclass per concern, parsed from a YAML recipe plus flags.

    simplan train --config recipes/smollm2-135m-instruct/twx/decider.yaml --max_steps 50

Every field has a default and a help string (shown by `simplan train --help`); the recipe's keys
are these field names, flat. Each class validates itself in `__post_init__` and raises
`ValueError` naming the field and the bad value.
"""

from __future__ import annotations

from dataclasses import dataclass, field

DTYPES = ("auto", "float32", "bfloat16", "float16")
BATCHING = ("group_by_length", "packed", "random")
SCHEDULERS = ("linear", "cosine", "constant", "constant_with_warmup")


def _check(cond: bool, name: str, value: object, want: str) -> None:
    if not cond:
        raise ValueError(f"{name}: {value!r} is not valid; expected {want}")


@dataclass
class ModelArguments:
    model: str = field(
        default="smollm2-135m-instruct",
        metadata={"help": "base model: a registry name (`simplan models list`), a local HF folder or an HF hub id"},
    )
    dtype: str = field(
        default="auto",
        metadata={
            "help": "dtype of the frozen base weights: auto (bfloat16 when bf16 training is on, else float32), "
            "float32, bfloat16 or float16; LoRA weights stay float32"
        },
    )
    attn_implementation: str = field(
        default="sdpa",
        metadata={
            "help": "attention kernel: sdpa (CPU and GPU), eager, or flash_attention_2 (GPU, best with packing)"
        },
    )

    def __post_init__(self) -> None:
        _check(bool(self.model.strip()), "model", self.model, "a model name, folder or hub id")
        _check(self.dtype in DTYPES, "dtype", self.dtype, f"one of {DTYPES}")
        _check(bool(self.attn_implementation), "attn_implementation", self.attn_implementation, "a kernel name")


@dataclass
class LoraArguments:
    lora_r: int = field(default=16, metadata={"help": "LoRA rank (vLLM serves ranks 8, 16, 32, 64, ...)"})
    lora_alpha: int = field(default=32, metadata={"help": "LoRA alpha (the update is scaled by alpha / r)"})
    lora_dropout: float = field(default=0.05, metadata={"help": "dropout on the LoRA input"})
    lora_target_modules: str = field(
        default="all-linear",
        metadata={
            "help": "modules to adapt: all-linear (every linear layer but the LM head) or names, comma-separated"
        },
    )
    lora_init: str = field(
        default="",
        metadata={
            "help": "start from this PEFT adapter folder (e.g. an earlier run's adapter) instead of a fresh LoRA, "
            "to train it further on this dataset; its rank, alpha and modules must equal the ones given"
        },
    )

    def __post_init__(self) -> None:
        _check(self.lora_r > 0, "lora_r", self.lora_r, "a positive integer")
        _check(self.lora_alpha > 0, "lora_alpha", self.lora_alpha, "a positive integer")
        _check(0.0 <= self.lora_dropout < 1.0, "lora_dropout", self.lora_dropout, "a number in [0, 1)")
        _check(bool(self.target_modules()), "lora_target_modules", self.lora_target_modules, "all-linear or names")

    def target_modules(self) -> str | list[str]:
        value = self.lora_target_modules.strip()
        if value == "all-linear":
            return value
        return [m.strip() for m in value.split(",") if m.strip()]


@dataclass
class DataArguments:
    dataset: str = field(
        default="",
        metadata={"help": "dataset folder written by `simplan build` (a DatasetDict with prompt/completion columns)"},
    )
    train_split: str = field(default="train", metadata={"help": "fold to train on"})
    eval_split: str = field(default="dev", metadata={"help": "fold to evaluate on during training ('' for none)"})
    max_length: int = field(
        default=1024,
        metadata={"help": "longest prompt+completion in tokens; longer examples are dropped (and counted), never cut"},
    )
    max_train_examples: int = field(default=0, metadata={"help": "use at most this many training examples (0: all)"})
    max_eval_examples: int = field(
        default=256, metadata={"help": "evaluate on at most this many dev examples (0: all); eval is not free on CPU"}
    )

    def __post_init__(self) -> None:
        _check(bool(self.dataset.strip()), "dataset", self.dataset, "a dataset folder from `simplan build`")
        _check(bool(self.train_split), "train_split", self.train_split, "a fold name")
        _check(self.max_length >= 16, "max_length", self.max_length, "an integer >= 16")
        _check(self.max_train_examples >= 0, "max_train_examples", self.max_train_examples, "an integer >= 0")
        _check(self.max_eval_examples >= 0, "max_eval_examples", self.max_eval_examples, "an integer >= 0")


@dataclass
class TrainArguments:
    output_dir: str = field(
        default="runs/train/default",
        metadata={"help": "run folder: checkpoints, adapter/, config.yaml, metrics.jsonl, metrics.json"},
    )
    num_train_epochs: float = field(default=1.0, metadata={"help": "passes over the training fold"})
    max_steps: int = field(default=-1, metadata={"help": "optimizer steps; overrides num_train_epochs when > 0"})
    max_minutes: float = field(
        default=0.0,
        metadata={
            "help": "stop (and save) after this many minutes of training, whatever step it is; 0 = no limit. "
            "For comparisons at equal compute: the schedule still spans max_steps"
        },
    )
    learning_rate: float = field(default=2e-4, metadata={"help": "peak learning rate"})
    lr_scheduler_type: str = field(default="cosine", metadata={"help": f"one of {SCHEDULERS}"})
    warmup_ratio: float = field(
        default=0.03, metadata={"help": "share of the steps spent warming the learning rate up"}
    )
    weight_decay: float = field(default=0.0, metadata={"help": "AdamW weight decay"})
    max_grad_norm: float = field(default=1.0, metadata={"help": "gradient clipping norm (0 disables)"})
    per_device_train_batch_size: int = field(default=8, metadata={"help": "examples per device per micro-batch"})
    per_device_eval_batch_size: int = field(default=8, metadata={"help": "examples per device per eval batch"})
    gradient_accumulation_steps: int = field(default=1, metadata={"help": "micro-batches per optimizer step"})
    bf16: str = field(
        default="auto",
        metadata={"help": "bf16 autocast: auto (on where the GPU or CPU supports bf16 natively), true or false"},
    )
    gradient_checkpointing: bool = field(
        default=False, metadata={"help": "recompute activations in backward (less memory, ~30% slower)"}
    )
    batching: str = field(
        default="group_by_length",
        metadata={
            "help": "group_by_length: batches of similar lengths, padded to the longest (best on CPU); "
            "packed: examples concatenated into one row with position ids restarting per example, so "
            "attention never crosses examples (no padding; best with flash_attention_2 on a GPU); "
            "random: shuffled, padded"
        },
    )
    completion_only_logits: bool = field(
        default=True,
        metadata={"help": "compute the LM head only at completion positions (same loss, much less work)"},
    )
    malloc_mmap_threshold: int = field(
        default=0,
        metadata={
            "help": "glibc: bytes from which an allocation gets its own memory map, given back when freed, for this "
            "run (0: glibc's own threshold, which grows as blocks are freed, so freed activations stay in the heap). "
            "On the TWX simulator recipe at 1,024-token windows: 131072 held every run at 2.85 GiB (3.4-4.4 GiB "
            "without) at 1.6x the training time, like gradient_checkpointing; 8388608 changed neither "
            '(bench/RESULTS.md "Training throughput"). After the run the threshold stays fixed at glibc\'s largest'
        },
    )
    lm_head_chunk: int = field(
        default=512,
        metadata={
            "help": "with completion_only_logits: run the LM head and its loss on the labelled tokens this many at a "
            "time, keeping no logits for the backward (same loss; a 4 x 1,024-token simulator batch kept 0.6 GB of "
            "logits and peaked 1.4 GB higher without it, on SmolLM2's 49k-word vocab); 0: the batch's labelled "
            "positions in one piece"
        },
    )
    eval_steps: int = field(default=200, metadata={"help": "evaluate on the dev fold every N steps (0: only at end)"})
    save_steps: int = field(default=200, metadata={"help": "write a checkpoint every N steps"})
    save_total_limit: int = field(default=2, metadata={"help": "keep at most this many checkpoints"})
    logging_steps: int = field(default=10, metadata={"help": "log loss, learning rate and tokens/s every N steps"})
    seed: int = field(default=42, metadata={"help": "random seed (data order, LoRA init, dropout)"})
    num_threads: int = field(
        default=0, metadata={"help": "torch CPU threads (0: leave torch's default); set it to the cores you own"}
    )
    processes: int = field(
        default=1,
        metadata={
            "help": "data-parallel training processes on this machine (torchrun, gloo on the CPU): each takes "
            "gradient_accumulation_steps / processes micro-batches of every step and num_threads / processes "
            "threads, so the optimizer steps are the same; on a 2-core CPU 2 processes of 1 thread trained 1.39x "
            'faster than 1 of 2 (bench/RESULTS.md "Training throughput")'
        },
    )
    dataloader_num_workers: int = field(default=0, metadata={"help": "data loader worker processes"})
    resume: bool = field(
        default=True,
        metadata={"help": "continue from the last checkpoint in output_dir when there is one (rerun = resume)"},
    )
    report_to: str = field(
        default="auto", metadata={"help": "auto (TensorBoard if installed), none, or integrations comma-separated"}
    )

    def __post_init__(self) -> None:
        _check(bool(self.output_dir.strip()), "output_dir", self.output_dir, "a folder")
        _check(self.num_train_epochs > 0 or self.max_steps > 0, "num_train_epochs", self.num_train_epochs, "> 0")
        _check(self.max_steps == -1 or self.max_steps > 0, "max_steps", self.max_steps, "-1 or a positive integer")
        _check(self.max_minutes >= 0, "max_minutes", self.max_minutes, ">= 0 (0 = no limit)")
        _check(self.learning_rate > 0, "learning_rate", self.learning_rate, "a positive number")
        _check(
            self.lr_scheduler_type in SCHEDULERS, "lr_scheduler_type", self.lr_scheduler_type, f"one of {SCHEDULERS}"
        )
        _check(0.0 <= self.warmup_ratio < 1.0, "warmup_ratio", self.warmup_ratio, "a number in [0, 1)")
        _check(self.weight_decay >= 0, "weight_decay", self.weight_decay, ">= 0")
        _check(self.max_grad_norm >= 0, "max_grad_norm", self.max_grad_norm, ">= 0")
        for name in ("per_device_train_batch_size", "per_device_eval_batch_size", "gradient_accumulation_steps"):
            _check(getattr(self, name) > 0, name, getattr(self, name), "a positive integer")
        self.bf16 = str(self.bf16).lower()
        _check(self.bf16 in ("auto", "true", "false"), "bf16", self.bf16, "auto, true or false")
        _check(self.batching in BATCHING, "batching", self.batching, f"one of {BATCHING}")
        _check(self.eval_steps >= 0, "eval_steps", self.eval_steps, ">= 0")
        _check(self.save_steps > 0, "save_steps", self.save_steps, "a positive integer")
        _check(self.save_total_limit > 0, "save_total_limit", self.save_total_limit, "a positive integer")
        _check(self.lm_head_chunk >= 0, "lm_head_chunk", self.lm_head_chunk, ">= 0 (0 = in one piece)")
        _check(
            self.malloc_mmap_threshold >= 0,
            "malloc_mmap_threshold",
            self.malloc_mmap_threshold,
            ">= 0 (0 = glibc's own threshold)",
        )
        _check(self.logging_steps > 0, "logging_steps", self.logging_steps, "a positive integer")
        _check(self.num_threads >= 0, "num_threads", self.num_threads, ">= 0")
        _check(self.dataloader_num_workers >= 0, "dataloader_num_workers", self.dataloader_num_workers, ">= 0")
        _check(self.processes >= 1, "processes", self.processes, "a positive integer")
        _check(
            self.gradient_accumulation_steps % self.processes == 0,
            "gradient_accumulation_steps",
            self.gradient_accumulation_steps,
            f"a multiple of processes ({self.processes}): each process takes an equal share of every step",
        )
