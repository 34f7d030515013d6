"""Dataset rows from trajectories: one per step (`format: step`) or one per episode window (`format: conversation`).

    from simplan.data.build_rows import build_rows, conversation_rows, make_candidates, step_rows
    rows, dedup = conversation_rows(trajectories, cfg, tokenizer, counts)     # by fold; dedup counts by fold
    rows, dedup = build_rows(make_candidates(trajectories, cfg, counts), cfg, tokenizer, counts)
    for example in step_rows(rows["dev"][0]): ...        # a conversation row as per-step prompt/completion

`cfg` is the `BuildConfig` (data/build.py): which role, which step sources become targets, the token budgets.
A step row's prompt is fitted to the budget by dropping history oldest-first (data/format.py); a
conversation row is a window of the episode's EpisodeState rendered as chat (data/episode.py), loss on its
trained assistant turns (`weights`). `counts` collects what was dropped or skipped, by reason. The
`*_features` functions give the `datasets` column types of each format's rows.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from simplan.data import format as fmt
from simplan.data.build_branches import branch_messages, branch_rows
from simplan.data.episode import EpisodeState, renderer_for
from simplan.data.trajectory import Trajectory
from simplan.envs.actions import render_action
from simplan.envs.failures import FailureRules, rules_of_env

if TYPE_CHECKING:  # the config module builds the rows: a type-only import, no cycle at run time
    from simplan.data.build import BuildConfig


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


def failure_rules(traj: Trajectory, cfg: BuildConfig) -> FailureRules:
    """The failure rules of `traj` (which failures are transient: retried, not remembered), by the env the planner
    would know:
    `cfg.env` when given, else the name the trajectory recorded. Collection records an env's own name
    ("shop"), which resolves only where its package's entry point is installed; `--env package.module:Class`
    names it anywhere."""
    return rules_of_env(cfg.env or traj.env)


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
        rules = failure_rules(traj, cfg)  # transient failures are left out of the failure memory, as the planner does
        states = fmt.trajectory_states(traj, cfg.max_history, cfg.max_failures, rules)
        for step, state in zip(traj.steps, states):
            if reason := skip_reason(step, cfg):
                counts[reason] += 1
                continue
            action = render_action(step.action)
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


def _meta_features() -> dict[str, Any]:
    """Feature types of the `trajectory_meta` columns."""
    from datasets import Value

    return {k: Value("string") for k in ("env", "task_id", "fold", "family", "trajectory_id", "policy")}


def step_features():
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
    branches: list[tuple[Trajectory, dict[str, Any]]] = []
    seen_branches: set[bytes] = set()
    with_branches = cfg.role == "simulator" and cfg.settings().outcomes
    for traj in tqdm(trajectories, desc=f"build {cfg.role}: windows", unit="episode", disable=not cfg.progress):
        state = EpisodeState.from_trajectory(
            traj, lambda step: skip_reason(step, cfg) is None, failure_rules(traj, cfg)
        )
        pending += [(traj, state, ex) for ex in renderer.examples(state, cfg.role)]
        if with_branches:
            found, outcomes = branch_rows(traj, state, renderer, cfg, seen_branches)
            branches += [(traj, row) for row in found]
            counts.update({f"branch_outcome_{k}": v for k, v in outcomes.items()})
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
                "branches": [],
            }
        )
    for traj, row in branches:
        for part in _fitting_parts(row, tokenizer, count, count_texts, longest, counts):
            rows[traj.task.fold].append(_branch_row(traj, part, cfg))
    return dict(rows), dict(dedup)


def _fitting_parts(
    row: dict[str, Any], tokenizer: Any, count: Any, count_texts: Any, longest: int, counts: Counter
) -> list[dict[str, Any]]:
    """A branch row cut into rows whose packed sequence (prefix + branches) fits `longest` tokens, each with its
    token counts; a branch that does not fit behind its prefix alone is dropped and counted."""
    (prefix_tokens,) = count([row["messages"]])
    texts = [[b["action"], fmt.completion_text(tokenizer, b["reply"])] for b in row["branches"]]
    sizes = iter(count_texts([t for pair in texts for t in pair]))
    costs = [next(sizes) + next(sizes) + 8 for _ in texts]  # + the two messages' template tokens
    parts: list[dict[str, Any]] = []
    current: list[dict[str, Any]] = []
    used = prefix_tokens
    for branch, cost in zip(row["branches"], costs):
        if prefix_tokens + cost > longest:
            counts["branch_over_budget"] += 1
            continue
        if current and used + cost > longest:
            parts.append({**row, "branches": current, "prompt_tokens": prefix_tokens, "packed_tokens": used})
            current, used = [], prefix_tokens
        current.append(branch)
        used += cost
    if current:
        parts.append({**row, "branches": current, "prompt_tokens": prefix_tokens, "packed_tokens": used})
    return parts


def _branch_row(traj: Trajectory, part: dict[str, Any], cfg: BuildConfig) -> dict[str, Any]:
    """A row of the conversation dataset that holds a shared prefix and its branches (data/build_branches.py)."""
    n, t = len(part["messages"]), part["step"]
    return {
        "messages": part["messages"],
        "weights": [0] * n,
        "steps": [-1] + [t] * (n - 1),
        "valid_actions": [[] for _ in range(n)],
        "sources": [""] * n,
        "errors": [False] * n,
        **trajectory_meta(traj),
        "role": cfg.role,
        "window_start": t,
        "window_end": t,
        "trained_turns": len(part["branches"]),
        "prompt_tokens": part["packed_tokens"],
        "completion_tokens": part["packed_tokens"] - part["prompt_tokens"],
        "history_kept": 0,
        "history_dropped": t,
        "branches": part["branches"],
    }


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


def conversation_features():
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
            "branches": List(
                {
                    "action": Value("string"),
                    "reply": Value("string"),
                    "outcome": Value("string"),
                    "error": Value("bool"),
                }
            ),
        }
    )


def step_rows(row: dict[str, Any]) -> list[dict[str, Any]]:
    """A conversation row as per-step rows (prompt = the messages before a trained assistant turn,
    completion = that turn), the view `eval-model` scores; a per-step row is returned as it is."""
    if "weights" not in row:
        return [row]
    meta = {k: row[k] for k in ("env", "task_id", "fold", "family", "trajectory_id", "policy", "role")}
    out = [
        {
            "prompt": branch_messages(row["messages"], b)[:-1],
            "completion": b["reply"],
            **meta,
            "step": row["window_start"],
            "source": "alternative",
            "error": b["error"],
            "valid_actions": [],
        }
        for b in row.get("branches") or []
    ]
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
    """A row as OpenAI fine-tuning messages: assistant turns carry `weight` (1 trains, 0 is context). A branch row
    is one conversation per branch (`openai_conversations`), so this gives its first."""
    if "weights" not in row:
        return row["messages"]
    if row.get("branches"):
        return openai_conversations(row)[0]
    out = []
    for m, w in zip(row["messages"], row["weights"]):
        out.append({**m, "weight": int(w)} if m["role"] == "assistant" else dict(m))
    return out


def openai_conversations(row: dict[str, Any]) -> list[list[dict[str, Any]]]:
    """A row as the OpenAI fine-tuning conversations it trains: one for a window, one per branch of a branch row
    (the shared prefix as context, weight 1 on the branch's reply only)."""
    if not row.get("branches"):
        return [openai_messages(row)]
    return [
        [{**m, "weight": 0} if m["role"] == "assistant" else dict(m) for m in branch_messages(row["messages"], b)[:-1]]
        + [{"role": "assistant", "content": b["reply"], "weight": 1}]
        for b in row["branches"]
    ]
