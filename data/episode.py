"""One episode, one conversation: the state both training and inference render prompts from.

An `EpisodeState` is appended to step by step (the observation, what the env lists, the action,
whether it failed, notes the planner wrote) and a `ConversationRenderer` turns it into chat
messages for the decider and the simulator. `simplan build` replays recorded trajectories into an
EpisodeState (`EpisodeState.from_trajectory`); the planner appends real steps while acting and
imagined ones while imagining (`state.branch().step(...)`), so an imagined step renders exactly
like a real one, and every prompt the planner sends is a prefix of a training sequence.

    state = EpisodeState.start(goal, observation, tools=None, valid_actions=[...])
    state.step(action_text, next_observation, error=False, valid_actions=[...])
    renderer = ConversationRenderer(PromptSettings(budget=1024), text_token_counter(tokenizer))
    renderer.decider_messages(state)                 # system + goal, user/assistant turns, open user turn
    renderer.simulator_messages(state, "open fridge")
    renderer.examples(state, "decider")              # training sequences with per-message weights

The decider's conversation: a system message (instructions, goal, tools, the failure memory and, with
`PromptSettings.snapshot`, what the steps before the window told as belief-state facts), then
one user turn per step (the observation, the valid actions when `show_valid` is set, notes) and one
assistant turn per action. The simulator's is mirrored: the system message also holds the
observation the window starts from, each action is a user turn and the observation it led to the
assistant turn. With `PromptSettings.verdicts`, the reply to a step that ended the episode ends with the
env's verdict line (`[episode over: won]` / `[episode over: lost]`, data/format.py), so a simulator learns to
say when an action ends the game; a truncated episode's last step gets none.

Windows. An episode longer than the token budget is cut into windows, each repeating the system
message (with the goal as it stands at the window's start) and starting `overlap` steps before its
first trained step. The window of step t is a pure function of the steps up to t (greedy: a step
opens a new window when its prompt would not fit), so the planner at step t and the builder agree
on it without knowing the future, and consecutive steps share their prompt prefix.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from simplan.data.format import (
    CONVERSATION_DECIDER_SYSTEM,
    CONVERSATION_OUTCOME_SIMULATOR_SYSTEM,
    CONVERSATION_SIMULATOR_SYSTEM,
    SECTION_FAILURES,
    SECTION_GOAL,
    SECTION_KNOWN,
    SECTION_NEW_TOOLS,
    SECTION_NOTE,
    SECTION_START,
    SECTION_TOOLS,
    SECTION_VALID,
    TOOL_ACTION_HINT,
    episode_verdict,
    failure_note,
    observation_completion,
    outcome_line,
    render_tools,
    text_token_counter,
)
from simplan.data.outcomes import classify_outcome
from simplan.envs.actions import render_action
from simplan.envs.failures import FailureRules, rules_of_env
from simplan.envs.subgoals import Belief, Fact, describe_belief

if TYPE_CHECKING:
    from simplan.data.trajectory import Step, Trajectory

Messages = list[dict[str, str]]
ROLES = ("decider", "simulator")
FORMATS = ("conversation", "step")
SETTINGS_FILE = "prompt_settings.json"


# ---------------------------------------------------------------------------------------------
# Settings: they shape every prompt, so they travel with the dataset and the adapter
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PromptSettings:
    """How prompts are laid out. Written by `build` into the dataset, copied by `train` into the adapter,
    read by the planner, `eval-model` and `serve`: a setting has one home, the artifact it shaped."""

    format: str = "conversation"  # conversation | step (one prompt per step, data/format.py)
    budget: int = 1024  # prompt tokens (chat template included) a window may reach, reserve included
    reserve: int = 64  # tokens kept free for the completion when deciding where a window ends
    overlap: int = 2  # steps a new window repeats as context before its first trained step
    show_valid: bool = False  # list the valid actions in every decider user turn
    max_failures: int = 5  # failure-memory lines in a window's system message (newest distinct)
    max_history: int | None = 8  # step format only: recent steps a prompt shows before the budget trims
    # Simulator: a reply to a step that ended the episode ends with the env's verdict line (data/format.py
    # VERDICT_MARKER), which the planner splits off and judges. False where the key is missing: an adapter
    # trained before it never writes the line, and its replies are read as they are.
    verdicts: bool = False
    # Simulator: every reply opens with its outcome line (data/format.py OUTCOME_MARKER: error, no change,
    # progress, won, lost), which the planner scores per class instead of generating text. Replaces verdicts.
    outcomes: bool = False
    # Decider: each user turn shows the notes of its turn (Turn.notes: the pivot notes the planner writes and
    # collection records, data/format.py pivot_note). False where the key is missing: an adapter trained before it
    # never saw them, and the planner's notes stay in its traces only.
    notes: bool = False
    # Decider and simulator: a window's system message shows what the steps before it told as belief-state facts
    # (Turn.facts, by the env's `facts` extractor: TWX's room, exits and inventory). False where the key is
    # missing: an adapter trained before it never saw the snapshot.
    snapshot: bool = False

    def __post_init__(self) -> None:
        if self.format not in FORMATS:
            raise ValueError(f"format: {self.format!r} is not one of {', '.join(FORMATS)}")
        for name, low in (("budget", 1), ("reserve", 0), ("overlap", 0), ("max_failures", 0), ("max_history", 0)):
            if getattr(self, name) is not None and getattr(self, name) < low:
                raise ValueError(f"{name}: must be >= {low}, got {getattr(self, name)!r}")
        for name in ("verdicts", "outcomes", "notes", "snapshot"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name}: must be true or false, got {getattr(self, name)!r}")
        if self.verdicts and self.outcomes:
            raise ValueError("verdicts and outcomes: choose one; an outcome line says won or lost already")
        if self.notes and self.format != "conversation":
            raise ValueError("notes: needs format conversation (a step prompt has no per-turn notes)")
        if self.snapshot and self.format != "conversation":
            raise ValueError("snapshot: needs format conversation (a step prompt has no windows)")
        if self.format == "conversation" and self.reserve >= self.budget:
            raise ValueError(f"reserve: {self.reserve} leaves nothing of the budget {self.budget}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_dict(d: dict[str, Any], where: str = "prompt settings") -> PromptSettings:
        known = {f.name for f in fields(PromptSettings)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"{where}: unknown keys {unknown}; known: {sorted(known)}")
        return PromptSettings(**d)


def write_settings(folder: str | Path, settings: PromptSettings) -> Path:
    from simplan.core.io import write_json

    path = Path(folder) / SETTINGS_FILE
    write_json(path, settings.to_dict())
    return path


def read_settings(folder: str | Path) -> PromptSettings | None:
    """The settings saved in a dataset or adapter folder, None when it has none (made before they travelled)."""
    path = Path(folder) / SETTINGS_FILE
    if not path.exists():
        return None
    return PromptSettings.from_dict(json.loads(path.read_text()), where=str(path))


def merge_settings(saved: PromptSettings | None, explicit: dict[str, Any], where: str) -> PromptSettings:
    """The saved settings with the run's explicit ones; a contradiction is an error naming both values."""
    if saved is None:
        return PromptSettings(**explicit)
    clashes = {k: v for k, v in explicit.items() if getattr(saved, k) != v}
    if clashes:
        shown = ", ".join(f"{k}: {getattr(saved, k)!r} in {where}, {v!r} given" for k, v in sorted(clashes.items()))
        raise ValueError(
            f"prompt settings contradict the adapter's ({shown}); the adapter was trained on its settings, so "
            "drop these flags (they are read from the adapter), or train an adapter with the new settings"
        )
    return saved


