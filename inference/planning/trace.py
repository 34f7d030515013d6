"""Episode traces: what the planning loop imagined, did and why it pivoted, one JSON line per event.

Every episode of `simplan run` / `simplan eval` writes a trace: the events of inference/planning/trace_events.py
(what each type records, the format's version), stamped and kept in order by `EpisodeTrace`. Several
episodes may share one file, and one episode may have been run more than once (a resumed or a
repeated run); `read_traces` reads ONE run per episode (`episode_runs`), never a merge of two. Every line
read becomes an event through `event_from_dict`, after `trace_events.upgrade`: a trace of any older
version reads as today's.

`summarize(trace)` computes per-episode metrics from the events alone, so every number of a report
traces back to the episode file. `format_event` is the one-line view of `simplan run`.
This module imports nothing heavy (the standard library, `simplan.core` and the verdict words of
`simplan.data.format`), so evaluation and report code can use it without torch or an engine.

    trace = EpisodeTrace.start(episode_id="toy/corridor-3/simplan/0", env="toy", task=task.to_dict(), ...)
    trace.add(ActEvent(step=1, action="go east", observation="...", ...))
    append_trace("runs/x/traces.jsonl", trace)
    for t in read_traces("runs/x/traces.jsonl"):
        print(summarize(t))
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
import uuid
import warnings
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from simplan.core.errors import InputError
from simplan.core.io import LineProblem, append_jsonl, read_jsonl_tolerant, write_jsonl
from simplan.core.text import exact, normalize
from simplan.data.format import VERDICTS, episode_verdict
from simplan.inference.planning.trace_events import (
    EVENT_TYPES,
    ActEvent,
    BacktrackEvent,
    CandidateRecord,
    CommitEvent,
    EndEvent,
    GradeEvent,
    ImagineEvent,
    ParseFailureEvent,
    PivotEvent,
    PlanItem,
    ReplanEvent,
    StartEvent,
    SubgoalEvent,
    TraceEvent,
    TraceVersionError,
    upgrade,
)


# ---------------------------------------------------------------------------------------------
# Reading events
# ---------------------------------------------------------------------------------------------
def event_from_dict(d: dict[str, Any]) -> TraceEvent:
    """Rebuild an event from its JSON object of any version (`upgrade`); unknown keys are ignored (newer writers)."""
    d = upgrade(d)
    kind = d.get("type")
    if kind not in EVENT_TYPES:
        raise ValueError(f"trace event type {kind!r} is unknown; expected one of {', '.join(EVENT_TYPES)}")
    cls = EVENT_TYPES[kind]
    names = {f.name for f in dataclasses.fields(cls)}
    kwargs = {k: v for k, v in d.items() if k in names}
    if cls is ImagineEvent:
        kwargs["candidates"] = [_from_fields(CandidateRecord, c) for c in kwargs.get("candidates", [])]
    if cls is CommitEvent:
        kwargs["plan"] = [_from_fields(PlanItem, p) for p in kwargs.get("plan", [])]
    return cls(**kwargs)


def _from_fields(cls: type, d: dict[str, Any]) -> Any:
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in d.items() if k in names})


# ---------------------------------------------------------------------------------------------
# The trace
# ---------------------------------------------------------------------------------------------
@dataclass
class EpisodeTrace:
    """Header (from the start event) + events. `sink` (not serialized) sees every event as added."""

    episode_id: str
    env: str = ""
    task: dict[str, Any] = field(default_factory=dict)
    arm: str = ""
    config: dict[str, Any] = field(default_factory=dict)
    events: list[TraceEvent] = field(default_factory=list)
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    sink: Callable[[TraceEvent], None] | None = field(default=None, repr=False, compare=False)
    t0: float = field(default_factory=time.perf_counter, repr=False, compare=False)

    @staticmethod
    def start(
        episode_id: str,
        env: str,
        task: dict[str, Any],
        arm: str,
        config: dict[str, Any] | None = None,
        budgets: dict[str, Any] | None = None,
        goal: str = "",
        observation: str = "",
        sink: Callable[[TraceEvent], None] | None = None,
    ) -> EpisodeTrace:
        trace = EpisodeTrace(episode_id=episode_id, env=env, task=dict(task), arm=arm, config=dict(config or {}))
        trace.sink = sink
        trace.add(
            StartEvent(
                env=env,
                task=dict(task),
                arm=arm,
                config=dict(config or {}),
                budgets=dict(budgets or {}),
                goal=goal,
                observation=observation,
            )
        )
        return trace

    def add(self, event: TraceEvent, step: int | None = None) -> TraceEvent:
        """Stamp the event (episode id, run id, time; step if given) and append it."""
        event.episode_id = self.episode_id
        event.run_id = self.run_id
        event.t = round(time.perf_counter() - self.t0, 6)
        if step is not None:
            event.step = step
        self.events.append(event)
        if self.sink is not None:
            self.sink(event)
        return event

    def of_type(self, kind: str) -> list[Any]:
        return [e for e in self.events if e.type == kind]

    @property
    def end(self) -> EndEvent | None:
        ends = self.of_type("end")
        return ends[-1] if ends else None

    def to_dicts(self) -> list[dict[str, Any]]:
        return [e.to_dict() for e in self.events]

    @staticmethod
    def from_dicts(records: Iterable[dict[str, Any]]) -> EpisodeTrace:
        events = [event_from_dict(r) for r in records]
        if not events:
            raise ValueError("an episode trace needs at least one event")
        head = next((e for e in events if isinstance(e, StartEvent)), None)
        trace = EpisodeTrace(episode_id=events[0].episode_id, events=events, run_id=events[0].run_id)
        if head is not None:
            trace.env, trace.task, trace.arm, trace.config = head.env, head.task, head.arm, head.config
        return trace


def append_trace(path: str | os.PathLike, trace: EpisodeTrace) -> None:
    """Append a finished episode's events with one durable write (a crash never tears an episode)."""
    append_jsonl(path, trace.to_dicts())


