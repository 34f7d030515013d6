"""The one prompt format, shared by dataset building (training) and the planner (inference).

Every prompt template lives here: the per-step layout is rendered here, the conversation layout by
data/episode.py from these same templates; nothing else in the code base writes prompt text. A
prompt is a list of chat messages (system + user); the chat template of the model's tokenizer turns
it into text (`tokenizer.apply_chat_template`), so the same messages work
for any instruct model. Completions are the rendered action (decider) or the next observation
(simulator), followed by the tokenizer's EOS token during training so the model learns to stop.

    state = state_from_steps(goal, observation, past_steps, valid_actions=..., failures=...)
    messages = decider_messages(state)                 # -> ask for the next action
    messages = simulator_messages(state, action)       # -> ask for the next observation
    state = fit_to_budget(state, decider_messages, count_tokens, budget=1024)

    states = trajectory_states(traj)                   # the state before each step of a recorded episode
    fits = fit_batch_to_budget(states, decider_messages, chat_batch_token_counter(tok), 1024,
                               count_texts=text_token_counter(tok))   # many states, few tokenizer calls

History is token-budgeted: `fit_to_budget` keeps the goal, the failure memory and the current
observation, and drops the oldest history steps first.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from simplan.data.outcomes import OUTCOMES
from simplan.envs.actions import render_action
from simplan.envs.base import Action
from simplan.envs.failures import FailureRules

if TYPE_CHECKING:
    from simplan.data.trajectory import Trajectory

Messages = list[dict[str, str]]

# ---------------------------------------------------------------------------------------------
# Templates: prompts are data, kept together here.
# ---------------------------------------------------------------------------------------------
DECIDER_SYSTEM = (
    "You are the decider of an agent acting in an environment. Given the goal, recent steps and the "
    "current observation, reply with exactly one next action and nothing else."
)
SIMULATOR_SYSTEM = (
    "You are the simulator of an environment. Given the goal, recent steps, the current observation and "
    "an action, reply with exactly the observation the environment will return after that action."
)
TOOL_ACTION_HINT = (
    "Reply with one tool call written as name(arg=value, ...) with Python literal values, "
    "or finish() when the user's request is done."
)
# The conversation format (data/episode.py): one system message per window, observations as user
# turns, actions as assistant turns (mirrored for the simulator).
CONVERSATION_DECIDER_SYSTEM = (
    "You are the decider of an agent acting in an environment. Each user turn is what the environment "
    "shows now; reply with exactly one next action and nothing else."
)
CONVERSATION_SIMULATOR_SYSTEM = (
    "You are the simulator of an environment. Each user turn is an action; reply with exactly the "
    "observation the environment returns after it."
)
CONVERSATION_OUTCOME_SIMULATOR_SYSTEM = (
    "You are the simulator of an environment. Each user turn is an action; reply with what it leads to on the "
    "first line (Outcome: error, no change, progress, won or lost), then exactly the observation the environment "
    "returns after it."
)
SECTION_START = "Observation:\n{observation}"
SECTION_NOTE = "Note: {note}"
SECTION_NEW_TOOLS = "Tools now:\n{tools}"
SECTION_GOAL = "Goal: {goal}"
SECTION_FAILURES = "Failed before (avoid repeating):\n{items}"
SECTION_KNOWN = "Known from earlier steps:\n{items}"
SECTION_HISTORY = "Recent steps:\n{items}"
SECTION_OBSERVATION = "Current observation:\n{observation}"
SECTION_VALID = "Valid actions: {actions}"
SECTION_TOOLS = "Tools:\n{tools}"
SECTION_ACTION = "Action: {action}"
ASK_DECIDER = "Next action?"
ASK_SIMULATOR = "Observation after this action?"
HISTORY_ITEM = "> {action}\n{observation}"
ERROR_MARK = " [failed]"
# The last line of a simulator reply for a step that ended the episode (PromptSettings.verdicts): the env's verdict,
# which the episode's final text alone often does not show (a TWX game lost on one wrong action says nothing).
VERDICT_MARKER = "[episode over: {verdict}]"
VERDICTS = ("won", "lost")
# The first line of a simulator reply with PromptSettings.outcomes: what the action leads to, one of
# data/outcomes.py OUTCOMES (written with spaces: "no change"). First, so the planner can score the classes
# teacher-forced from the prompt alone (`outcome_line` of each class), without generating the observation.
OUTCOME_MARKER = "Outcome: {outcome}"


@dataclass
class HistoryItem:
    action: str  # rendered action
    observation: str
    error: bool = False


@dataclass
class PromptState:
    """Everything a prompt shows about the current moment of an episode."""

    goal: str
    observation: str
    history: list[HistoryItem] = field(default_factory=list)
    valid_actions: list[str] | None = None
    tools: list[dict[str, Any]] | None = None
    failures: list[str] = field(default_factory=list)  # failure memory, oldest first


# ---------------------------------------------------------------------------------------------
# States and messages
# ---------------------------------------------------------------------------------------------
def history_item(action: Action, observation: str, error: bool = False) -> HistoryItem:
    return HistoryItem(action=render_action(action), observation=observation, error=error)


def state_from_steps(
    goal: str,
    observation: str,
    past: Sequence[tuple[Action, str, bool]] = (),
    valid_actions: list[str] | None = None,
    tools: list[dict[str, Any]] | None = None,
    failures: list[str] | None = None,
    max_history: int | None = None,
) -> PromptState:
    """Build a PromptState from (action, observation, error) triples of the episode so far."""
    items = [history_item(a, o, e) for a, o, e in past]
    if max_history is not None:
        items = items[-max_history:] if max_history > 0 else []
    return PromptState(
        goal=goal,
        observation=observation,
        history=items,
        valid_actions=valid_actions,
        tools=tools,
        failures=list(failures or []),
    )


def failure_note(action: Action | str, observation: str, max_chars: int = 160) -> str:
    """One failure-memory line: the action (or its rendered text) and what the environment answered."""
    obs = " ".join(observation.split())
    if len(obs) > max_chars:
        obs = obs[: max_chars - 3] + "..."
    text = action if isinstance(action, str) else render_action(action)
    return f"{text} -> {obs}"


def pivot_note(
    rules: Sequence[str],
    action: str,
    expected: str | None = None,
    failure: str | None = None,
    banned: bool = False,
    max_chars: int = 80,
) -> str:
    """The note a pivot leaves for the next decision (Turn.notes, shown when PromptSettings.notes): the rules that
    fired at `action` (rendered), what was expected of it (cut to `max_chars`), the failure's class and whether the
    action is now banned in that state. What was seen is the observation the note is shown with, so the note does
    not repeat it. One text for the planner (inference/planning/planner.py) and collection (data/recorder.py), so a
    decider trained on notes reads the planner's own.

        pivot error_observation at order(item='kettle') (failure: replan)
        pivot expectation_mismatch at go east: expected 'Room 2.' (banned here)
    """
    note = f"pivot {'+'.join(rules)} at {action}"
    if expected is not None:
        text = " ".join(expected.split())
        note += f": expected {text if len(text) <= max_chars else text[: max_chars - 3] + '...'!r}"
    extra = ([f"failure: {failure}"] if failure else []) + (["banned here"] if banned else [])
    return note + (f" ({'; '.join(extra)})" if extra else "")


ERROR_RULE = "error_observation"  # the pivot rule of a failed action (inference/planning/pivots.py ErrorObservation)


def failed_step_note(action: str, failure: str) -> str:
    """The note after a failed step whose failure is not transient, written by every planning arm and by
    collection alike (a transient failure is retried, not noted): the error rule's pivot note."""
    return pivot_note([ERROR_RULE], action, failure=failure)