# ---------------------------------------------------------------------------------------------
# The episode state
# ---------------------------------------------------------------------------------------------
@dataclass
class Turn:
    """One step of an episode: what the actor saw, then (once closed) what it did and what followed."""

    observation: str
    goal: str
    tools: list[dict[str, Any]] | None = None
    valid_actions: list[str] | None = None
    notes: list[str] = field(default_factory=list)  # shown with the observation (pivot reasons, ...)
    action: str | None = None  # rendered action; None while the turn is open
    next_observation: str | None = None
    error: bool = False
    # The failure's class (envs/base.py FAILURE_CLASSES) where known. A transient one (a 503 retried as it
    # is) is not a mistake to avoid, so the failure memory leaves it out.
    failure: str | None = None
    learn: bool = True  # a training target of the role the state was built for
    imagined: bool = False
    verdict: str | None = None  # "won" / "lost": this step ended the episode (data/format.py episode_verdict)
    outcome: str | None = None  # what the step led to (data/outcomes.py OUTCOMES), where known
    facts: list[Fact] = field(default_factory=list)  # what `observation` told (the env's `facts`; Step.facts)


@dataclass
class EpisodeState:
    """The turns of one episode; the last one is open (observed, not yet acted on) while acting."""

    turns: list[Turn]

    @staticmethod
    def start(
        goal: str,
        observation: str,
        tools: list[dict[str, Any]] | None = None,
        valid_actions: list[str] | None = None,
        facts: Sequence[Fact] = (),
    ) -> EpisodeState:
        return EpisodeState(
            [Turn(observation=observation, goal=goal, tools=tools, valid_actions=valid_actions, facts=list(facts))]
        )

    @property
    def current(self) -> Turn:
        return self.turns[-1]

    def belief(self, upto: int | None = None) -> Belief:
        """What the facts of the observations before turn `upto` (all of them: None) tell, the later over the
        earlier (envs/subgoals.py Belief)."""
        belief = Belief()
        for turn in self.turns[:upto]:
            belief.add(turn.facts)
        return belief

    def step(
        self,
        action: str,
        observation: str,
        error: bool = False,
        valid_actions: list[str] | None = None,
        goal: str | None = None,
        tools: list[dict[str, Any]] | None = None,
        notes: Sequence[str] = (),
        learn: bool = True,
        imagined: bool = False,
        failure: str | None = None,
        outcome: str | None = None,
        facts: Sequence[Fact] = (),
    ) -> EpisodeState:
        """Close the open turn with `action` and open the next one at `observation`; returns self. `failure`:
        the class of a failed step (the planner's judge decides it), None when unknown; `outcome`: what the step
        led to (data/outcomes.py), None when unknown; `facts`: what `observation` told (the env's `facts`)."""
        turn = self.current
        if turn.action is not None:
            raise ValueError("EpisodeState.step: the last turn is closed already (the episode ended)")
        turn.action, turn.next_observation, turn.error, turn.learn = action, observation, error, learn
        turn.failure = failure if error else None
        turn.outcome = outcome
        turn.imagined = turn.imagined or imagined
        self.turns.append(
            Turn(
                observation=observation,
                goal=goal or turn.goal,
                tools=tools if tools is not None else turn.tools,
                valid_actions=valid_actions,
                notes=list(notes),
                imagined=imagined,
                facts=list(facts),
            )
        )
        return self

    def note(self, text: str) -> None:
        """Add a note to the open turn (the planner's pivot reasons); recorded in the step's `notes`."""
        self.current.notes.append(text)

    def branch(self) -> EpisodeState:
        """A copy to imagine from: closed turns are shared, the open one is copied."""
        return EpisodeState(self.turns[:-1] + [replace(self.current, notes=list(self.current.notes))])

    @staticmethod
    def from_trajectory(
        traj: Trajectory,
        learn: Callable[[Any], bool] = lambda step: True,
        failures: FailureRules | None = None,
    ) -> EpisodeState:
        """Replay a recorded trajectory; `learn(step)` says which steps are training targets. Goal and tools
        change where a step's `info` says so (collection records a BFCL user turn or what a TWX agent read
        there), from the next step on. A failed step is transient as `failures` (default: the env's rules,
        envs/failures.py, as the planner reads them) says."""
        goal, tools = traj.goal, traj.tools
        failures = rules_of_env(traj.env) if failures is None else failures
        turns = []
        for i, s in enumerate(traj.steps):
            if i > 0:
                goal = traj.steps[i - 1].info.get("goal") or goal
                tools = traj.steps[i - 1].info.get("tools") or tools
            turns.append(
                Turn(
                    observation=s.observation,
                    goal=goal,
                    tools=tools,
                    valid_actions=s.valid_actions,
                    notes=list(s.notes),
                    action=render_action(s.action),
                    next_observation=s.next_observation,
                    error=s.error,
                    failure="transient" if s.error and failures.is_transient(s.next_observation, True) else None,
                    learn=learn(s),
                    verdict=episode_verdict(s.done, s.won),
                    outcome=step_outcome(s, traj.steps[i - 1].score if i > 0 else 0.0, failures),
                    facts=[Fact.from_dict(f) for f in s.facts],
                )
            )
        if traj.steps:
            last = traj.steps[-1]
            turns.append(
                Turn(
                    observation=last.next_observation,
                    goal=last.info.get("goal") or goal,
                    tools=last.info.get("tools") or tools,
                )
            )
        else:
            turns.append(Turn(observation=traj.initial_observation, goal=goal, tools=tools))
        return EpisodeState(turns)


