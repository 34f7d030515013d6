"""The one prompt format, shared by dataset building (training) and the planner (inference).

Every prompt simplan sends to a model is rendered here; nothing else in the code base writes
prompt text. A prompt is a list of chat messages (system + user); the chat template of the
model's tokenizer turns it into text (`tokenizer.apply_chat_template`), so the same messages work
for any instruct model. Completions are the rendered action (decider) or the next observation
(simulator), followed by the tokenizer's EOS token during training so the model learns to stop.

    state = state_from_steps(goal, observation, past_steps, valid_actions=..., failures=...)
    messages = decider_messages(state)                 # -> ask for the next action
    messages = simulator_messages(state, action)       # -> ask for the next observation
    state = fit_to_budget(state, decider_messages, count_tokens, budget=1024)

History is token-budgeted: `fit_to_budget` keeps the goal, the failure memory and the current
observation, and drops the oldest history steps first.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from simplan.envs.base import Action, ActionParseError

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
SECTION_GOAL = "Goal: {goal}"
SECTION_FAILURES = "Failed before (avoid repeating):\n{items}"
SECTION_HISTORY = "Recent steps:\n{items}"
SECTION_OBSERVATION = "Current observation:\n{observation}"
SECTION_VALID = "Valid actions: {actions}"
SECTION_TOOLS = "Tools:\n{tools}"
SECTION_ACTION = "Action: {action}"
ASK_DECIDER = "Next action?"
ASK_SIMULATOR = "Observation after this action?"
HISTORY_ITEM = "> {action}\n{observation}"
ERROR_MARK = " [failed]"
FINISH_TEXT = "finish()"


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
# Actions <-> text
# ---------------------------------------------------------------------------------------------
def render_action(action: Action) -> str:
    """The text a model reads and writes for an action (the decider's completion)."""
    if action.kind == "tool_call":
        args = ", ".join(f"{k}={v!r}" for k, v in action.arguments.items())
        return f"{action.name}({args})"
    if action.kind == "finish":
        return FINISH_TEXT
    return action.text.strip()


def parse_tool_call(text: str, allowed: Sequence[str] | None = None) -> Action:
    """Parse `name(arg=literal, ...)` or `finish()` with `ast`; values must be Python literals.

    Nothing is evaluated: only the syntax tree is read, and only names in `allowed` are accepted.
    """
    src = text.strip()
    if not src:
        raise ActionParseError("empty tool call")
    try:
        tree = ast.parse(src, mode="eval")
    except SyntaxError as e:
        raise ActionParseError(f"not a Python call expression: {src!r} ({e.msg})") from None
    call = tree.body
    if not isinstance(call, ast.Call) or not isinstance(call.func, ast.Name):
        raise ActionParseError(f"expected name(arg=value, ...), got {src!r}")
    if call.args:
        raise ActionParseError(f"{call.func.id}: use keyword arguments only")
    name = call.func.id
    if name == "finish":
        if call.keywords:
            raise ActionParseError("finish() takes no arguments")
        return Action(kind="finish")
    if allowed is not None and name not in allowed:
        raise ActionParseError(f"{name!r} is not one of this task's tools: {', '.join(allowed)}")
    arguments: dict[str, Any] = {}
    for kw in call.keywords:
        if kw.arg is None:
            raise ActionParseError(f"{name}: **kwargs are not allowed")
        try:
            arguments[kw.arg] = ast.literal_eval(kw.value)
        except (ValueError, SyntaxError):
            raise ActionParseError(f"{name}: argument {kw.arg!r} is not a literal value") from None
    return Action.tool_call(name, arguments)


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


def failure_note(action: Action, observation: str, max_chars: int = 160) -> str:
    """One failure-memory line: the action and what the environment answered."""
    obs = " ".join(observation.split())
    if len(obs) > max_chars:
        obs = obs[: max_chars - 3] + "..."
    return f"{render_action(action)} -> {obs}"


def _render_tools(tools: list[dict[str, Any]]) -> str:
    return "\n".join(json.dumps(t, ensure_ascii=False, separators=(",", ":")) for t in tools)


def _state_sections(state: PromptState) -> list[str]:
    sections = [SECTION_GOAL.format(goal=state.goal.strip())]
    if state.failures:
        sections.append(SECTION_FAILURES.format(items="\n".join(f"- {f}" for f in state.failures)))
    if state.history:
        items = [
            HISTORY_ITEM.format(action=h.action + (ERROR_MARK if h.error else ""), observation=h.observation.strip())
            for h in state.history
        ]
        sections.append(SECTION_HISTORY.format(items="\n".join(items)))
    sections.append(SECTION_OBSERVATION.format(observation=state.observation.strip()))
    if state.tools:
        sections.append(SECTION_TOOLS.format(tools=_render_tools(state.tools)))
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


def observation_completion(observation: str) -> str:
    """The simulator's target text for an observation."""
    return observation.strip()


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


def prompt_text(tokenizer: Any, messages: Messages) -> str:
    """The exact prompt string a model sees: chat template with the assistant turn opened."""
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)


def completion_text(tokenizer: Any, completion: str) -> str:
    """Completion followed by EOS, so a fine-tuned model learns to stop after one action."""
    eos = tokenizer.eos_token or ""
    return completion + eos
