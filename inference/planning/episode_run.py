"""The planner's record of one episode being run: what happened for real, what was learned, what was spent.

    run = EpisodeRun(task, budgets, trace, meter, obs, goal)    # the planner makes one per episode
    run.past, run.records, run.bans, run.memory, run.state       # real steps, as pivots, judge and prompts see them

`state` is the conversation so far (data/episode.py EpisodeState), the same state training prompts are built
from; `subgoals` the env's sub-goals with the belief state they are checked on (subgoals.py); the other fields
are the loop's own bookkeeping: bans per real state, the failure memory, replans and
pivots, token and time meters. `Queued` is one planned action with its expectation; `EpisodeResult` what
`Planner.run` returns.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from simplan.core.text import normalize
from simplan.data.episode import EpisodeState
from simplan.envs.base import Action, Observation, Task
from simplan.envs.subgoals import describe_belief
from simplan.inference.engines.base import GenerationRequest, MeteredEngine
from simplan.inference.planning.judge import JudgeMemory
from simplan.inference.planning.pivots import StepRecord
from simplan.inference.planning.router import Budgets
from simplan.inference.planning.trace import EpisodeSummary, EpisodeTrace

if TYPE_CHECKING:
    from simplan.inference.planning.subgoals import SubgoalTracker


def digest_key(*parts: Any) -> str:
    # surrogatepass: a lone surrogate in any text (the engine boundary removes them from model text)
    # still hashes; every other text hashes to the same key as with a plain encode().
    text = json.dumps(parts, ensure_ascii=False, sort_keys=True, default=repr)
    return hashlib.sha1(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]


@dataclass
class PendingExpectation:
    """A committed action's prediction left for after its real step (imagination.draft_expectations): the simulator
    request, made from the state the action was decided in, and its key in the prediction cache."""

    request: GenerationRequest
    key: tuple[str, str]


@dataclass
class Queued:
    action: Action
    expectation: str | None
    source: str  # plan | reactive | fallback | backtrack
    verdict: str | None = None  # the ending predicted for this step (won | lost), traced on its act event
    expectation_cut: bool = False  # the simulator's token limit cut the expectation (pivots compare its start)
    pending: PendingExpectation | None = None  # the expectation, generated when the real observation is known
    # The simulator's per-token probability of the real observation (pivot_rules.similarity `likelihood`)
    likelihood: float | None = None


@dataclass
class Backtrack:
    """A step being undone (pivot_rules.backtrack): the step, the pivots that called for it, and the real state and
    score before it, which its inverse should restore."""

    undone: Action
    rules: list[str]
    before: Observation
    score_before: float


@dataclass
class EpisodeResult:
    trace: EpisodeTrace
    summary: EpisodeSummary


@dataclass
class Progress:
    """Which real steps make progress (budgets.stall_steps ends an episode after that many in a row without):
    a score above the best so far, an observation not seen before in the episode, or a sub-goal met. One
    definition for the planner and for bench/stall_replay.py, which replays recorded traces through it.

        progress = Progress.start(first_observation)
        progress.step(1, score, observation)      # note real step 1
        progress.stalled(steps)                   # real steps since the last one that made progress
    """

    best_score: float = 0.0  # the highest score a step reached, and the first step that reached it
    best_step: int = 0
    last_step: int = 0  # the last step that made progress (0: none yet)
    seen: set[str] = field(default_factory=set)  # normalised observations, the first one included

    @classmethod
    def start(cls, observation: str) -> Progress:
        return cls(seen={normalize(observation)})

    def step(self, step: int, score: float, observation: str, met_subgoal: bool = False) -> None:
        text = normalize(observation)
        gained = score > self.best_score
        if gained:
            self.best_score, self.best_step = float(score), step
        if gained or text not in self.seen or met_subgoal:
            self.last_step = step
        self.seen.add(text)

    def stalled(self, steps: int) -> int:
        return steps - self.last_step


@dataclass
class EpisodeRun:
    task: Task
    budgets: Budgets
    trace: EpisodeTrace
    meter: MeteredEngine
    obs: Observation
    goal: str
    past: list[tuple[Action, str, bool]] = field(default_factory=list)  # real (action, observation, error)
    records: list[StepRecord] = field(default_factory=list)
    embeddings: dict[str, list[float]] = field(default_factory=dict)  # text -> vector (mismatch by `embedding`)
    failures: list[str] = field(default_factory=list)
    bans: dict[str, set[str]] = field(default_factory=dict)  # real state key (`place`) -> banned action keys
    ban_where: str = "observation"  # what a ban's state key reads (PivotConfig.ban_where)
    seen_valid: list[str] = field(default_factory=list)  # valid actions seen so far, first-seen order
    state: EpisodeState | None = None  # the conversation so far (conversation format; data/episode.py)
    memory: JudgeMemory = field(default_factory=JudgeMemory)
    subgoals: SubgoalTracker | None = None  # the env's sub-goals and the belief (PlannerConfig.subgoals)
    withheld: frozenset[str] = frozenset()  # tools the request's grade does not let the episode use (grading.py)
    score: float = 0.0
    progress: Progress = field(default_factory=Progress)  # the steps' progress (budgets.stall_steps)
    replans: int = 0
    pivots: int = 0
    parse_failures: int = 0
    since_replan: int = 0
    degraded: str = ""  # why the loop acts without simulation from now on ("" = it does not)
    backtrack: Backtrack | None = None  # the step whose inverse is queued (pivot_rules.backtrack)
    calls_at_last_act: int = 0
    prompt_at_last_act: int = 0
    cached_at_last_act: int = 0
    completion_at_last_act: int = 0
    tokens_at_last_act: int = 0
    planning_seconds: float = 0.0
    env_seconds: float = 0.0
    sample_calls: int = 0

    @property
    def steps(self) -> int:
        return len(self.past)

    @property
    def score_before_last(self) -> float:
        """The score of the real state before the last real step (0.0 before the second step)."""
        return self.records[-2].score if len(self.records) > 1 else 0.0

    def place(self, obs: Observation, upto: int | None = None) -> str:
        """The key bans are kept under for the real state `obs`. By default `state_key`: its text and valid actions
        (the same place under another description gets its own key). With `ban_where` "belief", where the env
        declares facts: what the facts of the turns before `upto` (all: None) tell and the valid actions, so a ban
        holds wherever the agent is back in that place (on TWX after `read map` or `look around` too)."""
        if self.ban_where == "belief" and self.state is not None:
            known = describe_belief(self.state.belief(upto))
            if known:
                return digest_key("belief", known, list(obs.valid_actions or []))
        return state_key(obs)

    def ban(self, action: Action, *places: str) -> None:
        """Ban `action` in each of the real states keyed `places` (`place`)."""
        for key in set(places):
            self.bans.setdefault(key, set()).add(action.key())


def state_key(obs: Observation) -> str:
    """The identity of a real state: its text (normalised) and its valid actions (where bans are kept)."""
    return digest_key(normalize(obs.text), list(obs.valid_actions or []))