DEFAULT_MAX_FAILURES = 5  # failure-memory lines a prompt shows (most recent distinct ones)
DEFAULT_MAX_HISTORY = 8  # recent steps a prompt shows before the token budget trims further


def trajectory_states(
    traj: Trajectory,
    max_history: int | None = DEFAULT_MAX_HISTORY,
    max_failures: int | None = DEFAULT_MAX_FAILURES,
    rules: FailureRules | None = None,
) -> list[PromptState]:
    """The PromptState before each step of a recorded trajectory: `states[i]` is what step i's actor saw.

    Goal and tools are the trajectory's, updated by a step's `info["goal"]` / `info["tools"]` (set
    by collection when an observation changes them) from the next step on.
    History is every earlier real transition (noise and failed ones included, marked `[failed]`),
    the most recent `max_history` of them when given; the failure memory holds `failure_note`s of
    the earlier failed steps, distinct, the most recent `max_failures`, except transient ones (as `rules`
    says, envs/failures.py: a 503 is retried, not avoided, as the planner does). History items are built once
    per trajectory and shared between states, so this is linear in the trajectory length.
    """
    rules = rules if rules is not None else FailureRules()
    items = [history_item(s.action, s.next_observation, s.error) for s in traj.steps]
    states, failures = [], {}  # note -> None, in the order of each note's latest occurrence
    goal, tools = traj.goal, traj.tools
    for i, step in enumerate(traj.steps):
        if i > 0:  # a BFCL user turn (goal, maybe tools), what a TWX agent read (goal)
            goal = traj.steps[i - 1].info.get("goal") or goal
            tools = traj.steps[i - 1].info.get("tools") or tools
        start = 0 if max_history is None else max(0, i - max_history)
        notes = list(failures)
        if max_failures is not None:
            notes = notes[-max_failures:] if max_failures > 0 else []
        states.append(
            PromptState(
                goal=goal,
                observation=step.observation,
                history=items[start:i],
                valid_actions=step.valid_actions,
                tools=tools,
                failures=notes,
            )
        )
        if step.error and not rules.is_transient(step.next_observation, True):
            note = failure_note(step.action, step.next_observation)
            failures.pop(note, None)
            failures[note] = None
    return states


