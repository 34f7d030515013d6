"""The environment protocol every simplan adapter implements, and the records that cross it.

An adapter is one class that implements `Env` (optional attributes: `EnvDefaults`). Use it by
`--env package.module:Class`, or give it a name with an entry point in the `simplan.envs` group of
its package (envs/registry.py; examples/simplan-shop is a complete plugin package); nothing in
simplan changes. Check any adapter with `simplan envs check NAME`.

Actions are structured: `command` text for text games, `tool_call` (name + arguments) for tool
environments, `finish` to end a turn or an episode (tool envs), `answer` for a free-text answer.
They are parsed strictly from model output by each env's `parse_action` and never executed as code.

Steps run under a wall-clock limit and observations are capped (envs/limits.py; `make_env` applies
both). An adapter whose steps run Python code a thread cannot stop (BFCL's tool backends) takes a
`step_timeout` constructor argument, keeps it as `self.step_timeout` and enforces it itself.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

if TYPE_CHECKING:
    from simplan.envs.subgoals import Fact, SubGoal

ActionKind = Literal["command", "tool_call", "answer", "finish"]
ACTION_KINDS: tuple[str, ...] = ("command", "tool_call", "answer", "finish")
FOLDS: tuple[str, ...] = ("train", "dev", "test")


class ActionParseError(ValueError):
    """Model output that is not a well-formed action for this environment."""


class EnvCrashed(RuntimeError):
    """The environment's backend (e.g. its JVM) died mid-episode; the episode is lost.

    Callers mark the episode errored (never drop it silently) and call `reset` again: adapters restart
    their backend transparently on the next `reset`.
    """


@dataclass(frozen=True)
class Action:
    """One structured action. `text` carries a command or an answer; tool calls use name + arguments."""

    kind: ActionKind = "command"
    text: str = ""
    name: str = ""
    arguments: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in ACTION_KINDS:
            raise ValueError(f"Action.kind: {self.kind!r} is not one of {ACTION_KINDS}")
        if self.kind == "tool_call" and not self.name:
            raise ValueError("Action.name: a tool_call needs the tool's name")

    @staticmethod
    def command(text: str) -> Action:
        return Action(kind="command", text=text)

    @staticmethod
    def tool_call(name: str, arguments: dict[str, Any] | None = None) -> Action:
        return Action(kind="tool_call", name=name, arguments=dict(arguments or {}))

    def key(self) -> str:
        """A canonical string that identifies the action (for caches, repeats and bans)."""
        if self.kind == "tool_call":
            return f"{self.name}({_canonical_json(self.arguments)})"
        if self.kind == "finish":
            return "finish"
        return self.text.strip().lower() if self.kind == "command" else f"answer:{self.text.strip()}"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_dict(d: dict[str, Any]) -> Action:
        return Action(
            kind=d.get("kind", "command"),
            text=d.get("text", ""),
            name=d.get("name", ""),
            arguments=dict(d.get("arguments") or {}),
        )

    def __hash__(self) -> int:  # dict field: hash the canonical key instead
        return hash(self.key())


def _canonical_json(arguments: dict[str, Any]) -> str:
    """Sorted-key JSON of tool-call arguments (the same text as plain `json.dumps` for JSON values).

    Arguments JSON cannot hold (a set, bytes, mixed key types: never from `parse_tool_call`, maybe
    from code that builds Actions) still get a key, so `key()` never raises where it is used
    (caches, bans, traces)."""
    try:
        return json.dumps(arguments, sort_keys=True, ensure_ascii=False, default=repr)
    except (TypeError, ValueError):  # keys sort_keys cannot order (1 and "a"), an int too long for str()
        pass
    try:
        return json.dumps(repr(arguments), ensure_ascii=False)
    except ValueError:
        return '"<arguments too large to print>"'


@dataclass(frozen=True)
class Task:
    """One episode's identity: which env, which fold, which game/task type, which seed/variation."""

    env: str
    task_id: str
    fold: str
    family: str = ""  # game (TWX), task type (ScienceWorld), category (BFCL)
    params: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_dict(d: dict[str, Any]) -> Task:
        return Task(
            env=d["env"],
            task_id=d["task_id"],
            fold=d["fold"],
            family=d.get("family", ""),
            params=dict(d.get("params") or {}),
        )

    def __hash__(self) -> int:
        return hash((self.env, self.task_id))


@dataclass
class Observation:
    """What the agent sees: the text, the goal, and what it may do now where the env knows it."""

    text: str
    goal: str = ""
    valid_actions: list[str] | None = None
    # True: valid_actions is every action the env accepts now; False: a hint (a filtered or capped
    # list, e.g. ScienceWorld's), so an action missing from it may still work.
    valid_actions_complete: bool = True
    tools: list[dict[str, Any]] | None = None  # JSON-schema tool descriptions (tool envs)
    error: bool = False  # the last action failed or was invalid


@dataclass
class StepResult:
    observation: Observation
    reward: float = 0.0
    score: float = 0.0
    done: bool = False
    won: bool = False
    info: dict[str, Any] = field(default_factory=dict)