def write_traces(path: str | os.PathLike, traces: Iterable[EpisodeTrace]) -> int:
    """Write traces to a new file atomically; returns the number of event lines."""
    return write_jsonl(path, (d for t in traces for d in t.to_dicts()))


def trace_line_problem(record: dict[str, Any]) -> str | None:
    """Why a JSON object read from a trace file is not a trace event (a trajectory line, say), or None."""
    kind = record.get("type")
    if kind not in EVENT_TYPES:
        return f"not a trace event (type {kind!r}; trace events are {', '.join(EVENT_TYPES)})"
    return None


def read_trace_records(path: str | os.PathLike) -> tuple[list[dict[str, Any]], list[LineProblem]]:
    """The trace events of a trace file as JSON objects, and 'FILE:LINE: why' of every line that is not one (a
    torn last line, bad bytes, a record of another kind). A file with lines but no trace event at all is not a
    trace file: InputError naming it."""
    records, problems = read_jsonl_tolerant(path, check=trace_line_problem)
    if not records and any(not p.torn for p in problems):
        raise InputError(
            f"{path}: not a trace file of `simplan eval` (first problem: {problems[0]}); give an eval run folder or "
            "its traces.jsonl"
        )
    return records, problems


def read_traces(path: str | os.PathLike, strict: bool = False) -> list[EpisodeTrace]:
    """Read a trace file: one run per episode (`episode_runs`), in order of the episodes' first lines.

    A torn last line (crashed writer) and lines that are no trace events are skipped (`read_trace_records`);
    with `strict=True` they raise instead. Runs left out (a second finished run of an episode, an unfinished
    one superseded) are reported with a warning, never merged into the run that is read.
    """
    records, problems = read_trace_records(path)
    if problems and strict:
        raise ValueError("; ".join(problems))
    kept, left_out = episode_runs(records)
    if left_out:
        episodes = len({str(run[0].get("episode_id", "")) for run in left_out})
        warnings.warn(
            f"{path}: {len(left_out)} extra run(s) of {episodes} episode(s) left out (one run per episode is read: "
            "the first finished one, else the last started); two runs wrote to one file",
            stacklevel=2,
        )
    try:
        return [EpisodeTrace.from_dicts(run) for run in kept]
    except TraceVersionError as e:
        raise TraceVersionError(f"{path}: {e}") from None