def state_at_step(
    traj: Trajectory,
    index: int,
    max_history: int | None = DEFAULT_MAX_HISTORY,
    max_failures: int | None = DEFAULT_MAX_FAILURES,
) -> PromptState:
    """The PromptState right before step `index` of `traj` (see `trajectory_states`)."""
    if not 0 <= index < len(traj.steps):
        raise IndexError(f"step {index}: trajectory {traj.id} has {len(traj.steps)} steps")
    head = replace(traj, steps=traj.steps[: index + 1])
    return trajectory_states(head, max_history=max_history, max_failures=max_failures)[index]


def render_tools(tools: list[dict[str, Any]]) -> str:
    """Tool schemas as prompts show them: one compact JSON object per line."""
    return "\n".join(json.dumps(t, ensure_ascii=False, separators=(",", ":")) for t in tools)


def history_item_text(item: HistoryItem) -> str:
    """One history step as the prompt shows it (action, failure mark, observation)."""
    return HISTORY_ITEM.format(
        action=item.action + (ERROR_MARK if item.error else ""), observation=item.observation.strip()
    )


def _state_sections(state: PromptState) -> list[str]:
    sections = [SECTION_GOAL.format(goal=state.goal.strip())]
    if state.failures:
        sections.append(SECTION_FAILURES.format(items="\n".join(f"- {f}" for f in state.failures)))
    if state.history:
        sections.append(SECTION_HISTORY.format(items="\n".join(history_item_text(h) for h in state.history)))
    sections.append(SECTION_OBSERVATION.format(observation=state.observation.strip()))
    if state.tools:
        sections.append(SECTION_TOOLS.format(tools=render_tools(state.tools)))
        sections.append(TOOL_ACTION_HINT)
    elif state.valid_actions:
        sections.append(SECTION_VALID.format(actions=" | ".join(state.valid_actions)))
    return sections


def decider_messages(state: PromptState) -> Messages:
    user = "\n\n".join(_state_sections(state) + [ASK_DECIDER])
    return [{"role": "system", "content": DECIDER_SYSTEM}, {"role": "user", "content": user}]


def simulator_messages(state: PromptState, action: Action | str) -> Messages:
    rendered = action if isinstance(action, str) else render_action(action)
    user = "\n\n".join(_state_sections(state) + [SECTION_ACTION.format(action=rendered), ASK_SIMULATOR])
    return [{"role": "system", "content": SIMULATOR_SYSTEM}, {"role": "user", "content": user}]


def observation_completion(observation: str, verdict: str | None = None, outcome: str | None = None) -> str:
    """The simulator's reply: with `outcome`, its outcome line first; the observation; then, for a step that ended
    the episode (`episode_verdict`), the verdict line. Both formats' builders and the conversation renderer write
    every simulator reply with it."""
    text = observation.strip()
    text = text if verdict is None else f"{text}\n{verdict_line(verdict)}"
    return text if outcome is None else outcome_line(outcome) + text


def outcome_line(outcome: str) -> str:
    """The outcome line of a simulator reply, its newline included: the prefix the planner scores per class."""
    if outcome not in OUTCOMES:
        raise ValueError(f"outcome: {outcome!r} is not one of {', '.join(OUTCOMES)}")
    return OUTCOME_MARKER.format(outcome=outcome.replace("_", " ")) + "\n"