class EnvDefaults:
    """The optional attributes of an adapter, with the defaults used when it does not set them.

    Subclass it (`class MyEnv(EnvDefaults)`) to inherit the defaults and override what applies, or set
    the attributes on your own class; read them with `env_extra(env, NAME)`, which applies the defaults
    to an adapter that has none. `Env` lists only what every adapter must have, so a plain class with the
    six required members is still an `Env`.
    """

    #: One line shown by `simplan envs list` (default: the first line of the class or module docstring).
    description: str = ""
    #: The task families (games, task types, categories) `tasks(fold, families=...)` accepts; suites use all
    #: of them when an entry names none.
    families: tuple[str, ...] = ()
    #: Regexes of observations that mean an action failed (the judge and the error pivot); none: the
    #: defaults (envs/failures.py DEFAULT_ERROR_PATTERNS; the one failure rule lives there).
    error_patterns: tuple[str, ...] = ()
    #: Regexes of observations that mean progress (the judge); none: DEFAULT_PROGRESS_PATTERNS.
    progress_patterns: tuple[str, ...] = ()
    #: Seconds a step may take, for an adapter that stops its own steps: one that takes a `step_timeout`
    #: constructor argument (BFCL) keeps it here and `make_env` adds no thread watchdog (envs/limits.py).
    #: None: the adapter has no limit of its own and `make_env` runs its steps under a watchdog.
    step_timeout: float | None = None
    #: Failure classes (`failure_class`). Regexes of failed observations that mean "the same call may work
    #: if tried again" (a 503, a timeout): the planner repeats the call without a model call, a note or a ban,
    #: up to PlannerConfig.max_transient_retries times, then treats the failure as permanent.
    transient_patterns: tuple[str, ...] = ()
    #: Regexes of failed observations that mean the world changed under the plan (an item sold out): the
    #: planner notes the failure and replans, without banning the action. Any other failure is permanent for
    #: that action (noted, down-weighted, banned in that state).
    replan_patterns: tuple[str, ...] = ()
    #: Regexes of the observation after `finish` that mean the goal is met (e.g. r'"shipped": true'); the judge
    #: penalises an imagined finish whose predicted outcome matches none (a premature finish). None set: a
    #: finish is judged like any other action.
    accept_patterns: tuple[str, ...] = ()
    #: `accepts() -> bool`: whether the episode's goal is met in the current state (checkable acceptance
    #: conditions), without changing the state. The planner asks it for a finish from the real state; it is
    #: never the episode's success, which is always the env's `won`. None: not provided.
    accepts: Callable[[], bool] | None = None
    #: `expert_action(observation) -> Action | None`: an expert that reacts to what it sees (retries after a
    #: 503, picks another item after "sold out"), called with the observation of `reset` and of each step;
    #: None when it has nothing more to do. It must not change the env and may be called more than once in a
    #: state. Collection and `envs check` use it instead of `expert_plan` when it is set (data/policies.py).
    expert_action: Callable[[Observation], Action | None] | None = None
    #: `subgoals(goal) -> list[SubGoal]` (envs/subgoals.py): the goal's steps in the order they are met, each the
    #: conditions one record of the belief state must satisfy (the shop: an order of the product in the asked
    #: quantity, then that order shipped). The planner checks every action against the first unmet one before
    #: it runs (PlannerConfig.subgoals). None: not provided.
    subgoals: Callable[[str], list[SubGoal]] | None = None
    #: `facts(action, observation, error) -> list[Fact]` (envs/subgoals.py): what a step told about the world, as
    #: records keyed by an id (the shop: an order's item, qty and shipped; TWX: location, exits, inventory); with
    #: `observation=None`, the record the call would write (its arguments), so that a call is checked before it
    #: runs; with `action=None`, what the reset observation told. Recorded with each step (Step.facts) and shown
    #: as a window's snapshot of the steps before it (PromptSettings.snapshot). None: not provided.
    facts: Callable[[Action | None, str | None, bool], list[Fact]] | None = None
    #: `inverse(action) -> Action | None`: the action that undoes `action` from the state it led to, where one is
    #: known (TWX: the move back, closing what was opened, taking back what was put), else None. The planner
    #: backtracks with it after the pivots `pivot_rules.backtrack` names. None: not provided.
    inverse: Callable[[Action], Action | None] | None = None
    #: The name of the tool that asks the user what the request left out (a quantity, a choice), answered by the
    #: env from the task's hidden intent. The agent calls it like any tool (a decider learns when from experts
    #: that ask); each call is a cost the trace counts (the end event's `asks`) and the report shows. None: the
    #: env has no one to ask.
    ask_tool: str | None = None
    #: `grade_request(goal, observation) -> str | None`: the env's own grade of a request from its goal and first
    #: observation, one of data/grades.py's GRADES (trivial, single-step, multi-step, ambiguous), or None to leave
    #: it to the fitted grader. Read with PlannerConfig `grading.mode: env` (inference/planning/grading.py), whose
    #: routes give each grade its budgets and say whether it may ask. None: not provided.
    grade_request: Callable[[str, str], str | None] | None = None