def episode_runs(records: Iterable[dict[str, Any]]) -> tuple[list[list[dict[str, Any]]], list[list[dict[str, Any]]]]:
    """Split trace lines into runs and keep one per episode: (kept runs, runs left out).

    A run is the lines of one (episode id, run id) from its start event to its end event (lines
    without a run id share the id "", so their runs are cut at each start event). Per
    episode the FIRST FINISHED run is kept, as a resumed eval never re-runs a finished episode;
    with none finished, the LAST STARTED run (a re-run replaces an interrupted one). Lines of a run
    after its end event, or before any start, open a run of their own (no header), which a
    finished run outranks. Kept runs come in order of their episodes' first lines.
    """
    order: dict[str, None] = {}
    open_runs: dict[tuple[str, str], list[dict[str, Any]]] = {}  # by (episode id, run id), in start order
    finished: dict[str, list[dict[str, Any]]] = {}
    left_out: list[list[dict[str, Any]]] = []
    for r in records:
        episode = str(r.get("episode_id", ""))
        key = (episode, str(r.get("run_id", "")))
        order.setdefault(episode)
        if r.get("type") == "start" and key in open_runs:
            left_out.append(open_runs.pop(key))  # a run id restarted: only files without run ids do this
        if key not in open_runs:
            open_runs[key] = []
        open_runs[key].append(r)
        if r.get("type") == "end":
            run = open_runs.pop(key)
            if episode in finished:
                left_out.append(run)
            else:
                finished[episode] = run
    unfinished: dict[str, list[dict[str, Any]]] = {}
    for (episode, _), run in open_runs.items():
        if episode in finished:
            left_out.append(run)
        else:
            if episode in unfinished:
                left_out.append(unfinished[episode])
            unfinished[episode] = run  # a later start replaces an earlier unfinished run
    kept = [finished.get(e) or unfinished[e] for e in order]
    return kept, left_out


# ---------------------------------------------------------------------------------------------
# Summary: per-episode metrics computed only from events
# ---------------------------------------------------------------------------------------------
@dataclass
class EpisodeSummary:
    episode_id: str
    env: str = ""
    task_id: str = ""
    family: str = ""
    fold: str = ""
    arm: str = ""
    status: str = "incomplete"  # END_STATUSES, or "incomplete" when the trace has no end event
    success: bool = False
    score: float = 0.0
    steps: int = 0
    invalid_actions: int = 0  # real actions the env flagged as failed/invalid
    redundant_actions: int = 0  # real (action, observation) pairs already seen earlier in the episode
    faults: int = 0  # steps where a fault was injected
    pivots: int = 0  # pivots that fired
    pivot_warnings: int = 0  # warnings only counted
    pivots_by_rule: dict[str, int] = field(default_factory=dict)  # fired pivots per rule
    replans: int = 0
    parse_failures: int = 0
    plan_actions: int = 0
    reactive_actions: int = 0
    fallback_actions: int = 0
    candidates_imagined: int = 0
    simulated_decisions: int = 0  # decisions (imagine events) that simulated (horizon > 0)
    reactive_decisions: int = 0  # decisions that did not
    routed_reactive: int = 0  # of those, the selective router's choice (route "react")
    simulated_tokens: int = 0  # model tokens (prompt + completion) of the simulated decisions
    reactive_tokens: int = 0  # and of the reactive ones
    model_calls: int = 0
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0  # of prompt_tokens, reused by the engine (prefilled = prompt - cached)
    completion_tokens: int = 0
    total_tokens: int = 0
    wall_seconds: float = 0.0
    planning_seconds: float = 0.0
    planning_share: float = 0.0
    env_seconds: float = 0.0
    sim_predictions: int = 0  # real steps that had an expectation
    sim_exact: int = 0  # of those, observation == expectation after core.text.normalize
    sim_accuracy: float | None = None  # sim_exact / sim_predictions
    sim_match_mean: float | None = None  # mean similarity of the predictions (match field)
    # Verdicts (predicted endings: the env oracle's, or a simulator's trained with them; `verdict_account`).
    verdicts: bool = False  # the episode's predictions carried verdicts (some candidate record has outcomes)
    # The real steps' counts are None without verdicts, and where the acts do not record their expected verdict.
    ending_steps: int | None = None  # real steps that ended the episode and had a prediction
    ending_foreseen: int | None = None  # of those, predicted with the verdict they had (won / lost)
    verdict_steps: int | None = None  # real steps predicted to end the episode (expected_verdict set)
    verdict_false_alarms: int | None = None  # of those, the episode went on, or ended with the other verdict
    candidates_predicted_lost: int = 0  # per decision, candidates' first actions whose first step was predicted lost
    lost_candidates_avoided: int = 0  # of those, not the action the decision took (its chosen candidate's first)
    # Sub-goals (subgoal events; PlannerConfig.subgoals with an env that declares them).
    subgoal_screens: int = 0  # decisions with a proposal that contradicted the first unmet sub-goal
    subgoal_repairs: int = 0  # proposals decoded again with the value a sub-goal's condition names
    subgoals_unmet: int | None = None  # sub-goals still unmet at the end (None: none declared, or not tracked)
    asks: int | None = None  # calls to the env's ask tool (None: the env has no one to ask)
    grade: str | None = None  # the request's grade before the episode (grade event; None: not graded)
    suboptimal_commits: int = 0  # simulated decisions whose plan was the best of bad ones (commit `suboptimal`)
    # Backtracking (backtrack events; pivot_rules.backtrack with an env that declares inverses).
    backtracks: int = 0  # steps undone by their inverse
    backtracks_restored: int = 0  # of those, back at the valid actions and score before the undone step

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def redundant_steps(acts: list[ActEvent]) -> list[int]:
    """Steps whose (action, observation) pair already occurred earlier: loops and no-op repeats."""
    seen: set[tuple[str, str]] = set()
    out = []
    for a in acts:
        key = (a.action_key or normalize(a.action), normalize(a.observation))
        if key in seen:
            out.append(a.step)
        seen.add(key)
    return out