def split_outcome(text: str) -> tuple[str, str | None]:
    """(the reply without its outcome line, the outcome class or None) of a simulator reply. Strict: only a first
    line that is exactly an outcome line is one; anything else is the observation, returned as it is."""
    first, sep, rest = text.lstrip().partition("\n")
    for outcome in OUTCOMES:
        if first.strip() == OUTCOME_MARKER.format(outcome=outcome.replace("_", " ")):
            return rest.strip(), outcome
    return text, None


def episode_verdict(done: bool, won: bool) -> str | None:
    """ "won" or "lost" for a step that ended the episode (the env's `done`), None for one it goes on after (a
    step cap that truncated a recording is not an end: the env gave no verdict)."""
    if not done:
        return None
    return "won" if won else "lost"


def verdict_line(verdict: str) -> str:
    if verdict not in VERDICTS:
        raise ValueError(f"verdict: {verdict!r} is not one of {VERDICTS}")
    return VERDICT_MARKER.format(verdict=verdict)


def split_verdict(text: str) -> tuple[str, str | None]:
    """(the reply without its verdict line, "won" / "lost" / None) of a simulator reply.

    Strict: only a final line that is exactly a verdict marker (whitespace around it aside) is a verdict; a
    marker inside the text or sharing its line with other words is part of the observation, returned as it is.
    """
    head, _, last = text.rstrip().rpartition("\n")
    for verdict in VERDICTS:
        if last.strip() == VERDICT_MARKER.format(verdict=verdict):
            return head.strip(), verdict
    return text, None


# ---------------------------------------------------------------------------------------------
# Token budget
# ---------------------------------------------------------------------------------------------
def fit_to_budget(
    state: PromptState,
    render: Callable[[PromptState], Messages],
    count_tokens: Callable[[Messages], int],
    budget: int,
) -> tuple[PromptState, int]:
    """Drop the oldest history steps until the rendered prompt fits `budget` tokens.

    Returns (fitted state, number of history steps dropped). The goal, the failure memory and the
    current observation are always kept; if even the empty-history prompt is too long the state is
    returned without history and the caller decides (the builder counts it as over budget).
    """
    if count_tokens(render(state)) <= budget:
        return state, 0
    # Binary search on how many of the most recent steps fit (prompt length grows with history).
    lo, hi = 0, len(state.history)  # lo steps always fit-or-minimal, hi known too long
    while lo < hi - 1:
        mid = (lo + hi) // 2
        if count_tokens(render(replace(state, history=state.history[-mid:] if mid else []))) <= budget:
            lo = mid
        else:
            hi = mid
    kept = state.history[-lo:] if lo else []
    return replace(state, history=kept), len(state.history) - len(kept)


def chat_token_counter(tokenizer: Any, add_generation_prompt: bool = True) -> Callable[[Messages], int]:
    """count_tokens(messages) for `fit_to_budget` using the tokenizer's own chat template."""

    def count(messages: Messages) -> int:
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tokenize=True)
        if isinstance(ids, dict) or hasattr(ids, "keys"):
            ids = ids["input_ids"]
        return len(ids)

    return count


def chat_batch_token_counter(
    tokenizer: Any, add_generation_prompt: bool = True
) -> Callable[[list[Messages]], list[int]]:
    """count_batch(list of messages) -> token counts, equal to `chat_token_counter` one by one.

    Renders every conversation with the chat template, then tokenizes all texts in one call of the
    fast tokenizer (the template already holds the special tokens, so none are added).
    """

    def count(batch: list[Messages]) -> list[int]:
        if not batch:
            return []
        texts = tokenizer.apply_chat_template(list(batch), add_generation_prompt=add_generation_prompt, tokenize=False)
        return text_token_counter(tokenizer)(texts)

    return count


def text_token_counter(tokenizer: Any) -> Callable[[list[str]], list[int]]:
    """count_texts(list of plain strings) -> token counts, in one fast-tokenizer call, no special tokens added."""

    def count(texts: list[str]) -> list[int]:
        if not texts:
            return []
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is not None and _plain_backend(backend):
            # Only lengths are needed: skip converting every id list to Python (a third of the time).
            return [len(e) for e in backend.encode_batch(list(texts), add_special_tokens=False)]
        enc = tokenizer(list(texts), add_special_tokens=False, return_attention_mask=False)
        return [len(ids) for ids in enc["input_ids"]]

    return count


