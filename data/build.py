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
"""

from __future__ import annotations

import glob
import json
import re
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from simplan.data import format as fmt
from simplan.data.episode import (
    FORMATS,
    ROLES,
    EpisodeState,
    PromptSettings,
    env_transient_patterns,
    renderer_for,
    write_settings,
)
from simplan.data.io import atomic_dir, write_json, write_jsonl, write_text
from simplan.data.trajectory import STEP_SOURCES, Trajectory
from simplan.data.validate import read_trajectory_lines
from simplan.envs.base import FOLDS
from simplan.envs.registry import resolve
from simplan.scripts.config import comma_list

DECIDER_SOURCES = ("expert", "recovery")
DEFAULT_MAX_COMPLETION = {"decider": 128, "simulator": 384}
MAX_REPORTED_PROBLEMS = 50


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
        )


class FoldLeakError(ValueError):
    """A task appears in more than one fold: evaluation on it would be contaminated."""


class MalformedInputError(ValueError):
    """Input lines that are not valid trajectories (without `keep_going`); the message names each FILE:LINE."""


@dataclass
class BuildResult:
    out: Path
    stats: dict[str, Any]
    paths: dict[str, str]


# ---------------------------------------------------------------------------------------------
# Reading
# ---------------------------------------------------------------------------------------------
def expand_inputs(inputs: list[str]) -> list[Path]:
    """Files as given, every *.jsonl in a folder, and glob matches; error naming what matched nothing."""
    files: list[Path] = []
    for item in inputs:
        path = Path(item).expanduser()
        if path.is_dir():
            found = sorted(path.glob("*.jsonl"))
        elif path.exists():
            found = [path]
        else:
            found = sorted(Path(p) for p in glob.glob(str(path)))
        if not found:
            raise FileNotFoundError(f"input {item!r}: no such file, or a folder/glob with no .jsonl files")
        files += [f for f in found if f not in files]
    return files


@dataclass
class Loaded:
    trajectories: list[Trajectory] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # "FILE:LINE: field: problem"
    malformed_lines: int = 0
    skipped: Counter = field(default_factory=Counter)  # reason -> trajectories skipped


def load_trajectories(files: list[Path], include_errored: bool = False) -> Loaded:
    """Read and check every line as `simplan validate` does; a bad line is reported as FILE:LINE and skipped.

    Bad lines: those validate rejects, and a trajectory id seen earlier with different content (the
    first one is kept). The same record twice is only counted (`skipped.duplicate_trajectory_id`).
    """
    loaded = Loaded()
    for line in read_trajectory_lines(files):
        problems = list(line.problems)
        if line.duplicate_of is not None and not line.same_content:
            problems.append(line.duplicate_problem())
        if problems:
            loaded.malformed_lines += 1
            loaded.problems += [f"{line.where}: {p}" for p in problems]
            continue
        traj = line.trajectory
        if line.duplicate_of is not None:
            loaded.skipped["duplicate_trajectory_id"] += 1
        elif traj.status == "errored" and not include_errored:
            loaded.skipped["errored_trajectory"] += 1
        else:
            loaded.trajectories.append(traj)
    return loaded


def refuse_malformed(loaded: Loaded, files: list[Path]) -> None:
    """Raise MalformedInputError naming the bad lines (the first MAX_REPORTED_PROBLEMS problems)."""
    shown = loaded.problems[:MAX_REPORTED_PROBLEMS]
    more = len(loaded.problems) - len(shown)
    raise MalformedInputError(
        f"{loaded.malformed_lines} bad input line(s):\n"
        + "\n".join(shown)
        + (f"\n... and {more} more problems" if more else "")
        + f"\nFix them (`simplan validate {' '.join(str(f) for f in files)} --keep-going` lists all and splits "
        "good lines from bad), or pass --keep_going true to build from the good lines."
    )


def check_folds(trajectories: list[Trajectory]) -> None:
    """Raise FoldLeakError naming every (env, task id) that appears in two folds."""
    folds: dict[tuple[str, str], set[str]] = defaultdict(set)
    for t in trajectories:
        folds[(t.task.env, t.task.task_id)].add(t.task.fold)
    leaks = {k: sorted(v) for k, v in folds.items() if len(v) > 1}
    if leaks:
        shown = "; ".join(f"{env}/{tid} in {'+'.join(f)}" for (env, tid), f in sorted(leaks.items())[:20])
        more = f" (and {len(leaks) - 20} more)" if len(leaks) > 20 else ""
        raise FoldLeakError(
            f"{len(leaks)} task id(s) appear in more than one fold: {shown}{more}. "
            "Collect each fold from its own task list, or drop the inputs that mix folds."
        )


# ---------------------------------------------------------------------------------------------
# Examples
# ---------------------------------------------------------------------------------------------
@dataclass
class Candidate:
    """One example before tokenization: the full-history state, the action (simulator) and the target."""

    state: fmt.PromptState
    action: str  # rendered action taken at this step
    completion: str
    fold: str
    meta: dict[str, Any]


def trajectory_meta(traj: Trajectory) -> dict[str, Any]:
    """The columns every example row has about the episode it comes from."""
    return {
        "env": traj.env,
        "task_id": traj.task.task_id,
        "fold": traj.task.fold,
        "family": traj.task.family,
        "trajectory_id": traj.id,
        "policy": traj.policy,
    }


def transient_patterns(traj: Trajectory, cfg: BuildConfig) -> tuple[re.Pattern[str], ...]:
    """The failures of `traj` that are transient (retried, not remembered), by the env the planner would know:
    `cfg.env` when given, else the name the trajectory recorded. Collection records an env's own name
    ("shop"), which resolves only where its package's entry point is installed; `--env package.module:Class`
    names it anywhere."""
    return env_transient_patterns(cfg.env or traj.env)


def skip_reason(step: Any, cfg: BuildConfig) -> str | None:
    """Why a recorded step is not a target of the role (a stats key), None when it is: the role learns from
    its sources, and the decider never imitates an action that failed."""
    if step.source not in (cfg.sources or ()):
        return f"source_{step.source}"
    if cfg.role == "decider" and step.error and cfg.skip_failed_targets:
        return "failed_action"
    return None


def make_candidates(trajectories: list[Trajectory], cfg: BuildConfig, counts: Counter) -> list[Candidate]:
    """One candidate per step that the role learns from; `counts` collects skipped steps by reason."""
    decider = cfg.role == "decider"
    verdicts = cfg.settings().verdicts
    out: list[Candidate] = []
    for traj in trajectories:
        transient = transient_patterns(traj, cfg)  # left out of the failure memory, as the planner does
        states = fmt.trajectory_states(traj, cfg.max_history, cfg.max_failures, transient)
        for step, state in zip(traj.steps, states):
            if reason := skip_reason(step, cfg):
                counts[reason] += 1
                continue
            action = fmt.render_action(step.action)
            verdict = fmt.episode_verdict(step.done, step.won) if verdicts else None
            completion = action if decider else fmt.observation_completion(step.next_observation, verdict)
            meta = {
                **trajectory_meta(traj),
                "step": step.index,
                "source": step.source,
                "error": step.error,
                "valid_actions": list(step.valid_actions or []),  # eval-model's "share of valid actions"
            }
            out.append(Candidate(state, action, completion, traj.task.fold, meta))
    return out


def _state_key(c: Candidate) -> tuple:
    """Identity of a candidate before fitting: equal keys render to equal prompts and completions."""
    s = c.state
    history = tuple((h.action, h.observation, h.error) for h in s.history)
    tools = json.dumps(s.tools, sort_keys=True) if s.tools else ""
    valid = tuple(s.valid_actions) if s.valid_actions is not None else None
    return (c.fold, s.goal, s.observation, history, valid, tools, tuple(s.failures), c.action, c.completion)


def _batched(fn: Callable[[list], list[int]], batch_size: int, bar: Any) -> Callable[[list], list[int]]:
    def run(items: list) -> list[int]:
        out: list[int] = []
        bar.total = (bar.total or 0) + len(items)
        bar.refresh()
        for start in range(0, len(items), batch_size):
            chunk = items[start : start + batch_size]
            out += fn(chunk)
            bar.update(len(chunk))
        return out

    return run


def _percentiles(values: list[int]) -> dict[str, float]:
    import numpy as np

    if not values:
        return {"n": 0, "p50": 0, "p90": 0, "p99": 0, "max": 0, "mean": 0.0}
    a = np.asarray(values)
    pct = {f"p{q}": int(np.percentile(a, q, method="higher")) for q in (50, 90, 99)}
    return {"n": len(values), **pct, "max": int(a.max()), "mean": round(float(a.mean()), 1)}


def _meta_features() -> dict[str, Any]:
    """Feature types of the `trajectory_meta` columns."""
    from datasets import Value

    return {k: Value("string") for k in ("env", "task_id", "fold", "family", "trajectory_id", "policy")}


def _features():
    from datasets import Features, List, Value

    message = {"role": Value("string"), "content": Value("string")}
    return Features(
        {
            "prompt": List(message),
            "completion": Value("string"),
            "messages": List(message),
            **_meta_features(),
            "step": Value("int32"),
            "source": Value("string"),
            "error": Value("bool"),
            "valid_actions": List(Value("string")),
            "role": Value("string"),
            "prompt_tokens": Value("int32"),
            "completion_tokens": Value("int32"),
            "history_kept": Value("int32"),
            "history_dropped": Value("int32"),
        }
    )


def build_rows(
    candidates: list[Candidate], cfg: BuildConfig, tokenizer: Any, counts: Counter
) -> tuple[dict[str, list[dict[str, Any]]], dict[str, int]]:
    """Fit, tokenize, drop over-budget and duplicate examples; rows by fold (input order) and dedup counts."""
    from tqdm.auto import tqdm

    dedup: Counter = Counter()
    if cfg.dedupe:  # cheap structural dedupe first, so duplicates are never tokenized
        seen, unique = set(), []
        for c in candidates:
            key = _state_key(c)
            if key in seen:
                dedup[c.fold] += 1
            else:
                seen.add(key)
                unique.append(c)
        candidates = unique

    if cfg.role == "decider":
        render = fmt.decider_messages
        states = [c.state for c in candidates]
    else:
        states = [_SimState(**vars(c.state), action=c.action) for c in candidates]
        render = _render_sim

    with tqdm(total=0, desc=f"build {cfg.role}: tokenizing", unit="text", disable=not cfg.progress) as bar:
        count_batch = _batched(fmt.chat_batch_token_counter(tokenizer), cfg.batch_size, bar)
        count_texts = _batched(fmt.text_token_counter(tokenizer), cfg.batch_size, bar)
        completion_tokens = count_texts([fmt.completion_text(tokenizer, c.completion) for c in candidates])
        fits = fmt.fit_batch_to_budget(states, render, count_batch, cfg.max_prompt_tokens, count_texts=count_texts)

    rows: dict[str, list[dict[str, Any]]] = defaultdict(list)
    seen_pairs: set[tuple] = set()
    for c, fit, ctoks in zip(candidates, fits, completion_tokens):
        if ctoks > cfg.max_completion_tokens:
            counts["completion_over_budget"] += 1
            continue
        if fit.tokens > cfg.max_prompt_tokens:
            counts["prompt_over_budget"] += 1
            continue
        prompt = fit.messages
        if cfg.dedupe:
            key = (c.fold, *(m["content"] for m in prompt), c.completion)
            if key in seen_pairs:
                dedup[c.fold] += 1
                continue
            seen_pairs.add(key)
        kept = len(fit.state.history)
        rows[c.fold].append(
            {
                "prompt": prompt,
                "completion": c.completion,
                "messages": prompt + [{"role": "assistant", "content": c.completion}],
                **c.meta,
                "role": cfg.role,
                "prompt_tokens": fit.tokens,
                "completion_tokens": ctoks,
                "history_kept": kept,
                "history_dropped": fit.dropped,
            }
        )
    return dict(rows), dict(dedup)


@dataclass
class _SimState(fmt.PromptState):
    """A PromptState that carries the simulator's action, so the fitter's renderer stays state -> messages."""

    action: str = ""


def _render_sim(state: _SimState) -> fmt.Messages:
    return fmt.simulator_messages(state, state.action)


# ---------------------------------------------------------------------------------------------
# Conversation examples: one sequence per episode window (data/episode.py)
# ---------------------------------------------------------------------------------------------


def conversation_rows(
    trajectories: list[Trajectory], cfg: BuildConfig, tokenizer: Any, counts: Counter
) -> tuple[dict[str, list[dict[str, Any]]], dict[str, int]]:
    """Every trajectory replayed into an EpisodeState and cut into windows; rows by fold and dedup counts."""
    from tqdm.auto import tqdm

    renderer = renderer_for(cfg.settings(), tokenizer)
    counts.update(reason for traj in trajectories for step in traj.steps if (reason := skip_reason(step, cfg)))
    pending: list[tuple[Trajectory, EpisodeState, Any]] = []
    for traj in tqdm(trajectories, desc=f"build {cfg.role}: windows", unit="episode", disable=not cfg.progress):
        state = EpisodeState.from_trajectory(
            traj, lambda step: skip_reason(step, cfg) is None, transient_patterns(traj, cfg)
        )
        pending += [(traj, state, ex) for ex in renderer.examples(state, cfg.role)]
    dedup: Counter = Counter()
    if cfg.dedupe:  # a turn trained before with the same context (a branch's shared prefix) is context here
        seen: set[bytes] = set()
        kept = []
        for traj, state, ex in pending:
            ex = _dedupe_turns(ex, traj.task.fold, seen)
            if any(ex.weights):
                kept.append((traj, state, ex))
            else:
                dedup[traj.task.fold] += 1
        pending = kept
    count = fmt.chat_batch_token_counter(tokenizer, add_generation_prompt=False)
    count_texts = fmt.text_token_counter(tokenizer)
    tokens: list[int] = []
    trained: list[int] = []
    for start in range(0, len(pending), cfg.batch_size):
        chunk = pending[start : start + cfg.batch_size]
        tokens += count([ex.messages for _, _, ex in chunk])
        replies = [
            [fmt.completion_text(tokenizer, m["content"]) for m, w in zip(ex.messages, ex.weights) if w]
            for _, _, ex in chunk
        ]
        flat = count_texts([r for rs in replies for r in rs])
        it = iter(flat)
        trained += [sum(next(it) for _ in rs) for rs in replies]
    longest = cfg.max_prompt_tokens + (cfg.max_completion_tokens or 0)
    rows: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for (traj, state, ex), n_tokens, n_trained in zip(pending, tokens, trained):
        if n_tokens > longest:  # a window of one step whose prompt alone passes the budget
            counts["prompt_over_budget"] += 1
            continue
        turns = [state.turns[t] if t >= 0 else None for t in ex.steps]
        steps = {t: traj.steps[t] for t in ex.steps if 0 <= t < len(traj.steps)}
        rows[traj.task.fold].append(
            {
                "messages": ex.messages,
                "weights": ex.weights,
                "steps": ex.steps,
                "valid_actions": [list(t.valid_actions or []) if t is not None else [] for t in turns],
                "sources": [steps[t].source if t in steps else "" for t in ex.steps],
                "errors": [bool(steps[t].error) if t in steps else False for t in ex.steps],
                **trajectory_meta(traj),
                "role": cfg.role,
                "window_start": ex.window[0],
                "window_end": ex.window[1],
                "trained_turns": sum(ex.weights),
                # Stats share the per-step keys: the whole sequence, its trained tokens, steps shown/before.
                "prompt_tokens": n_tokens,
                "completion_tokens": n_trained,
                "history_kept": ex.window[1] - ex.window[0],
                "history_dropped": ex.window[0],
            }
        )
    return dict(rows), dict(dedup)


def _dedupe_turns(ex: Any, fold: str, seen: set[bytes]) -> Any:
    """`ex` with weight 0 on every trained turn whose whole context and reply were trained before in this fold."""
    import hashlib

    digest = hashlib.sha1(fold.encode())
    weights = list(ex.weights)
    for i, m in enumerate(ex.messages):
        digest.update(json.dumps(m, ensure_ascii=True).encode())
        if weights[i]:
            key = digest.copy().digest()
            if key in seen:
                weights[i] = 0
            else:
                seen.add(key)
    return replace(ex, weights=weights)


def _conversation_features():
    from datasets import Features, List, Value

    message = {"role": Value("string"), "content": Value("string")}
    return Features(
        {
            "messages": List(message),
            "weights": List(Value("int8")),
            "steps": List(Value("int32")),
            "valid_actions": List(List(Value("string"))),
            "sources": List(Value("string")),
            "errors": List(Value("bool")),
            **_meta_features(),
            "role": Value("string"),
            "window_start": Value("int32"),
            "window_end": Value("int32"),
            "trained_turns": Value("int32"),
            "prompt_tokens": Value("int32"),
            "completion_tokens": Value("int32"),
            "history_kept": Value("int32"),
            "history_dropped": Value("int32"),
        }
    )


def step_rows(row: dict[str, Any]) -> list[dict[str, Any]]:
    """A conversation row as per-step rows (prompt = the messages before a trained assistant turn,
    completion = that turn), the view `eval-model` scores; a per-step row is returned as it is."""
    if "weights" not in row:
        return [row]
    meta = {k: row[k] for k in ("env", "task_id", "fold", "family", "trajectory_id", "policy", "role")}
    out = []
    for i, (m, w) in enumerate(zip(row["messages"], row["weights"])):
        if m["role"] != "assistant" or not w:
            continue
        out.append(
            {
                "prompt": row["messages"][:i],
                "completion": m["content"],
                **meta,
                "step": row["steps"][i],
                "source": row["sources"][i],
                "error": row["errors"][i],
                "valid_actions": row["valid_actions"][i],
            }
        )
    return out


def openai_messages(row: dict[str, Any]) -> list[dict[str, Any]]:
    """A row as OpenAI fine-tuning messages: assistant turns carry `weight` (1 trains, 0 is context)."""
    if "weights" not in row:
        return row["messages"]
    out = []
    for m, w in zip(row["messages"], row["weights"]):
        out.append({**m, "weight": int(w)} if m["role"] == "assistant" else dict(m))
    return out


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


def stats_markdown(stats: dict[str, Any]) -> str:
    """A readable summary of stats.json (also what `simplan build` prints)."""
    ex = stats["examples"]
    lines = [
        f"# {stats['role']} dataset: {ex['total']} examples"
        + (" (episode windows, loss on every trained turn)" if stats.get("format") == "conversation" else ""),
        "",
        f"- tokenizer: `{stats['model']}`; prompt budget {stats['budget']['max_prompt_tokens']}, "
        f"completion budget {stats['budget']['max_completion_tokens']} tokens",
        f"- trajectories used: {stats['trajectories']['used']} (read {stats['trajectories']['read']}); "
        f"malformed lines skipped: {stats['malformed_lines']}",
        f"- built in {stats['seconds']['total']:.1f} s (tokenizing and fitting {stats['seconds']['tokenize']:.1f} s; "
        f"loading the tokenizer took {stats['seconds']['tokenizer']:.1f} s more)",
        *_oversample_line(stats.get("oversampled")),
        "",
        "| fold | examples | deduplicated | prompt p50 / p90 / p99 / max | completion p50 / p90 / p99 / max |",
        "|---|---:|---:|---|---|",
    ]
    for fold, n in ex["by_fold"].items():
        p, c = stats["tokens"]["by_fold"][fold]["prompt"], stats["tokens"]["by_fold"][fold]["completion"]
        lines.append(
            f"| {fold} | {n} | {stats['dedup']['by_fold'].get(fold, 0)} | "
            f"{p['p50']} / {p['p90']} / {p['p99']} / {p['max']} | {c['p50']} / {c['p90']} / {c['p99']} / {c['max']} |"
        )
    for title, key in (("env", "by_env"), ("env / family", "by_family"), ("source", "by_source")):
        lines += ["", f"| {title} | examples |", "|---|---:|"]
        lines += [f"| {k} | {v} |" for k, v in ex[key].items()]
    lines += ["", "| dropped or skipped | count |", "|---|---:|"]
    dropped = {**stats["dropped"], **{f"skipped: {k}": v for k, v in stats["skipped"].items()}}
    lines += [f"| {k} | {v} |" for k, v in dropped.items()] or ["| (none) | 0 |"]
    h = stats["history"]
    lines += [
        "",
        f"History truncated to fit the budget in {h['examples_truncated']} examples "
        f"({h['steps_dropped']} steps dropped, oldest first).",
    ]
    if stats["problems"]:
        lines += ["", "Malformed input (first ones):", ""] + [f"- `{p}`" for p in stats["problems"][:10]]
    return "\n".join(lines) + "\n"


def _oversample_line(oversampled: dict[str, Any] | None) -> list[str]:
    if not oversampled or not oversampled["copies"]:
        return []
    parts = [
        f"{policy} x{n} (+{oversampled['rows_added'].get(policy, 0)})" for policy, n in oversampled["copies"].items()
    ]
    return [f"- train examples repeated by policy (oversample; rows added): {', '.join(parts)}"]


def _trained_by_source(rows: list[dict[str, Any]]) -> dict[str, int]:
    """Conversation rows: trained turns by the source of their step."""
    counts = Counter(src for r in rows for src, w in zip(r["sources"], r["weights"]) if w)
    return dict(sorted(counts.items()))


def _stats(
    cfg: BuildConfig,
    files: list[Path],
    loaded: Loaded,
    rows: dict[str, list[dict[str, Any]]],
    dedup: dict[str, int],
    counts: Counter,
    seconds: dict[str, float],
) -> dict[str, Any]:
    all_rows = [r for fold in rows for r in rows[fold]]

    def by(key: Callable[[dict[str, Any]], str]) -> dict[str, int]:
        return dict(sorted(Counter(key(r) for r in all_rows).items()))

    dropped_keys = ("prompt_over_budget", "completion_over_budget", "failed_action")
    return {
        "role": cfg.role,
        "format": cfg.format,
        "model": cfg.model,
        "inputs": [str(p) for p in files],
        "budget": {"max_prompt_tokens": cfg.max_prompt_tokens, "max_completion_tokens": cfg.max_completion_tokens},
        "trajectories": {
            "read": len(loaded.trajectories) + sum(loaded.skipped.values()),
            "used": len(loaded.trajectories),
        },
        "malformed_lines": loaded.malformed_lines,
        "problems": loaded.problems[:MAX_REPORTED_PROBLEMS],
        "examples": {
            "total": len(all_rows),
            "by_fold": {f: len(rows[f]) for f in rows},
            "by_env": by(lambda r: r["env"]),
            "by_family": by(lambda r: f"{r['env']}/{r['family'] or '-'}"),
            "by_source": by(lambda r: r["source"]) if cfg.format == "step" else _trained_by_source(all_rows),
        },
        "dropped": {k: counts.get(k, 0) for k in dropped_keys},
        "skipped": {
            **dict(loaded.skipped),
            **{k: v for k, v in sorted(counts.items()) if k.startswith("source_")},
        },
        "dedup": {"total": sum(dedup.values()), "by_fold": dedup},
        "history": {
            "examples_truncated": sum(1 for r in all_rows if r["history_dropped"]),
            "steps_dropped": sum(r["history_dropped"] for r in all_rows),
        },
        "tokens": {
            "prompt": _percentiles([r["prompt_tokens"] for r in all_rows]),
            "completion": _percentiles([r["completion_tokens"] for r in all_rows]),
            "by_fold": {
                f: {
                    "prompt": _percentiles([r["prompt_tokens"] for r in rows[f]]),
                    "completion": _percentiles([r["completion_tokens"] for r in rows[f]]),
                }
                for f in rows
            },
        },
        "seconds": {k: round(v, 3) for k, v in seconds.items()},
    }


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
        from simplan.training.models import load_tokenizer

        tokenizer = load_tokenizer(cfg.model)
    t0 = time.perf_counter()  # tokenizer loading (imports transformers) is timed apart
    loaded = load_trajectories(files, include_errored=cfg.include_errored)
    if loaded.malformed_lines and not cfg.keep_going:
        refuse_malformed(loaded, files)
    check_folds(loaded.trajectories)
    counts: Counter = Counter()
    candidates = make_candidates(loaded.trajectories, cfg, counts) if cfg.format == "step" else []
    t1 = time.perf_counter()
    if cfg.format == "conversation":
        rows, dedup = conversation_rows(loaded.trajectories, cfg, tokenizer, counts)
        features = _conversation_features()
    else:
        rows, dedup = build_rows(candidates, cfg, tokenizer, counts)
        features = _features()
    rows, added = oversampled(rows, cfg.oversample)
    t2 = time.perf_counter()

    out = Path(cfg.out)
    folds = [f for f in FOLDS if f in {t.task.fold for t in loaded.trajectories}]
    paths = {"dataset": str(out / "dataset")}
    _save_dataset(rows, folds, out / "dataset", cfg.progress, features)
    for fold in FOLDS:
        path = out / f"{fold}.jsonl"
        if fold in folds:
            write_jsonl(path, ({"messages": openai_messages(r)} for r in rows.get(fold, [])))
            paths[fold] = str(path)
        elif path.exists():
            path.unlink()  # a fold from an earlier build into the same folder
    t3 = time.perf_counter()
    seconds = {"tokenizer": t0 - started, "load": t1 - t0, "tokenize": t2 - t1, "write": t3 - t2, "total": t3 - t0}
    stats = _stats(cfg, files, loaded, {f: rows.get(f, []) for f in folds}, dedup, counts, seconds)
    stats["oversampled"] = {"copies": cfg.oversample, "rows_added": added}
    paths |= {"stats": str(out / "stats.json"), "stats_md": str(out / "stats.md"), "config": str(out / "config.json")}
    paths["prompt_settings"] = str(write_settings(out, cfg.settings()))
    write_json(out / "stats.json", stats)
    write_text(out / "stats.md", stats_markdown(stats))
    write_json(out / "config.json", asdict(cfg))
    return BuildResult(out=out, stats=stats, paths=paths)