def predicted_exactly(act: ActEvent) -> bool:
    """Whether a real step's observation is what the simulator predicted for it (its expectation), as the
    summary's simulator accuracy counts it: equal after `core.text.normalize`. False for a step without one."""
    return act.expectation is not None and exact(act.expectation, act.observation)


def outcome_verdict(label: str | None) -> str | None:
    """The verdict in a candidate's outcome label (judge.Outcome.label(): 'won ...' / 'lost ...'); None for a
    step predicted to go on ('on ...') or without an outcome."""
    word = (label or "").split(maxsplit=1)[:1]
    return word[0] if word and word[0] in VERDICTS else None


def has_verdicts(imagines: list[ImagineEvent]) -> bool:
    """Whether the episode's simulator gave verdicts: the planner records outcomes (a list, None where a step had
    no verdict) on every imagined candidate then, and None on all of them otherwise."""
    return any(c.outcomes is not None for e in imagines for c in e.candidates)


def lost_candidates(e: ImagineEvent) -> tuple[int, int]:
    """One decision's distinct first actions whose first step was predicted lost, and how many of them the
    decision did not take (the chosen candidate's first action is the one it took)."""
    chosen = {c.actions[0] for c in e.candidates if c.chosen and c.actions}
    lost = {c.actions[0] for c in e.candidates if c.actions and outcome_verdict((c.outcomes or [None])[0]) == "lost"}
    return len(lost), len(lost - chosen)


def verdict_account(s: EpisodeSummary, trace: EpisodeTrace) -> None:
    """Fill s's verdict fields: were the predicted endings right, and did they change decisions."""
    imagines: list[ImagineEvent] = trace.of_type("imagine")
    s.verdicts = has_verdicts(imagines)
    if not s.verdicts:
        return
    for e in imagines:
        lost, avoided = lost_candidates(e)
        s.candidates_predicted_lost += lost
        s.lost_candidates_avoided += avoided
    starts: list[StartEvent] = trace.of_type("start")
    if not starts or not starts[0].act_verdicts:
        return  # the acts do not record their expected verdict: unknown, not zero
    acts: list[ActEvent] = trace.of_type("act")
    ending = [a for a in acts if a.done and a.expectation is not None]
    s.ending_steps = len(ending)
    s.ending_foreseen = sum(a.expected_verdict == episode_verdict(a.done, a.won) for a in ending)
    alarmed = [a for a in acts if a.expected_verdict is not None]
    s.verdict_steps = len(alarmed)
    s.verdict_false_alarms = sum(a.expected_verdict != episode_verdict(a.done, a.won) for a in alarmed)