def _plain_backend(backend: Any) -> bool:
    """True when the Rust tokenizer has no truncation, padding or special-token splitting left set on it."""
    return (
        backend.truncation is None and backend.padding is None and not getattr(backend, "encode_special_tokens", False)
    )


@dataclass
class Fit:
    """One `fit_batch_to_budget` result: the fitted state, history steps dropped, its exact prompt tokens."""

    state: PromptState
    dropped: int
    tokens: int
    messages: Messages  # the fitted state rendered (what `tokens` counts)


def _with_last(state: PromptState, k: int) -> PromptState:
    return state if k == len(state.history) else replace(state, history=state.history[-k:] if k else [])


def fit_batch_to_budget(
    states: Sequence[PromptState],
    render: Callable[[PromptState], Messages],
    count_batch: Callable[[list[Messages]], list[int]],
    budget: int,
    count_texts: Callable[[list[str]], list[int]] | None = None,
    slack: int = 2,
    guided_rounds: int = 3,
    calibration: int = 64,
) -> list[Fit]:
    """`fit_to_budget` for many states at once, with a few batched tokenizer calls instead of one per probe.

    Every kept history is verified exactly: a returned `tokens` is the real count of the rendered
    prompt, and it is within `budget` unless even the history-free prompt is not (then the state
    comes back without history and the caller decides, as with `fit_to_budget`).

    Without `count_texts` each round probes every unresolved state once (full history first, then
    bisection). With `count_texts` the probes are guided, so most states are settled by one probe:
    the first guess estimates tokens from characters (at rates measured on `calibration` sampled
    prompts and history items); later guesses start from the exact count of the previous probe and
    add or remove history items, the ones next to the boundary tokenized exactly. A state is
    settled when one more step is known not to fit, or is estimated to exceed the budget by more than
    `slack` tokens (separately tokenized items differ from the joined text only at item boundaries).
    After `guided_rounds` rounds the search falls back to plain bisection.
    """
    n = len(states)
    sizes = [len(s.history) for s in states]
    lo, lo_tokens = [-1] * n, [0] * n  # most steps known to fit (-1: none known yet)
    hi, hi_tokens = [h + 1 for h in sizes], [0] * n  # fewest steps known not to fit
    lo_messages: list[Messages] = [[]] * n
    hi_messages: list[Messages] = [[]] * n
    guess = list(sizes)
    guided = count_texts is not None and any(sizes)
    if guided:
        est = _ItemEstimates(states, render, count_batch, count_texts, sizes, calibration)
        guess = [est.first_guess(i, budget) for i in range(n)]
    pending = list(range(n))
    rounds = 0
    while pending:
        probes = [render(_with_last(states[i], guess[i])) for i in pending]
        counts = count_batch(probes)
        rounds += 1
        for i, c, msgs in zip(pending, counts, probes):
            if c <= budget:
                lo[i], lo_tokens[i], lo_messages[i] = guess[i], c, msgs
            else:
                hi[i], hi_tokens[i], hi_messages[i] = guess[i], c, msgs
        pending = [i for i in pending if hi[i] != lo[i] + 1]
        use_estimates = guided and rounds <= guided_rounds
        if use_estimates:  # exact counts for the items on either side of each probe
            est.tokenize([h for i in pending for h in _next_to(states[i].history, guess[i])])
        still = []
        for i, c in zip(pending, [lo_tokens[i] if lo[i] == guess[i] else hi_tokens[i] for i in pending]):
            nxt = est.next_probe(i, guess[i], c, lo[i], hi[i], budget, slack) if use_estimates else -1
            if nxt is None:
                continue  # one more step would overflow by more than the estimate can be off
            if not lo[i] < nxt < hi[i]:
                nxt = (lo[i] + hi[i]) // 2
            guess[i] = nxt
            still.append(i)
        pending = still
    out = []
    for i, state in enumerate(states):
        k = max(lo[i], 0)
        tokens, messages = (lo_tokens[i], lo_messages[i]) if lo[i] >= 0 else (hi_tokens[i], hi_messages[i])
        out.append(Fit(state=_with_last(state, k), dropped=sizes[i] - k, tokens=tokens, messages=messages))
    return out


def _next_to(history: list[HistoryItem], k: int) -> list[HistoryItem]:
    """The oldest kept item and the newest dropped one, when keeping the last k items."""
    return [history[-j] for j in (k, k + 1) if 0 < j <= len(history)]


