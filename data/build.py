"""Build the decider or the simulator dataset from trajectory JSONL files.

    simplan build --role decider --inputs runs/data/twx-train.jsonl,runs/data/twx-dev.jsonl \\
        --out runs/datasets/twx-decider --model smollm2-135m-instruct

    from simplan.data.build import BuildConfig, build
    result = build(BuildConfig(role="simulator", inputs=["runs/data"], out="runs/datasets/sim"))

The decider learns the actions of steps whose source is worth imitating (expert, recovery) and that
did not fail; noise steps are never targets but stay in the context, so the decider learns to
recover. The simulator learns the real next observation of every step (noise and random ones
included, so error observations are learned); with `verdicts` (opt-in: measured to raise false "lost"
lines on TWX, bench/RESULTS.md) a step that ended the episode adds the env's verdict line,
`[episode over: won]` or `[episode over: lost]` (data/format.py).

`format: conversation` (the default) replays each trajectory into one EpisodeState and renders it
as the role's conversation (data/episode.py): one sequence per window of the episode, loss on every
trained assistant turn, mistakes kept as masked context. Windows end where the next step's prompt
would pass `max_prompt_tokens`; each repeats the goal. `format: step` renders one prompt per step
with its recent history (data/format.py), dropping history oldest-first to fit the budget; an
example still over budget, or whose completion is over its budget, is dropped (never cut) and
counted. Identical examples are deduplicated within a fold.

Input lines are checked exactly as `simplan validate` checks them (`data/validate.py`), so a line
validate accepts is a line build accepts. A bad line (bytes that are not UTF-8, torn JSON, a schema
problem, an id already used by a different record) stops the build before anything is written,
naming every FILE:LINE; with `keep_going` the good lines are built and the problems are reported
on stderr and in stats.json. The same record twice is counted and used once.

Written to `out/`: dataset/ (a `datasets.DatasetDict` by fold, `save_to_disk`), {fold}.jsonl
(OpenAI `messages` format; conversation assistant turns carry `weight` 1 or 0), stats.json,
stats.md, config.json and prompt_settings.json (how prompts are laid out: `train` copies it into
the adapter and the planner reads it from there).

The code: this module holds the config and the build; data/build_inputs.py reads and checks the input
lines, data/build_rows.py turns trajectories into rows, data/build_stats.py writes the statistics.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from simplan.core.config import comma_list
from simplan.core.io import atomic_dir, write_json, write_jsonl, write_text
from simplan.data import format as fmt
from simplan.data.build_inputs import (
    MAX_CHARS_PER_TOKEN,
    check_facts,
    check_folds,
    expand_inputs,
    load_trajectories,
    refuse_malformed,
)
from simplan.data.build_rows import (
    build_rows,
    conversation_features,
    conversation_rows,
    make_candidates,
    openai_conversations,
    step_features,
)
from simplan.data.build_stats import dataset_stats, stats_markdown
from simplan.data.episode import FORMATS, ROLES, PromptSettings, write_settings
from simplan.data.trajectory import STEP_SOURCES
from simplan.envs.base import FOLDS
from simplan.envs.registry import resolve

DECIDER_SOURCES = ("expert", "recovery")
DEFAULT_MAX_COMPLETION = {"decider": 128, "simulator": 384}


@dataclass
class BuildConfig:
    role: str = field(default="decider", metadata={"help": "which dataset to build: decider or simulator"})
    inputs: list[str] = field(
        default_factory=list,
        metadata={"help": "trajectory JSONL files, folders (every *.jsonl inside) or glob patterns, comma-separated"},
    )
    out: str = field(default="", metadata={"help": "output folder (dataset/, {fold}.jsonl, stats.json, stats.md)"})
    model: str = field(
        default="smollm2-135m-instruct",
        metadata={"help": "tokenizer source: registry name, local HF folder or hub id (its chat template counts)"},
    )
    format: str = field(
        default="conversation",
        metadata={
            "help": "conversation: one sequence per episode window, loss on every trained assistant turn "
            "(data/episode.py); step: one prompt per step with its history (data/format.py)"
        },
    )
    max_prompt_tokens: int = field(
        default=1024,
        metadata={
            "help": "prompt budget in tokens, chat template included: a conversation opens a new window "
            "(repeating the goal) where a step's prompt would pass it; a step prompt drops history to fit"
        },
    )
    window_overlap: int = field(
        default=2, metadata={"help": "conversation: steps a new window repeats as context (no loss) before its own"}
    )
    completion_reserve: int = field(
        default=64, metadata={"help": "conversation: tokens kept free for the reply when deciding where windows end"}
    )
    show_valid: bool = field(
        default=False, metadata={"help": "conversation: list the valid actions in every decider user turn"}
    )
    verdicts: bool = field(
        default=False,
        metadata={
            "help": "simulator: a step that ended the episode gets the env's verdict as the reply's last line "
            "([episode over: won] / [episode over: lost]), which the planner judges (experimental: on TWX a "
            "SmolLM2-135M simulator learned false 'lost' lines, see bench/RESULTS.md); false: observations only"
        },
    )
    outcomes: bool = field(
        default=False,
        metadata={
            "help": "simulator, conversation format: every reply opens with its outcome line (error, no change, "
            "progress, won, lost), which the planner scores per class; the steps' counterfactual alternatives "
            "(`simplan counterfactuals`) become extra branches behind their state (data/build_branches.py)"
        },
    )
    notes: bool = field(
        default=False,
        metadata={
            "help": "decider, conversation format: each user turn shows its step's notes (the pivot notes collection "
            "records after a failed step and the planner writes on every pivot); the adapter then makes the planner "
            "show its notes too. false: notes stay in the data and traces only"
        },
    )
    snapshot: bool = field(
        default=False,
        metadata={
            "help": "conversation format: each window's system message shows what the steps before it told as "
            "belief-state facts (the trajectories' `facts`, by the env's extractor: TWX's room, exits and "
            "inventory; collected with this version); the adapter then makes the planner show them too"
        },
    )
    no_change_per_state: int = field(
        default=2,
        metadata={"help": "outcomes: alternatives that change nothing kept per state (every other class is kept)"},
    )
    max_completion_tokens: int | None = field(
        default=None,
        metadata={
            "help": "completion budget in tokens (EOS included); longer examples are dropped, never cut. "
            "Default: 128 for the decider (one action), 384 for the simulator (observations run long)"
        },
    )
    max_history: int | None = field(
        default=fmt.DEFAULT_MAX_HISTORY,
        metadata={"help": "at most this many recent steps in a prompt, as the planner shows (none: all that fit)"},
    )
    max_failures: int = field(
        default=fmt.DEFAULT_MAX_FAILURES, metadata={"help": "failure-memory lines per prompt (most recent distinct)"}
    )
    sources: list[str] | None = field(
        default=None,
        metadata={
            "help": f"step sources that become examples, from {','.join(STEP_SOURCES)}. "
            f"Default: {','.join(DECIDER_SOURCES)} for the decider (actions worth imitating), all for the simulator"
        },
    )
    skip_failed_targets: bool = field(
        default=True, metadata={"help": "decider: do not imitate actions that failed (error observation)"}
    )
    include_errored: bool = field(
        default=False, metadata={"help": "use trajectories whose status is 'errored' (env crash mid-episode)"}
    )
    dedupe: bool = field(
        default=True, metadata={"help": "drop repeated identical (prompt, completion) pairs per fold"}
    )
    oversample: dict[str, int] = field(
        default_factory=dict,
        metadata={
            "help": "train split only: policy -> copies of each of its examples, after dedupe (e.g. '{reactive: 4}' "
            "weighs a flywheel's harvested traces, whose policy is the arm that played them, 4x against the "
            "expert data); dev and test are never repeated"
        },
    )
    batch_size: int = field(default=4096, metadata={"help": "prompts per tokenizer call"})
    progress: bool = field(default=True, metadata={"help": "show progress bars"})
    env: str | None = field(
        default=None,
        metadata={
            "help": "env name or package.module:Class whose failure classes apply to every input trajectory; "
            "default: each trajectory's recorded env"
        },
    )
    keep_going: bool = field(
        default=False,
        metadata={
            "help": "build from the good lines when some input lines are bad (each is reported as FILE:LINE "
            "and counted in stats.json); without it a bad line stops the build before anything is written"
        },
    )

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"role: {self.role!r} is not one of {ROLES}")
        if self.format not in FORMATS:
            raise ValueError(f"format: {self.format!r} is not one of {FORMATS}")
        self.inputs = comma_list(self.inputs)
        if not self.inputs:
            raise ValueError("inputs: give at least one trajectory JSONL file (--inputs A.jsonl,B.jsonl)")
        if not self.out:
            raise ValueError("out: give an output folder (--out runs/datasets/NAME)")
        if self.max_prompt_tokens <= 0:
            raise ValueError(f"max_prompt_tokens: {self.max_prompt_tokens} must be positive")
        if self.max_completion_tokens is None:
            self.max_completion_tokens = DEFAULT_MAX_COMPLETION[self.role]
        if self.max_completion_tokens <= 0:
            raise ValueError(f"max_completion_tokens: {self.max_completion_tokens} must be positive")
        if self.max_history is not None and self.max_history < 0:
            raise ValueError(f"max_history: {self.max_history} must be >= 0 (or none)")
        if self.max_failures < 0:
            raise ValueError(f"max_failures: {self.max_failures} must be >= 0")
        if self.sources is None:
            self.sources = list(DECIDER_SOURCES if self.role == "decider" else STEP_SOURCES)
        bad = [s for s in self.sources if s not in STEP_SOURCES]
        if bad or not self.sources:
            raise ValueError(f"sources: {bad or self.sources} not valid; choose from {STEP_SOURCES}")
        if self.batch_size <= 0:
            raise ValueError(f"batch_size: {self.batch_size} must be positive")
        self.oversample = dict(self.oversample or {})
        bad_copies = {k: v for k, v in self.oversample.items() if type(v) is not int or v < 1}
        if bad_copies:
            raise ValueError(f"oversample: copies must be whole numbers >= 1, got {bad_copies}")
        self.env = self.env or None  # '' (a YAML key left empty) means the default, as none does
        if self.outcomes and self.format != "conversation":
            raise ValueError(
                "outcomes: needs --format conversation (the planner scores outcome lines of conversations)"
            )
        if self.notes and self.format != "conversation":
            raise ValueError("notes: needs --format conversation (a step prompt has no per-turn notes)")
        if self.snapshot and self.format != "conversation":
            raise ValueError("snapshot: needs --format conversation (a step prompt has no windows)")
        if self.no_change_per_state < 0:
            raise ValueError(f"no_change_per_state: must be >= 0, got {self.no_change_per_state}")
        self.settings()  # validates the prompt settings (window overlap, reserve) here, naming the field

    def settings(self) -> PromptSettings:
        """The prompt settings this dataset is built with; they travel with it into the adapter."""
        return PromptSettings(
            format=self.format,
            budget=self.max_prompt_tokens,
            reserve=self.completion_reserve,
            overlap=self.window_overlap,
            show_valid=self.show_valid,
            max_failures=self.max_failures,
            max_history=self.max_history,
            verdicts=self.verdicts and self.role == "simulator",  # a decider's replies are actions
            outcomes=self.outcomes and self.role == "simulator",
            notes=self.notes and self.role == "decider",  # the simulator's user turns are actions
            snapshot=self.snapshot,
        )


@dataclass
class BuildResult:
    out: Path
    stats: dict[str, Any]
    paths: dict[str, str]


# ---------------------------------------------------------------------------------------------
# Writing
# ---------------------------------------------------------------------------------------------
def _save_dataset(
    rows: dict[str, list[dict[str, Any]]], folds: list[str], target: Path, progress: bool, features: Any
) -> None:
    """save_to_disk into a temporary folder, then swap it in, so a crash never leaves half a dataset."""
    from datasets import Dataset, DatasetDict
    from datasets.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars

    names = list(features)
    dd = DatasetDict(
        {
            fold: Dataset.from_dict({k: [r[k] for r in rows.get(fold, [])] for k in names}, features=features)
            for fold in folds
        }
    )
    bars_were_on = not are_progress_bars_disabled()
    if not progress:
        disable_progress_bars()
    try:
        with atomic_dir(target) as tmp:
            dd.save_to_disk(str(tmp))
    finally:
        if bars_were_on:
            enable_progress_bars()


def oversampled(
    rows: dict[str, list[dict[str, Any]]], copies: dict[str, int]
) -> tuple[dict[str, list[dict[str, Any]]], dict[str, int]]:
    """The rows with each train-fold row of a policy in `copies` repeated that many times in place (the trainer
    shuffles), and the rows added per policy. Other folds are left alone: dev measures, it is not weighted."""
    if not copies or "train" not in rows:
        return rows, {}
    added: Counter = Counter()
    train = []
    for row in rows["train"]:
        n = copies.get(row["policy"], 1)
        train += [row] * n
        added[row["policy"]] += n - 1
    return {**rows, "train": train}, {k: v for k, v in sorted(added.items()) if v}


def build(cfg: BuildConfig, tokenizer: Any = None) -> BuildResult:
    """Read, render, fit, tokenize and write one dataset; returns the stats and the written paths."""
    started = time.perf_counter()
    if cfg.env is not None:
        resolve(cfg.env)  # an env named for its failure classes must exist; the error says how to name it
    files = expand_inputs(cfg.inputs)
    if tokenizer is None:
        from simplan.models.registry import load_tokenizer

        tokenizer = load_tokenizer(cfg.model)
    t0 = time.perf_counter()  # tokenizer loading (imports transformers) is timed apart
    max_chars = max(cfg.max_prompt_tokens, cfg.max_completion_tokens) * MAX_CHARS_PER_TOKEN
    loaded = load_trajectories(files, include_errored=cfg.include_errored, max_chars=max_chars)
    if loaded.malformed_lines and not cfg.keep_going:
        refuse_malformed(loaded, files)
    check_folds(loaded.trajectories)
    if cfg.snapshot:
        check_facts(loaded.trajectories, files)
    counts: Counter = Counter()
    candidates = make_candidates(loaded.trajectories, cfg, counts) if cfg.format == "step" else []
    t1 = time.perf_counter()
    if cfg.format == "conversation":
        rows, dedup = conversation_rows(loaded.trajectories, cfg, tokenizer, counts)
        features = conversation_features()
    else:
        rows, dedup = build_rows(candidates, cfg, tokenizer, counts)
        features = step_features()
    rows, added = oversampled(rows, cfg.oversample)
    t2 = time.perf_counter()

    out = Path(cfg.out)
    folds = [f for f in FOLDS if f in {t.task.fold for t in loaded.trajectories}]
    paths = {"dataset": str(out / "dataset")}
    _save_dataset(rows, folds, out / "dataset", cfg.progress, features)
    for fold in FOLDS:
        path = out / f"{fold}.jsonl"
        if fold in folds:
            write_jsonl(path, ({"messages": m} for r in rows.get(fold, []) for m in openai_conversations(r)))
            paths[fold] = str(path)
        elif path.exists():
            path.unlink()  # a fold from an earlier build into the same folder
    t3 = time.perf_counter()
    seconds = {"tokenizer": t0 - started, "load": t1 - t0, "tokenize": t2 - t1, "write": t3 - t2, "total": t3 - t0}
    stats = dataset_stats(cfg, files, loaded, {f: rows.get(f, []) for f in folds}, dedup, counts, seconds)
    stats["oversampled"] = {"copies": cfg.oversample, "rows_added": added}
    paths |= {"stats": str(out / "stats.json"), "stats_md": str(out / "stats.md"), "config": str(out / "config.json")}
    paths["prompt_settings"] = str(write_settings(out, cfg.settings()))
    write_json(out / "stats.json", stats)
    write_text(out / "stats.md", stats_markdown(stats))
    write_json(out / "config.json", asdict(cfg))
    return BuildResult(out=out, stats=stats, paths=paths)