def step_outcome(step: Step, score_before: float, failures: FailureRules) -> str:
    """What a recorded step led to (data/outcomes.py), from its own fields and the score before it."""
    return classify_outcome(step.error, step.next_observation, score_before, step.score, step.done, step.won, failures)


# ---------------------------------------------------------------------------------------------
# Rendering
# ---------------------------------------------------------------------------------------------
@dataclass
class Example:
    """One training sequence: messages, a weight per message (1: an assistant turn that carries loss)
    and, per message, the step it belongs to (-1 for the system message)."""

    messages: Messages
    weights: list[int]
    steps: list[int]
    window: tuple[int, int]  # first step shown, last step shown


def approx_count_texts(texts: list[str]) -> list[int]:
    """~4 characters per token: used when no tokenizer is at hand (the planner on an OpenAI server)."""
    return [len(t) // 4 + 1 for t in texts]


class ConversationRenderer:
    """Renders an EpisodeState as the decider's or the simulator's conversation, window by window.

    `count_texts` counts tokens of plain strings (data/format.text_token_counter(tokenizer)); window
    boundaries use these counts plus a fixed per-message overhead measured on the chat template,
    so they are the same wherever the same tokenizer renders the same steps.
    """

    def __init__(
        self,
        settings: PromptSettings,
        count_texts: Callable[[list[str]], list[int]] = approx_count_texts,
        message_overhead: int = 4,
    ) -> None:
        self.settings = settings
        self.count_texts = count_texts
        self.overhead = message_overhead
        self._counts: dict[str, int] = {}

    # -- text of each message ------------------------------------------------------------------
    def system(self, state: EpisodeState, start: int, role: str) -> str:
        turn = state.turns[start]
        parts = [
            self._system_text(role),
            SECTION_GOAL.format(goal=turn.goal.strip()),
        ]
        if turn.tools:
            parts.append(SECTION_TOOLS.format(tools=render_tools(turn.tools)))
            if role == "decider":
                parts.append(TOOL_ACTION_HINT)
        failures = self.failures_before(state, start)
        if failures:
            parts.append(SECTION_FAILURES.format(items="\n".join(f"- {f}" for f in failures)))
        known = self.known_before(state, start) if self.settings.snapshot else []
        if known:
            parts.append(SECTION_KNOWN.format(items="\n".join(f"- {k}" for k in known)))
        if role == "simulator":
            parts.append(SECTION_START.format(observation=turn.observation.strip()))
        return "\n\n".join(parts)

    def _system_text(self, role: str) -> str:
        if role == "decider":
            return CONVERSATION_DECIDER_SYSTEM
        return CONVERSATION_OUTCOME_SIMULATOR_SYSTEM if self.settings.outcomes else CONVERSATION_SIMULATOR_SYSTEM

    def failures_before(self, state: EpisodeState, start: int) -> list[str]:
        """Failure notes of the failed steps before `start`: distinct, newest last, the newest `max_failures`.
        A transient failure is left out: the call was retried as it was, it is no mistake to avoid."""
        keep = self.settings.max_failures
        if not keep:
            return []
        notes: dict[str, None] = {}
        for turn in state.turns[:start]:
            if turn.error and turn.action is not None and turn.failure != "transient":
                note = failure_note(turn.action, turn.next_observation or "")
                notes.pop(note, None)
                notes[note] = None
        return list(notes)[-keep:]

    def known_before(self, state: EpisodeState, start: int) -> list[str]:
        """The snapshot of a window opened at `start`: the belief-state facts the observations before it told
        (envs/subgoals.py describe_belief), as they stand after the last of them."""
        return describe_belief(state.belief(start))

    def user(self, state: EpisodeState, t: int, start: int) -> str:
        """The decider's user turn of step t in a window opened at `start`."""
        turn = state.turns[t]
        parts = [turn.observation.strip()]
        if t > start and turn.tools and turn.tools != state.turns[t - 1].tools:
            parts.append(SECTION_NEW_TOOLS.format(tools=render_tools(turn.tools)))
        if self.settings.show_valid and turn.valid_actions:
            parts.append(SECTION_VALID.format(actions=" | ".join(turn.valid_actions)))
        if self.settings.notes:
            parts += [SECTION_NOTE.format(note=n) for n in turn.notes]
        return "\n\n".join(parts)

    def simulator_reply(self, turn: Turn) -> str:
        """The simulator's assistant turn of a closed step: the observation, with the verdict line when the step
        ended the episode and the settings ask for verdicts, or after its outcome line when they ask for those."""
        verdict = turn.verdict if self.settings.verdicts else None
        return observation_completion(turn.next_observation or "", verdict, self._outcome(turn))

    def _outcome(self, turn: Turn) -> str | None:
        if not self.settings.outcomes:
            return None
        if turn.outcome is None:
            raise ValueError(f"step {turn.action!r}: the simulator's settings ask for outcomes and it has none")
        return turn.outcome

    def _reply_counted(self, turn: Turn) -> str:
        """The part of a simulator reply window boundaries count: the outcome line (when the settings ask for one
        and the step has it) and the observation."""
        head = outcome_line(turn.outcome) if self.settings.outcomes and turn.outcome else ""
        return head + (turn.next_observation or "")

    # -- windows ---------------------------------------------------------------------------------
    def _count(self, texts: list[str]) -> list[int]:
        new = [t for t in dict.fromkeys(texts) if t not in self._counts]
        if new:
            if len(self._counts) > 200_000:
                self._counts.clear()
            self._counts.update(zip(new, self.count_texts(new)))
        return [self._counts[t] for t in texts]

    def window_starts(self, state: EpisodeState, role: str, upto: int | None = None) -> list[int]:
        """The window start of every step 0..upto (default: every turn): greedy, a step that would not fit
        opens a new window `overlap` steps back (fewer if those do not fit either)."""
        n = len(state.turns) if upto is None else upto + 1
        if role == "decider":
            # start=0: counts the "tools now" note wherever tools change; a window opened there omits it,
            # so the estimate errs on the long side, the same way wherever the same steps are rendered.
            prompts = [self.user(state, t, 0) for t in range(n)]
            replies = [state.turns[t].action or "" for t in range(n)]
        else:
            prompts = [state.turns[t].action or "" for t in range(n)]
            # Without the verdict line: it closes the episode's last step, which no later step's window counts.
            replies = [self._reply_counted(state.turns[t]) for t in range(n)]
        p_tok = self._count(prompts)
        r_tok = self._count(replies)
        budget = self.settings.budget - self.settings.reserve
        headers: dict[int, int] = {}

        def header(s: int) -> int:
            if s not in headers:
                headers[s] = self._count([self.system(state, s, role)])[0] + self.overhead
            return headers[s]

        def cost(s: int, t: int) -> int:
            turns = sum(p_tok[i] + r_tok[i] + 2 * self.overhead for i in range(s, t))
            return header(s) + turns + p_tok[t] + 2 * self.overhead  # the open turn and the generation prompt

        starts, s = [], 0
        for t in range(n):
            if t > s and cost(s, t) > budget:
                s = next((c for c in range(max(s, t - self.settings.overlap), t) if cost(c, t) <= budget), t)
            starts.append(s)
        return starts

    def window_start(self, state: EpisodeState, role: str, t: int | None = None) -> int:
        t = len(state.turns) - 1 if t is None else t
        return self.window_starts(state, role, upto=t)[t]

    # -- messages --------------------------------------------------------------------------------
    def decider_messages(self, state: EpisodeState, t: int | None = None) -> Messages:
        """The decider's prompt for the action of step t (default: the open turn)."""
        t = len(state.turns) - 1 if t is None else t
        start = self.window_start(state, "decider", t)
        return self._decider_window(state, start, t, close_last=False)[0]

    def simulator_messages(self, state: EpisodeState, action: str, t: int | None = None) -> Messages:
        """The simulator's prompt for the observation after `action` taken at step t (default: the open turn)."""
        t = len(state.turns) - 1 if t is None else t
        if state.turns[t].action not in (None, action):
            raise ValueError(f"simulator_messages: step {t} took {state.turns[t].action!r}, not {action!r}")
        probe = state if state.turns[t].action is not None else _with_action(state, t, action)
        start = self.window_start(probe, "simulator", t)
        return self._simulator_window(probe, start, t, close_last=False)[0]

    def _decider_window(
        self, state: EpisodeState, start: int, end: int, close_last: bool
    ) -> tuple[Messages, list[int], list[int]]:
        messages = [{"role": "system", "content": self.system(state, start, "decider")}]
        weights, steps = [0], [-1]
        for t in range(start, end + 1):
            messages.append({"role": "user", "content": self.user(state, t, start)})
            weights.append(0)
            steps.append(t)
            if t < end or close_last:
                turn = state.turns[t]
                messages.append({"role": "assistant", "content": turn.action or ""})
                weights.append(1 if turn.learn and not turn.imagined else 0)
                steps.append(t)
        return messages, weights, steps

    def _simulator_window(
        self, state: EpisodeState, start: int, end: int, close_last: bool
    ) -> tuple[Messages, list[int], list[int]]:
        messages = [{"role": "system", "content": self.system(state, start, "simulator")}]
        weights, steps = [0], [-1]
        for t in range(start, end + 1):
            turn = state.turns[t]
            messages.append({"role": "user", "content": turn.action or ""})
            weights.append(0)
            steps.append(t)
            if t < end or close_last:
                messages.append({"role": "assistant", "content": self.simulator_reply(turn)})
                weights.append(1 if turn.learn and not turn.imagined else 0)
                steps.append(t)
        return messages, weights, steps

    def examples(self, state: EpisodeState, role: str) -> list[Example]:
        """Training sequences of a whole recorded episode: one per window, loss on the window's own steps.

        A step's assistant turn carries weight 1 in the window that trains it when the step is a `learn`
        step; mistakes stay as context (weight 0), and so do the overlap steps a window repeats."""
        if role not in ROLES:
            raise ValueError(f"role: {role!r} is not one of {ROLES}")
        closed = [t for t, turn in enumerate(state.turns) if turn.action is not None]
        if not closed:
            return []
        starts = self.window_starts(state, role, upto=closed[-1])
        out = []
        first = 0
        for t in closed:
            is_last = t == closed[-1] or starts[t + 1] != starts[t]
            if not is_last:
                continue
            start = starts[t]
            render = self._decider_window if role == "decider" else self._simulator_window
            messages, weights, steps = render(state, start, t, close_last=True)
            weights = [w if s >= first else 0 for w, s in zip(weights, steps)]  # overlap steps: context only
            if any(weights):
                out.append(Example(messages, weights, steps, (start, t)))
            first = t + 1
        return out


def _with_action(state: EpisodeState, t: int, action: str) -> EpisodeState:
    """`state` with step t's action set (to render the simulator's prompt for a proposed action)."""
    turns = list(state.turns)
    turns[t] = replace(turns[t], action=action)
    return EpisodeState(turns)


def message_overhead(tokenizer: Any) -> int:
    """Tokens a chat template adds around one more message's content (role markers, separators).

    Measured as a difference after a system message, since some templates (SmolLM2's, Qwen's) add a
    default system prompt to a conversation that has none."""

    def tokens(messages: Messages) -> int:
        text = tokenizer.apply_chat_template(messages, tokenize=False)
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    system = [{"role": "system", "content": "x"}]
    content = len(tokenizer("x", add_special_tokens=False)["input_ids"])
    return max(1, tokens(system + [{"role": "user", "content": "x"}]) - tokens(system) - content)


def renderer_for(settings: PromptSettings, tokenizer: Any = None) -> ConversationRenderer:
    """The renderer with the tokenizer's own counts (approximate counts without one)."""
    if tokenizer is None:
        return ConversationRenderer(settings)
    return ConversationRenderer(settings, text_token_counter(tokenizer), message_overhead(tokenizer))