class _ItemEstimates:
    """Token estimates for history items (exact once tokenized) and the guesses built on them."""

    def __init__(
        self,
        states: Sequence[PromptState],
        render: Callable[[PromptState], Messages],
        count_batch: Callable[[list[Messages]], list[int]],
        count_texts: Callable[[list[str]], list[int]],
        sizes: list[int],
        calibration: int,
    ) -> None:
        self.states, self.render, self.count_texts = states, render, count_texts
        self.exact: dict[int, int] = {}  # id(item) -> tokens; items are shared between a trajectory's states
        sep, header = count_texts(["\n", SECTION_HISTORY.format(items="") + "\n\n"])
        self.sep, self.header = sep, header
        with_history = [i for i, size in enumerate(sizes) if size]
        step = max(1, len(with_history) // calibration)
        sample = with_history[::step][:calibration]
        bases = [render(_with_last(states[i], 0)) for i in sample]
        base_chars = sum(len(m["content"]) for msgs in bases for m in msgs)
        self.base_rate = sum(count_batch(bases)) / max(1, base_chars)
        items = [states[i].history[-1] for i in sample]
        self.tokenize(items)
        item_chars = sum(len(history_item_text(h)) for h in items)
        self.item_rate = sum(self.exact[id(h)] for h in items) / max(1, item_chars)

    def tokenize(self, items: list[HistoryItem]) -> None:
        todo = {id(h): h for h in items if id(h) not in self.exact}
        counts = self.count_texts([history_item_text(h) for h in todo.values()])
        self.exact.update(zip(todo, counts))

    def item(self, h: HistoryItem) -> int:
        tokens = self.exact.get(id(h))
        return tokens if tokens is not None else round(len(history_item_text(h)) * self.item_rate)

    def joined(self, k: int) -> int:
        """Tokens that join the k-th newest item to the prompt: the section header for the first one."""
        return self.header if k == 1 else self.sep

    def first_guess(self, i: int, budget: int) -> int:
        state = self.states[i]
        if not state.history:
            return 0
        base = sum(len(m["content"]) for m in self.render(_with_last(state, 0)))
        total, k = round(base * self.base_rate), 0
        for h in reversed(state.history):
            total += self.item(h) + self.joined(k + 1)
            if total > budget:
                break
            k += 1
        return k

    def next_probe(self, i: int, k: int, tokens: int, lo: int, hi: int, budget: int, slack: int) -> int | None:
        """The next number of items to probe, from the exact count `tokens` with k items; None when settled."""
        history, total = self.states[i].history, tokens
        if tokens <= budget:  # add items while the estimate fits
            best = k
            while best + 1 < hi:
                total += self.item(history[-(best + 1)]) + self.joined(best + 1)
                if total > budget:
                    break
                best += 1
            if best > k:
                return best
            return None if total > budget + slack or k + 1 >= hi else k + 1
        while k > lo + 1 and total > budget:  # remove items until the estimate fits
            total -= self.item(history[-k]) + self.joined(k)
            k -= 1
        return k


def prompt_text(tokenizer: Any, messages: Messages) -> str:
    """The exact prompt string a model sees: chat template with the assistant turn opened."""
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)


def eos_ends_assistant_turn(tokenizer: Any) -> tuple[bool, str]:
    """Whether the chat template closes an assistant turn with the tokenizer's EOS, and what it writes
    after the turn's content (up to 24 characters).

    Training appends EOS to every completion and engines stop on it; when the template closes turns
    with another token, an adapter learns a stop token the model's own format does not use. That is
    how a broken tokenizer conversion shows (eos_token set to the turn *opener*). (True, "") when the
    tokenizer has no chat template to compare with.
    """
    sentinel = "\u2063simplan-end-of-content\u2063"
    messages = [{"role": "user", "content": "u"}, {"role": "assistant", "content": sentinel}]
    try:
        text = tokenizer.apply_chat_template(messages, tokenize=False)
    except Exception:  # no template, or one that refuses this shape: nothing to compare
        return True, ""
    if sentinel not in text:
        return True, ""
    after = text.split(sentinel, 1)[1]
    eos = tokenizer.eos_token or ""
    return bool(eos) and after.startswith(eos), after[:24]


def completion_text(tokenizer: Any, completion: str) -> str:
    """Completion followed by EOS, so a fine-tuned model learns to stop after one action."""
    eos = tokenizer.eos_token or ""
    return completion + eos