# How much a request asks of the agent (data/grades.py): what its expert's path needed, first match wins.
GRADES: tuple[str, ...] = ("trivial", "single-step", "multi-step", "ambiguous")
WORK_KINDS: tuple[str, ...] = ("command", "tool_call")  # actions that do something in the world; answer, finish do not


def path_grade(actions: Iterable[Action], ask_tool: str | None) -> str:
    """The grade (GRADES) of a request whose expert took `actions`: ambiguous when it called the env's `ask_tool`
    (None: the env has none), else trivial (only an answer or finish), single-step (one command or tool call) or
    multi-step."""
    work = 0
    for a in actions:
        if ask_tool and a.kind == "tool_call" and a.name == ask_tool:
            return "ambiguous"
        work += a.kind in WORK_KINDS
    return "trivial" if work == 0 else "single-step" if work == 1 else "multi-step"


EXTRAS: tuple[str, ...] = (
    "description",
    "families",
    "error_patterns",
    "progress_patterns",
    "step_timeout",
    "transient_patterns",
    "replan_patterns",
    "accept_patterns",
    "accepts",
    "expert_action",
    "subgoals",
    "facts",
    "inverse",
    "ask_tool",
    "grade_request",
)
PATTERN_EXTRAS: tuple[str, ...] = (
    "error_patterns",
    "progress_patterns",
    "transient_patterns",
    "replan_patterns",
    "accept_patterns",
)
FAILURE_CLASSES: tuple[str, ...] = ("transient", "replan", "permanent")


def env_extra(env: object, name: str) -> Any:
    """The optional attribute `name` of `env` (see `EnvDefaults`), or its default when the adapter has none."""
    if name not in EXTRAS:
        raise AttributeError(f"{name!r} is not an optional env attribute; those are {', '.join(EXTRAS)}")
    try:
        return getattr(env, name)  # wrappers (LimitedEnv, FaultyEnv) forward unknown attributes to the adapter
    except AttributeError:
        return getattr(EnvDefaults, name)


def expert_policy(env: object) -> Callable[[Observation], Action | None] | None:
    """The env's reacting expert (`EnvDefaults.expert_action`), or None when it offers only `expert_plan`."""
    policy = env_extra(env, "expert_action")
    return policy if callable(policy) else None


@runtime_checkable
class Env(Protocol):
    """A small, gymnasium-like protocol. One instance runs one episode at a time and is reused.

    Optional attributes (description, families, the pattern lists, step_timeout, and the optional hooks
    `accepts` and `expert_action`) are declared with their defaults in `EnvDefaults`.
    """

    name: str

    def tasks(self, fold: str, families: list[str] | None = None, limit: int | None = None) -> list[Task]:
        """Tasks of a fold (train/dev/test), optionally only some families, in a stable order."""
        ...

    def reset(self, task: Task) -> Observation: ...

    def step(self, action: Action) -> StepResult: ...

    def expert_plan(self) -> list[Action]:
        """The expert's actions from the state right after `reset` (a gold path or ground truth)."""
        ...

    def parse_action(self, text: str) -> Action:
        """Strictly parse model output into an Action; raise ActionParseError with the reason."""
        ...

    def close(self) -> None: ...


def action_key_of_text(env: Env, text: str) -> str:
    """The `Action.key()` of a listed action text as `env` parses it (its normalised text if it does not parse):
    how a valid-action list is compared with a structured action."""
    try:
        return env.parse_action(text).key()
    except ActionParseError:
        return text.strip().lower()


def missing_from_complete_list(env: Env, obs: Observation, action: Action) -> bool:
    """True when `obs` lists every valid action (`valid_actions_complete`) and `action` is not among them:
    the rule of the planner's `not_valid_now` pivot and of the expert check in `simplan envs check`."""
    if not obs.valid_actions or not obs.valid_actions_complete:
        return False  # no list, or only a hint (ScienceWorld): a missing action may still work
    return action.key() not in {action_key_of_text(env, a) for a in obs.valid_actions}


def inverse_restores(before: Observation, score_before: float, after: StepResult) -> bool:
    """Whether a step undone by its inverse (`EnvDefaults.inverse`) is back where it was: the valid actions of the
    state before the step (as a set; none listed counts as the same) and its score. What the planner's backtracking
    and `simplan envs check` ask of an inverse."""
    same_actions = sorted(before.valid_actions or []) == sorted(after.observation.valid_actions or [])
    return same_actions and math.isclose(score_before, float(after.score), abs_tol=1e-9)


def parse_command(text: str, max_chars: int = 200) -> Action:
    """Strictly parse a text-game command: one non-empty line, whitespace collapsed, case kept."""
    stripped = text.strip()
    if not stripped:
        raise ActionParseError("empty action: reply with one command, e.g. 'look around'")
    if "\n" in stripped or "\r" in stripped:
        raise ActionParseError(f"an action is a single line, got {len(stripped.splitlines())} lines: {text!r}")
    if len(stripped) > max_chars:
        raise ActionParseError(f"action longer than {max_chars} characters: {stripped[:60]!r}...")
    return Action.command(" ".join(stripped.split()))
