"""The trace record format: one dataclass per event type, the format's version, and `upgrade` of older lines.

A trace is a sequence of events, each a JSON object on its own line, all carrying `type`, `episode_id`,
`run_id` (one per run of the episode), `t` (seconds since the episode started) and `step` (real actions
taken so far).

    type           what it records
    start          header: env, task, arm, resolved config, budgets, goal, first observation
    imagine        the K candidates with their imagined rollouts (actions, predicted observations and the
                   simulator's confidence in each, score parts and total), the engine calls/tokens/seconds
                   it cost, cache hits, the decider's margin and the router's route (simulate / react)
    commit         the plan queue: actions with their expectations (predicted observations)
    act            one real step: action, real observation, expectation and the verdict predicted with it
                   (won / lost, from the env oracle or a simulator trained with verdicts), the notes shown
                   with the observation it was decided from, match score,
                   error flag, reward, score, source (plan / reactive / fallback / backtrack), model calls and tokens
                   spent since the previous act, env seconds
    pivot          rule, severity, evidence, and whether it fired or was only counted (a warning)
    replan         why, how many replans used of the budget, banned actions, the failure note, the inverse
                   queued to backtrack (pivot_rules.backtrack)
    backtrack      a step undone by its inverse: which, after which rules, whether the inverse restored the
                   state before it (its valid actions and score), and the undone step banned there
    parse_failure  unparseable model output: role, raw text, reason, how it was handled
    end            status, the env's success flag, final score, steps, counts, tokens, model calls,
                   wall / planning / env seconds; why a budget ended it and the best score it reached

A line holds the fields of its type's dataclass (`to_dict`); the start event holds the format's `version`
(TRACE_VERSION, whose changelog is below). `upgrade(line)` reads a line of any older version as today's
writer writes it, the one place that knows the format's history, so no reader special-cases an old trace:
inference/planning/trace.py passes every line it reads through it. This module imports only the standard
library and `simplan.core` (PlannerConfig on upgrading an old start event).

    line = upgrade(json.loads(text))        # today's form of a line of any version; TraceVersionError if newer
    event = ActEvent(step=1, action="go east", observation="You are in room 2.")
    text = json.dumps(event.to_dict())
"""

from __future__ import annotations

import dataclasses
import functools
import json
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

from simplan.core.config import flatten, upgrade_keys

# The format's versions, each a change a reader would see (`upgrade` reads every older one as today's):
#   2: act events record expected_verdict
#   3: start events hold the planner config in sections
#   4: act events record the notes (pivot notes, data/format.py pivot_note) shown with their observation
#   5: subgoal events (the env's sub-goals screened a decision or were met by a step); end events record the
#      sub-goals still unmet; commit events say why a plan is the best of bad ones (suboptimal)
#   6: end events say why a budget ended the episode (reason) and the best score it reached (best_score, best_step);
#      the status budget_stall (budgets.stall_steps)
#   7: backtrack events, replan events' `backtrack` (the inverse queued), acts of source "backtrack"
#   8: end events record the belief the real steps' facts built (belief), as a window's snapshot shows it, and
#      the calls to the env's ask tool (asks)
#   9: grade events (the request's grade before the episode and its route, PlannerConfig grading)
#  10: an expectation generated after its real step (imagination.draft_expectations) is on the act event only (the
#      imagine event's committed candidate has no prediction), its prompt tokens in expectation_prompt_tokens
TRACE_VERSION = 10
END_STATUSES = (
    "success",
    "failed",
    "budget_steps",
    "budget_stall",
    "budget_replans",
    "budget_tokens",
    "budget_time",
    "errored",
)
ACT_SOURCES = ("plan", "reactive", "fallback", "backtrack")
SEVERITIES = ("warning", "error")


@dataclass
class TraceEvent:
    """Fields every event line carries. Subclasses set `type`."""

    type: ClassVar[str] = ""
    episode_id: str = ""
    run_id: str = ""  # tells apart two runs of one episode in one file ("": none given; runs cut at each start)
    t: float = 0.0  # seconds since the episode started
    step: int = 0  # real actions taken so far

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.type, **asdict(self)}


@dataclass
class StartEvent(TraceEvent):
    type: ClassVar[str] = "start"
    env: str = ""
    task: dict[str, Any] = field(default_factory=dict)  # Task.to_dict()
    arm: str = ""
    config: dict[str, Any] = field(default_factory=dict)  # resolved PlannerConfig (and anything else)
    budgets: dict[str, Any] = field(default_factory=dict)  # router's per-episode budgets
    goal: str = ""
    observation: str = ""
    version: int = TRACE_VERSION
    # Whether the act events record the verdict predicted with their expectation (`expected_verdict`); where they
    # do not, the summary's verdict counts of real steps are unknown (None), not zero.
    act_verdicts: bool = True