def summarize(trace: EpisodeTrace) -> EpisodeSummary:
    """Per-episode metrics from the trace's events alone (see EpisodeSummary for definitions)."""
    acts: list[ActEvent] = trace.of_type("act")
    pivots: list[PivotEvent] = trace.of_type("pivot")
    imagines: list[ImagineEvent] = trace.of_type("imagine")
    end = trace.end
    task = trace.task or {}
    s = EpisodeSummary(
        episode_id=trace.episode_id,
        env=trace.env,
        task_id=str(task.get("task_id", "")),
        family=str(task.get("family", "")),
        fold=str(task.get("fold", "")),
        arm=trace.arm,
    )
    s.steps = len(acts)
    s.invalid_actions = sum(a.error for a in acts)
    s.redundant_actions = len(redundant_steps(acts))
    s.faults = sum(a.fault is not None for a in acts)
    fired = [p for p in pivots if p.fired]
    s.pivots = len(fired)
    s.pivot_warnings = len(pivots) - len(fired)
    s.pivots_by_rule = dict(sorted(Counter(p.rule for p in fired).items()))
    s.replans = len(trace.of_type("replan"))
    s.parse_failures = len(trace.of_type("parse_failure"))
    sources = Counter(a.source for a in acts)
    s.plan_actions, s.reactive_actions, s.fallback_actions = sources["plan"], sources["reactive"], sources["fallback"]
    s.candidates_imagined = sum(len(e.candidates) for e in imagines)
    for e in imagines:
        tokens = e.prompt_tokens + e.completion_tokens
        if e.horizon > 0:
            s.simulated_decisions, s.simulated_tokens = s.simulated_decisions + 1, s.simulated_tokens + tokens
        else:
            s.reactive_decisions, s.reactive_tokens = s.reactive_decisions + 1, s.reactive_tokens + tokens
    s.routed_reactive = sum(e.route == "react" for e in imagines)
    predicted = [a for a in acts if a.expectation is not None]
    s.sim_predictions = len(predicted)
    s.sim_exact = sum(predicted_exactly(a) for a in predicted)
    if predicted:
        s.sim_accuracy = s.sim_exact / len(predicted)
        matches = [a.match for a in predicted if a.match is not None]
        s.sim_match_mean = sum(matches) / len(matches) if matches else None
    verdict_account(s, trace)
    s.suboptimal_commits = sum(bool(e.suboptimal) for e in trace.of_type("commit"))
    screens = [e for e in trace.of_type("subgoal") if e.check == "screen"]
    s.subgoal_screens, s.subgoal_repairs = len(screens), sum(len(e.repaired) for e in screens)
    grades: list[GradeEvent] = trace.of_type("grade")
    s.grade = grades[0].grade if grades else None
    backtracks: list[BacktrackEvent] = trace.of_type("backtrack")
    s.backtracks, s.backtracks_restored = len(backtracks), sum(e.restored for e in backtracks)
    if end is not None:
        s.subgoals_unmet = None if end.unmet is None else len(end.unmet)
        s.asks = end.asks
        s.status, s.success, s.score = end.status, bool(end.success), float(end.score)
        s.model_calls, s.prompt_tokens, s.completion_tokens = end.model_calls, end.prompt_tokens, end.completion_tokens
        s.cached_prompt_tokens = end.cached_prompt_tokens
        s.wall_seconds, s.planning_seconds, s.env_seconds = end.wall_seconds, end.planning_seconds, end.env_seconds
    else:  # a trace cut short: rebuild what the events allow
        s.success = any(a.won for a in acts)
        s.score = acts[-1].score if acts else 0.0
        s.model_calls = sum(a.model_calls for a in acts)
        s.prompt_tokens = sum(a.prompt_tokens for a in acts)
        s.cached_prompt_tokens = sum(a.cached_prompt_tokens for a in acts)
        s.completion_tokens = sum(a.completion_tokens for a in acts)
        s.wall_seconds = trace.events[-1].t if trace.events else 0.0
        s.planning_seconds = sum(e.seconds for e in imagines)
        s.env_seconds = sum(a.env_seconds for a in acts)
    s.total_tokens = s.prompt_tokens + s.completion_tokens
    s.planning_share = s.planning_seconds / s.wall_seconds if s.wall_seconds > 0 else 0.0
    return s