@dataclass
class CandidateRecord:
    """One imagined rollout: its actions, the simulator's predictions and the judge's score."""

    index: int = 0
    actions: list[str] = field(default_factory=list)  # rendered actions, first = the candidate
    predicted: list[str] = field(default_factory=list)  # predicted observation after each action
    logprob: float | None = None  # decider log-likelihood of the first action (when known)
    confidence: list[float | None] = field(default_factory=list)  # simulator's mean token logprob per prediction
    parts: dict[str, float] = field(default_factory=dict)  # weighted score parts
    total: float = 0.0
    chosen: bool = False
    # The verdict per prediction (judge.Outcome.label(), e.g. 'lost score=0 reward=+0'; None where a step had
    # none): the env oracle's, or a simulator's trained with verdicts. None for a simulator without verdicts.
    outcomes: list[str | None] | None = None
    # A simulator trained with outcome lines (inference/planning/outcomes.py): the probability of each outcome
    # class of the first action (error, no_change, progress, won, lost); None for other simulators.
    outcome_probs: dict[str, float] | None = None


@dataclass
class ImagineEvent(TraceEvent):
    type: ClassVar[str] = "imagine"
    candidates: list[CandidateRecord] = field(default_factory=list)
    horizon: int = 0  # depth actually simulated (0 when the router skipped simulation)
    skipped_simulation: bool = False
    reason: str = ""  # why simulation was skipped / how candidates were proposed
    model_calls: int = 0
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0  # of prompt_tokens, those the engine reused instead of prefilling
    # Of prompt_tokens / cached_prompt_tokens, those of the decider calls from the real state (the rest are the
    # rollouts': simulator, and decider inside imagination); None where the trace does not record them.
    decision_prompt_tokens: int | None = None
    decision_cached_prompt_tokens: int | None = None
    # Of prompt_tokens, the scored candidates' (each candidate + EOS, in full; context prefilled = prompt - cached
    # - candidates): all the event's, and the decision's part; None where the trace does not record them.
    candidate_tokens: int | None = None
    decision_candidate_tokens: int | None = None
    completion_tokens: int = 0
    cache_hits: int = 0
    seconds: float = 0.0
    # Who predicted the observations: model (an engine call) or env (inference/planning/oracle.py).
    simulator: str = "model"
    margin: float | None = None  # decider's top-1 minus top-2 probability (None: unknown, e.g. one sample)
    route: str = ""  # router selective: simulate | react ("" where it was not asked: router always, horizon 0)
    route_verb: str = ""  # selective: the verb of the decider's top candidate
    route_accuracy: float | None = None  # selective: the simulator's measured accuracy on that verb


@dataclass
class PlanItem:
    action: str
    expectation: str | None = None


@dataclass
class CommitEvent(TraceEvent):
    type: ClassVar[str] = "commit"
    plan: list[PlanItem] = field(default_factory=list)
    candidate: int = 0
    total: float = 0.0
    # Why the committed plan is the best of bad ones ("" when it is not): every candidate scored below
    # judge.threshold, or every one was over the outcome judge's veto (imagination.py `suboptimal`)
    suboptimal: str = ""


@dataclass
class ActEvent(TraceEvent):
    type: ClassVar[str] = "act"
    action: str = ""  # rendered action
    action_key: str = ""  # Action.key(): canonical identity for repeats
    observation: str = ""
    expectation: str | None = None  # predicted observation, None when nothing was predicted
    # The ending predicted with the expectation: won | lost; None when the prediction said the episode goes on,
    # gave no verdict (a simulator without verdicts) or nothing was predicted (whether the acts record it at all:
    # the start event's act_verdicts).
    expected_verdict: str | None = None
    # similarity of observation and expectation in [0, 1]; an expectation the simulator's token limit cut is compared
    # with the observation's first as many words (pivot_rules.cut_expectations: prefix), as the mismatch pivot does.
    # With pivot_rules.similarity `likelihood`: the simulator's per-token probability of the observation instead
    match: float | None = None
    error: bool = False
    reward: float = 0.0
    score: float = 0.0
    done: bool = False
    won: bool = False
    source: str = "plan"  # plan | reactive | fallback | backtrack (an inverse undoing the step before)
    notes: list[str] = field(default_factory=list)  # shown with the observation the action was decided from
    fault: str | None = None  # set by a fault-injecting env wrapper (info["fault"])
    model_calls: int = 0  # engine calls since the previous act
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0  # of prompt_tokens, those the engine reused instead of prefilling
    completion_tokens: int = 0
    env_seconds: float = 0.0
    # An expectation generated after the step (imagination.draft_expectations): its prompt tokens and the cached part
    # of them, a share of the three counts above; None where the expectation came with the plan (or none was made).
    expectation_prompt_tokens: int | None = None
    expectation_cached_prompt_tokens: int | None = None


@dataclass
class PivotEvent(TraceEvent):
    type: ClassVar[str] = "pivot"
    rule: str = ""
    severity: str = "warning"  # warning | error
    evidence: dict[str, Any] = field(default_factory=dict)  # expected vs seen, counts, thresholds
    message: str = ""
    fired: bool = False  # False: a warning only counted toward the delayed trigger


@dataclass
class ReplanEvent(TraceEvent):
    type: ClassVar[str] = "replan"
    reason: str = ""  # rule name(s) that fired, or "queue_empty"
    replans: int = 0  # replans used so far, this one included
    budget: int = 0
    dropped: int = 0  # queued actions dropped
    banned: list[str] = field(default_factory=list)
    failure_note: str | None = None
    backtrack: str | None = None  # the inverse queued to undo the step before replanning (None: no backtrack)


@dataclass
class BacktrackEvent(TraceEvent):
    """A step undone by the env's inverse (pivot_rules.backtrack), traced after the inverse ran: whether it is back
    in the state before the step (the same valid actions and score), where the undone step is then banned."""

    type: ClassVar[str] = "backtrack"
    undone: str = ""  # the step undone
    action: str = ""  # its inverse, the real step just taken
    rules: list[str] = field(default_factory=list)  # the fired pivots that called for it
    restored: bool = False  # the valid actions and the score are those before the undone step
    score_before: float = 0.0  # the score before the undone step
    score: float = 0.0  # the score after its inverse
    banned: list[str] = field(default_factory=list)  # the undone step, banned in the restored state


@dataclass
class ParseFailureEvent(TraceEvent):
    type: ClassVar[str] = "parse_failure"
    role: str = "decider"  # decider | simulator
    text: str = ""
    reason: str = ""
    handled: str = "resample"  # resample | fallback | dropped


@dataclass
class SubgoalEvent(TraceEvent):
    """The env's sub-goals at work (inference/planning/subgoals.py): a decision's proposals screened against the
    first unmet one (`check` "screen"), or a real step that met sub-goals ("step")."""

    type: ClassVar[str] = "subgoal"
    check: str = "screen"  # screen | step
    subgoal: str = ""  # the first unmet sub-goal (after the step, for "step"; "" when every one is met)
    unmet: list[str] = field(default_factory=list)
    met: list[str] = field(default_factory=list)  # step: the sub-goals this step met
    actions: list[str] = field(default_factory=list)  # screen: the proposals that contradict it; step: the action
    rejected: list[str] = field(default_factory=list)  # screen: the conditions they fail
    repaired: dict[str, str] = field(default_factory=dict)  # screen: proposal -> the call under the conditions
    top: str | None = None  # screen: the decision's first proposal after screening


@dataclass
class GradeEvent(TraceEvent):
    """The request's grade before the episode (inference/planning/grading.py) and the route it took."""

    type: ClassVar[str] = "grade"
    grade: str = ""  # data/grades.py GRADES
    by: str = ""  # env (its grade_request rule) or fitted (the grader file)
    probabilities: dict[str, float] = field(default_factory=dict)  # the fitted grader's; {} for the env's rule
    route: dict[str, Any] = field(default_factory=dict)  # the budget overrides the grade's route gave
    withheld: list[str] = field(default_factory=list)  # tools the episode could not use (the ask tool)