def format_event(e: TraceEvent) -> str:
    """One human line per event (the plain live view of `simplan run`)."""
    if isinstance(e, StartEvent):
        return f"[start] {e.env} {e.task.get('task_id', '')} arm={e.arm} goal: {e.goal}\n  obs: {e.observation}"
    if isinstance(e, GradeEvent):
        probs = ", ".join(f"{g} {p:.2f}" for g, p in e.probabilities.items())
        route = ", ".join(f"{k} {v}" for k, v in e.route.items())
        withheld = f"; may not use {', '.join(e.withheld)}" if e.withheld else ""
        return f"[grade] {e.grade} (by {e.by}{': ' + probs if probs else ''}){'; ' + route if route else ''}{withheld}"
    if isinstance(e, ImagineEvent):
        lines = [
            f"[imagine] {len(e.candidates)} candidate(s), horizon {e.horizon}" + (f" ({e.reason})" if e.reason else "")
        ]
        for c in e.candidates:
            mark = "*" if c.chosen else " "
            parts = " ".join(f"{k}={v:+.2f}" for k, v in c.parts.items())
            lines.append(f"  {mark} {' -> '.join(c.actions)}  total={c.total:+.2f}  [{parts}]")
            for a, p in zip(c.actions, c.predicted):
                lines.append(f"      {a!r} => {p!r}")
        return "\n".join(lines)
    if isinstance(e, CommitEvent):
        return (
            "[commit] "
            + " ; ".join(p.action for p in e.plan)
            + (f" (suboptimal: {e.suboptimal})" if e.suboptimal else "")
        )
    if isinstance(e, ActEvent):
        match = f" match={e.match:.2f}" if e.match is not None else ""
        flag = " ERROR" if e.error else ""
        return f"[act {e.step}] ({e.source}) > {e.action}{flag}  score={e.score:g}{match}\n  obs: {e.observation}"
    if isinstance(e, PivotEvent):
        state = "FIRED" if e.fired else "counted"
        return f"[pivot {state}] {e.rule} ({e.severity}): {e.message}"
    if isinstance(e, ReplanEvent):
        note = f" note: {e.failure_note}" if e.failure_note else ""
        back = f"; backtracking with {e.backtrack}" if e.backtrack else ""
        return f"[replan {e.replans}/{e.budget}] {e.reason}; dropped {e.dropped}{note}{back}"
    if isinstance(e, BacktrackEvent):
        state = "restored" if e.restored else "NOT restored"
        ban = f"; banned {', '.join(e.banned)} here" if e.banned else ""
        return f"[backtrack] {e.action} undid {e.undone} ({'+'.join(e.rules)}): {state}, score {e.score:g}{ban}"
    if isinstance(e, ParseFailureEvent):
        return f"[parse failure] {e.role}: {e.text!r} ({e.reason}); {e.handled}"
    if isinstance(e, SubgoalEvent):
        if e.check == "step":
            left = f"; next: {e.subgoal}" if e.subgoal else "; every sub-goal met"
            return f"[sub-goal] met {', '.join(e.met)}{left}"
        fixes = "".join(f"\n  repaired: {a} -> {b}" for a, b in e.repaired.items())
        return f"[sub-goal] {e.subgoal}: {', '.join(e.actions)} fail {'; '.join(e.rejected)}; first now {e.top}{fixes}"
    if isinstance(e, EndEvent):
        # a budget's reason names the unmet sub-goals too
        why = f" ({e.reason})" if e.reason else f" unmet: {', '.join(e.unmet)}" if e.unmet else ""
        known = "".join(f"\n  known: {line}" for line in e.belief or ())
        why += f" asked={e.asks}" if e.asks else ""
        return (
            f"[end] {e.status} success={e.success} score={e.score:g} steps={e.steps} replans={e.replans} "
            f"calls={e.model_calls} tokens={e.prompt_tokens + e.completion_tokens} wall={e.wall_seconds:.2f}s{why}"
            f"{known}"
        )
    return json.dumps(e.to_dict())