@dataclass
class EndEvent(TraceEvent):
    type: ClassVar[str] = "end"
    status: str = "failed"  # one of END_STATUSES
    success: bool = False  # the environment's own success flag
    score: float = 0.0
    steps: int = 0
    replans: int = 0
    pivots: int = 0  # fired pivots
    parse_failures: int = 0
    model_calls: int = 0  # episode totals
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0  # of prompt_tokens, those the engine reused instead of prefilling
    completion_tokens: int = 0
    wall_seconds: float = 0.0
    planning_seconds: float = 0.0  # imagine + judge (engine calls included)
    env_seconds: float = 0.0
    engine_seconds: float = 0.0  # all engine calls (planning and reactive)
    error: str | None = None  # message when status is "errored"
    unmet: list[str] | None = None  # the env's sub-goals still unmet (None: none declared, or not tracked)
    reason: str | None = None  # why a budget ended the episode, with the best it reached (None: no budget did)
    best_score: float | None = None  # the highest score a real step reached (None: a trace older than version 6)
    best_step: int | None = None  # the first step that reached it
    # What the real observations' facts told by the end (envs/subgoals.py describe_belief: the lines a window's
    # snapshot shows); None where the env declares no facts (or a trace older than version 8).
    belief: list[str] | None = None
    asks: int | None = None  # real calls to the env's ask tool (EnvDefaults.ask_tool); None: the env has none


EVENT_TYPES: dict[str, type[TraceEvent]] = {
    cls.type: cls
    for cls in (
        StartEvent,
        GradeEvent,
        ImagineEvent,
        CommitEvent,
        ActEvent,
        PivotEvent,
        ReplanEvent,
        ParseFailureEvent,
        SubgoalEvent,
        BacktrackEvent,
        EndEvent,
    )
}


class TraceVersionError(ValueError):
    """A trace line of a format version this simplan does not read."""


def upgrade(event: dict[str, Any]) -> dict[str, Any]:
    """A trace line of any version as today's writer writes it: a new dict (`event` is left as it is).

    Every field of the line's event type (and of its candidate records and plan items) that the line lacks
    gets the field's default, which for a field a writer did not record is what readers take as unknown
    (None) or none (0, "", []). A start event of version 1 says that its acts do not record their expected
    verdict (`act_verdicts` False); a start event's planner config with the flat keys of versions 1 and 2
    is put in today's sections (core/config.py `upgrade_keys`); the start event then has TRACE_VERSION.
    Upgrading twice gives the same line. A line of an unknown type is returned as it is (`event_from_dict`
    refuses it); a start event of a newer version raises TraceVersionError.
    """
    out = dict(event)
    if out.get("type") == "start":
        version = out.get("version", 1)
        where = f"trace of episode {out.get('episode_id', '')!r}"
        if isinstance(version, bool) or not isinstance(version, int):
            raise TraceVersionError(f"{where}: version {version!r} is not a trace version (1 to {TRACE_VERSION})")
        if version > TRACE_VERSION:
            raise TraceVersionError(
                f"{where}: trace version {version} is newer than this simplan reads (1 to {TRACE_VERSION}); "
                "upgrade simplan to read it"
            )
        if version < 2:
            out["act_verdicts"] = False
        if version < 3 and isinstance(out.get("config"), dict):
            out["config"] = planner_sections(out["config"])
        out["version"] = TRACE_VERSION
    cls = EVENT_TYPES.get(str(out.get("type")))
    if cls is None:
        return out
    _fill(cls, out)
    if cls is ImagineEvent:
        out["candidates"] = [_fill(CandidateRecord, dict(c)) if isinstance(c, dict) else c for c in out["candidates"]]
    if cls is CommitEvent:
        out["plan"] = [_fill(PlanItem, dict(p)) if isinstance(p, dict) else p for p in out["plan"]]
    return out


def _fill(cls: type, d: dict[str, Any]) -> dict[str, Any]:
    for f in dataclasses.fields(cls):
        if f.name not in d:
            d[f.name] = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
    return d


def planner_sections(config: dict[str, Any]) -> dict[str, Any]:
    """A start event's planner config in today's sections (`judge: {error: -3}` for a flat `w_error: -3`). A key
    today's PlannerConfig does not have is kept as it was written: a trace stays readable."""
    return json.loads(_sections_json(json.dumps(config)))


@functools.lru_cache(maxsize=256)
def _sections_json(config: str) -> str:
    """`planner_sections` of a JSON text: the episodes of one run share a few configs, each upgraded once."""
    # Imported here: inference/planning/config.py imports modules that import this one.
    from simplan.inference.planning.config import PlannerConfig

    source = "start event config"
    mapping = json.loads(config)
    try:
        return json.dumps(upgrade_keys(PlannerConfig, mapping, source))
    except ValueError:
        dotted: dict[str, Any] = {}
        kept: dict[str, Any] = {}
        for key, value in mapping.items():
            try:
                dotted.update(flatten(PlannerConfig, {key: value}, source))
            except ValueError:
                kept[key] = value
        return json.dumps({**kept, **upgrade_keys(PlannerConfig, dotted, source)})
