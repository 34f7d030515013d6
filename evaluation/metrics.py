"""Aggregate metrics per arm and per (arm, family), computed only from episode traces.

    from simplan.evaluation.metrics import load_run, aggregate
    episodes = load_run("runs/eval/twx-dev")              # EpisodeSummary per finished episode
    for m in aggregate(episodes):                            # one GroupMetrics per arm
        print(m.arm, m.success_rate, m.ci_low, m.ci_high)
    by_game = aggregate(episodes, by_family=True)            # one per (arm, family)

Every number comes from `inference/planning/trace.summarize` over the run's traces.jsonl (never from live
counters or results.jsonl), so a report's numbers trace back to the episode files; a trace of any
format version reads as today's (inference/planning/trace_events.py `upgrade`). Episodes are
deduplicated by id (the first finished trace wins). Definitions:

    success_rate        successes / episodes, with a Wilson 95% interval [ci_low, ci_high]
    mean_score          mean final score (TWX: failed arithmetic/sorting/... end at -1)
    mean_steps          mean real actions per episode
    invalid_per_episode mean real actions the env flagged as failed or invalid (faults included)
    redundant_per_episode  mean real (action, observation) pairs already seen in the episode
    pivots/replans_per_episode, pivots_by_rule, replans_by_reason (totals)
    recovery_rate       episodes with >= 1 injected fault that still succeeded / episodes with faults
    calls/tokens_per_episode  model calls, prompt + completion tokens (scoring counts as prompt)
    tokens_per_success  all tokens / successes (None without a success)
    wall_per_episode    mean episode wall seconds; planning_share = sum planning s / sum wall s
    wall_per_success    all wall seconds / successes (None without a success)
    losses              lost episodes per loss class (evaluation/losses.py), classes with none left out
    sim_accuracy        sum exact predictions / sum predictions, over real steps that had one
    simulated/reactive_decisions, routed_reactive, simulated/reactive_tokens  sums of the episodes'
                        (trace.EpisodeSummary): decisions with and without simulation, and their tokens

Episode endings foreseen (trace.verdict_account; only episodes whose predictions carried verdicts, from the env
oracle or a simulator trained with them: `verdict_episodes`; the rest count in none of these):
    ending_steps        real steps that ended the episode and had a prediction; ending_foreseen: of those, the
                        prediction carried the verdict the step had (won / lost); ending_foreseen_share
    verdict_steps       real steps predicted to end the episode; verdict_false_alarms: of those, the episode went
                        on or ended with the other verdict
                        (these four sum the `verdict_episodes_recorded` episodes whose acts record the expected
                        verdict, the start event's act_verdicts; None when there is none)
    candidates_predicted_lost  per decision, candidates' distinct first actions whose first step was predicted
                        lost; lost_candidates_avoided: of those, not the action the decision took

Sub-goals (trace.EpisodeSummary; the env's sub-goals, with PlannerConfig.subgoals on):
    subgoal_screens     decisions with a proposal that contradicted the first unmet sub-goal; subgoal_repairs:
                        proposals decoded again with the value a condition names
    unmet_episodes      episodes that ended with a sub-goal unmet, of subgoal_episodes (those that tracked them)

Backtracking (trace.EpisodeSummary; pivot_rules.backtrack with an env that declares inverses):
    backtracks          steps undone by their inverse; backtracks_restored: of those, back at the valid actions and
                        score of the state before the undone step

Transient failures and finishes (`RetryAccount`, from the act events; issue 20's tool-calling envs):
    transient_failures  real actions that failed transiently: an injected transient fault (fault ==
                        "transient") or an error observation matching the env's `transient_patterns`
                        (envs/failures.py rules_of_env of the trace's env); injected_transient of them
    got_through         of those, the ones whose call went through later in the episode: a later act with the
                        same action key that is not itself transient (a success or a real answer such as out of
                        stock); got_through_share = got_through / transient_failures (None without any)
    finish_calls        finish actions the env took (inference/planning/judge.py is_finish; a finish that failed
                        transiently never reached the env and is left out)
    premature_finishes  of those, finishes while the goal was not met (won false); premature_finish_episodes:
                        episodes with at least one

Departures from the decider (`DepartureAccount`, from the imagine events' candidates):
    judged_choices      decisions whose candidates hold at least two distinct first actions with the decider's
                        log-probability known, one of them committed (a skipped simulation or a single proposal
                        leaves the decider's top action unchallenged and is not counted)
    departures          of those, decisions that committed another first action than the decider's most likely
                        one (ties count as the decider's); departures_by_part: the judge part (likelihood aside)
                        that gained most for the committed candidate over the decider's top one
    departure_episodes  episodes with at least one departure; departure_won_episodes: of them, won

Prompt tokens per step (`PromptAccount`, from the imagine events; prefilled = prompt - cached, the tokens
the engine computed rather than reused from its prefix cache; scored candidates count as prompt tokens, so
prefilled = context prefilled + candidate tokens):
    decisions           decider calls from the real state, one per imagine event (each is followed by a
                        real action; a committed plan's later actions need none)
    imagined_steps      simulated transitions: predictions in the imagined rollouts, cached ones included
    prompt/prefilled_per_decision       tokens of the calls from the real state / decisions
    prompt/prefilled_per_imagined_step  tokens of the rollouts' calls (simulator, and decider inside
                        imagination) / imagined steps
    prompt/prefilled_per_real_step      all the episode's prompt tokens / real actions
    candidate_tokens_per_decision/imagined_step/real_step  the scored candidates' tokens (each valid action
                        + EOS, in full, as the backend counts them: the hf engine computes a prefix shared
                        by candidates once, so this overstates its work) of those calls / the same count
    context_prefilled_per_decision/imagined_step/real_step  prompt - cached - candidate tokens of those
                        calls / the same count: the context (goal, history, new observation) computed anew
    prompt_cache_share  cached / prompt tokens, all calls
An expectation generated after its real step (imagination.draft_expectations) is an imagined step too, its
tokens recorded on the act event (expectation_prompt_tokens). An imagine event records the decision's share of its
tokens (decision_prompt_tokens). Where it does not
(None), a decision that imagined nothing (the reactive arm, skipped simulation) still splits exactly (all
its tokens are the decision's), and a group with any other such decision (`unsplit_decisions` > 0)
reports the per-decision and per-imagined-step numbers as None rather than guess a split. Likewise for
the candidates' tokens (candidate_tokens, decision_candidate_tokens): a group with any imagine event that
does not record them (`uncounted_candidates` > 0) reports the candidate and context numbers as None
(unknown, not zero). Every engine call is made inside an imagine event, so the episode's candidate tokens
are the sum over its imagine events (an episode that errored inside one misses that event's).
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from simplan.core.errors import MissingInputError
from simplan.envs.failures import FailureRules, rules_of_env
from simplan.evaluation.losses import LOSS_CLASSES, Loss, classify_loss
from simplan.inference.planning.arms import PIVOTS_ABLATION
from simplan.inference.planning.judge import is_finish
from simplan.inference.planning.trace import (
    ActEvent,
    EpisodeSummary,
    EpisodeTrace,
    ImagineEvent,
    read_traces,
    summarize,
)

Z95 = 1.959963984540054


def wilson_interval(successes: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion; (0, 1) when n == 0."""
    if n <= 0:
        return 0.0, 1.0
    if not 0 <= successes <= n:
        raise ValueError(f"wilson_interval: successes {successes} not in [0, {n}]")
    p = successes / n
    z2 = z * z
    denom = 1.0 + z2 / n
    center = (p + z2 / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / denom
    # The bounds are exactly 0 at no successes and 1 at all; floating point leaves ~1e-17 off (a negative error bar).
    low = 0.0 if successes == 0 else max(0.0, center - half)
    high = 1.0 if successes == n else min(1.0, center + half)
    return low, high


@dataclass
class PromptAccount:
    """An episode's prompt tokens split by where the calls were made (module docstring)."""

    decisions: int = 0  # imagine events: decider calls from the real state
    decision_prompt: int = 0
    decision_cached: int = 0
    imagined_steps: int = 0  # predictions in imagined rollouts (cache hits included)
    imagined_prompt: int = 0
    imagined_cached: int = 0
    unsplit_decisions: int = 0  # decisions that imagined: their tokens are in neither sum above
    decision_candidates: int = 0  # of decision_prompt, the scored candidates' tokens
    imagined_candidates: int = 0  # of imagined_prompt, the scored candidates' tokens
    uncounted_candidates: int = 0  # decisions whose event did not record candidate tokens: in neither sum above

    def add(self, other: PromptAccount) -> None:
        for f in dataclasses.fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))


def imagine_account(e: ImagineEvent) -> PromptAccount:
    """One decision's tokens, split as the event records them; where it records no split, all the decision's when
    nothing was imagined (no rollout made a call), else unsplit. Candidate tokens it does not record are
    uncounted."""
    steps = sum(len(c.predicted) for c in e.candidates)
    if e.decision_prompt_tokens is not None:
        prompt, cached = e.decision_prompt_tokens, e.decision_cached_prompt_tokens or 0
        acc = PromptAccount(1, prompt, cached, steps, e.prompt_tokens - prompt, e.cached_prompt_tokens - cached)
        if e.candidate_tokens is None or e.decision_candidate_tokens is None:
            acc.uncounted_candidates = 1
        else:
            acc.decision_candidates = e.decision_candidate_tokens
            acc.imagined_candidates = e.candidate_tokens - e.decision_candidate_tokens
        return acc
    if steps == 0:  # no prediction: no simulator call, hence no decider call inside a rollout either
        acc = PromptAccount(1, e.prompt_tokens, e.cached_prompt_tokens)
        if e.candidate_tokens is None:
            acc.uncounted_candidates = 1
        else:
            acc.decision_candidates = e.candidate_tokens
        return acc
    return PromptAccount(decisions=1, imagined_steps=steps, unsplit_decisions=1, uncounted_candidates=1)


def prompt_account(trace: EpisodeTrace) -> PromptAccount:
    total = PromptAccount()
    for e in trace.of_type("imagine"):
        total.add(imagine_account(e))
    for a in trace.of_type("act"):  # an expectation generated after its step: an imagined step all the same
        if a.expectation_prompt_tokens is not None:
            prompt, cached = a.expectation_prompt_tokens, a.expectation_cached_prompt_tokens or 0
            total.add(PromptAccount(imagined_steps=1, imagined_prompt=prompt, imagined_cached=cached))
    return total


@dataclass
class RetryAccount:
    """An episode's transient failures, how many of them got through later, and its finish calls (module
    docstring)."""

    transient_failures: int = 0
    injected_transient: int = 0  # of transient_failures, injected by a fault wrapper (the rest are the env's own)
    got_through: int = 0  # of transient_failures, the same call later went through
    finish_calls: int = 0
    premature_finishes: int = 0  # of finish_calls, those while the goal was not met

    def add(self, other: RetryAccount) -> None:
        for f in dataclasses.fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))


def is_transient(act: ActEvent, rules: FailureRules) -> bool:
    """A failed real action that is worth retrying as it was: an injected transient fault, or a transient failure
    of the env's own (envs/failures.py, the rule the planner retries by)."""
    return act.error and (act.fault == "transient" or rules.is_transient(act.observation, True))


def retry_account(trace: EpisodeTrace) -> RetryAccount:
    rules = rules_of_env(trace.env)
    acc = RetryAccount()
    went_through: set[str] = set()  # keys of the calls that went through after the act being looked at
    for act in reversed(trace.of_type("act")):
        key = act.action_key or act.action  # an act without an action key: the rendered action is the identity
        if not is_transient(act, rules):
            went_through.add(key)
            if is_finish(act.action_key):
                acc.finish_calls += 1
                acc.premature_finishes += int(not act.won)
            continue
        acc.transient_failures += 1
        acc.injected_transient += int(act.fault == "transient")
        acc.got_through += int(key in went_through)
    return acc


@dataclass
class DepartureAccount:
    """Where the judge committed another action than the decider's most likely one (module docstring)."""

    judged_choices: int = 0
    departures: int = 0
    by_part: Counter = field(default_factory=Counter)  # deciding judge part -> departures

    def add(self, other: DepartureAccount) -> None:
        self.judged_choices += other.judged_choices
        self.departures += other.departures
        self.by_part.update(other.by_part)


def departure_account(trace: EpisodeTrace) -> DepartureAccount:
    acc = DepartureAccount()
    for e in trace.of_type("imagine"):
        ranked = [c for c in e.candidates if c.actions and c.logprob is not None]
        chosen = next((c for c in ranked if c.chosen), None)
        if chosen is None or len({c.actions[0] for c in ranked}) < 2:
            continue
        acc.judged_choices += 1
        best = max(c.logprob for c in ranked)
        tops = [c for c in ranked if c.logprob == best]
        if chosen.actions[0] in {c.actions[0] for c in tops}:
            continue
        acc.departures += 1
        top = tops[0]
        gains = {k: v - top.parts.get(k, 0.0) for k, v in chosen.parts.items() if k != "likelihood"}
        acc.by_part[max(gains, key=gains.get) if gains else "none"] += 1
    return acc


@dataclass
class EpisodeRecord:
    """An episode's summary plus what the summary does not keep (replan reasons, why it was lost, prompt split,
    transient failures and finishes)."""

    summary: EpisodeSummary
    replans_by_reason: dict[str, int] = field(default_factory=dict)
    loss: Loss | None = None  # None for a won episode
    prompts: PromptAccount = field(default_factory=PromptAccount)
    retries: RetryAccount = field(default_factory=RetryAccount)
    departures: DepartureAccount = field(default_factory=DepartureAccount)
    # The arm's settings as the episode ran them (its start event's PlannerConfig; None where a trace lacks them):
    # what the report reads to tell which arm is which arm plus imagination, whatever presets and overrides made it.
    pivots_on: bool | None = None
    horizon: int | None = None


def episode_record(trace: EpisodeTrace) -> EpisodeRecord:
    reasons: Counter = Counter()
    for e in trace.of_type("replan"):
        for r in str(e.reason).split(","):
            if r:
                reasons[r] += 1
    return EpisodeRecord(
        summarize(trace),
        dict(sorted(reasons.items())),
        classify_loss(trace),
        prompt_account(trace),
        retry_account(trace),
        departure_account(trace),
        trace.config.get("pivots"),
        trace.config.get("horizon"),
    )


def records_from_traces(traces: Iterable[EpisodeTrace]) -> list[EpisodeRecord]:
    """Finished episodes (with an end event), deduplicated by id: the first one wins."""
    seen: dict[str, EpisodeRecord] = {}
    for t in traces:
        if t.end is None or t.episode_id in seen:
            continue
        seen[t.episode_id] = episode_record(t)
    return list(seen.values())


def trace_files(run: str | Path) -> list[Path]:
    """A run folder's traces.jsonl, or the file itself when a trace file is given."""
    p = Path(run)
    if p.is_file():
        return [p]
    f = p / "traces.jsonl"
    if not f.exists():
        raise MissingInputError(f"{p}: no traces.jsonl; give an eval run folder (simplan eval --out) or a trace file")
    return [f]


def load_run(run: str | Path) -> list[EpisodeRecord]:
    traces = [t for f in trace_files(run) for t in read_traces(f)]
    return records_from_traces(traces)


@dataclass
class GroupMetrics:
    arm: str
    family: str = ""  # "" = every family
    episodes: int = 0
    successes: int = 0
    success_rate: float = 0.0
    ci_low: float = 0.0
    ci_high: float = 1.0
    errored: int = 0
    mean_score: float = 0.0
    mean_steps: float = 0.0
    invalid_actions: int = 0
    invalid_per_episode: float = 0.0
    redundant_per_episode: float = 0.0
    pivots_per_episode: float = 0.0
    replans_per_episode: float = 0.0
    pivots_by_rule: dict[str, int] = field(default_factory=dict)
    replans_by_reason: dict[str, int] = field(default_factory=dict)
    parse_failures_per_episode: float = 0.0
    faulted_episodes: int = 0
    faults: int = 0
    recovered: int = 0
    recovery_rate: float | None = None
    recovery_ci: tuple[float, float] | None = None
    calls_per_episode: float = 0.0
    prompt_tokens_per_episode: float = 0.0
    completion_tokens_per_episode: float = 0.0
    tokens_per_episode: float = 0.0
    tokens_per_success: float | None = None
    wall_per_episode: float = 0.0
    wall_per_success: float | None = None
    planning_share: float = 0.0
    sim_predictions: int = 0
    sim_exact: int = 0
    sim_accuracy: float | None = None
    simulated_decisions: int = 0
    reactive_decisions: int = 0
    routed_reactive: int = 0  # reactive by the selective router's choice (PlannerConfig.router)
    simulated_tokens: int = 0
    reactive_tokens: int = 0
    losses: dict[str, int] = field(default_factory=dict)  # loss class -> lost episodes
    real_steps: int = 0
    decisions: int = 0
    imagined_steps: int = 0
    unsplit_decisions: int = 0
    prompt_per_decision: float | None = None
    prefilled_per_decision: float | None = None
    prompt_per_imagined_step: float | None = None
    prefilled_per_imagined_step: float | None = None
    prompt_per_real_step: float | None = None
    prefilled_per_real_step: float | None = None
    uncounted_candidates: int = 0
    context_prefilled_per_decision: float | None = None
    candidate_tokens_per_decision: float | None = None
    context_prefilled_per_imagined_step: float | None = None
    candidate_tokens_per_imagined_step: float | None = None
    context_prefilled_per_real_step: float | None = None
    candidate_tokens_per_real_step: float | None = None
    prompt_cache_share: float | None = None
    transient_failures: int = 0
    injected_transient: int = 0
    got_through: int = 0
    got_through_share: float | None = None
    finish_calls: int = 0
    premature_finishes: int = 0
    premature_finish_episodes: int = 0
    verdict_episodes: int = 0
    verdict_episodes_recorded: int = 0
    ending_steps: int | None = None
    ending_foreseen: int | None = None
    ending_foreseen_share: float | None = None
    verdict_steps: int | None = None
    verdict_false_alarms: int | None = None
    candidates_predicted_lost: int = 0
    lost_candidates_avoided: int = 0
    subgoal_screens: int = 0
    subgoal_repairs: int = 0
    subgoal_episodes: int = 0
    unmet_episodes: int = 0
    backtracks: int = 0
    backtracks_restored: int = 0
    ask_episodes: int = 0  # episodes on an env with someone to ask (EnvDefaults.ask_tool)
    asks: int = 0  # their calls to the ask tool
    asked_episodes: int = 0  # of them, episodes that asked at least once
    asked_successes: int = 0  # of those, won
    judged_choices: int = 0
    departures: int = 0
    departures_by_part: dict[str, int] = field(default_factory=dict)
    departure_episodes: int = 0
    departure_won_episodes: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def group_metrics(arm: str, family: str, records: list[EpisodeRecord]) -> GroupMetrics:
    """Metrics of one group of episodes (see the module docstring for definitions)."""
    ss = [r.summary for r in records]
    n = len(ss)
    m = GroupMetrics(arm=arm, family=family, episodes=n)
    if not n:
        return m
    m.successes = sum(bool(s.success) for s in ss)
    m.success_rate = m.successes / n
    m.ci_low, m.ci_high = wilson_interval(m.successes, n)
    m.errored = sum(s.status == "errored" for s in ss)
    m.mean_score = _mean([s.score for s in ss])
    m.mean_steps = _mean([s.steps for s in ss])
    m.invalid_actions = sum(s.invalid_actions for s in ss)
    m.invalid_per_episode = m.invalid_actions / n
    m.redundant_per_episode = _mean([s.redundant_actions for s in ss])
    m.pivots_per_episode = _mean([s.pivots for s in ss])
    m.replans_per_episode = _mean([s.replans for s in ss])
    rules: Counter = Counter()
    reasons: Counter = Counter()
    for r in records:
        rules.update(r.summary.pivots_by_rule)
        reasons.update(r.replans_by_reason)
    m.pivots_by_rule = dict(sorted(rules.items()))
    m.replans_by_reason = dict(sorted(reasons.items()))
    m.parse_failures_per_episode = _mean([s.parse_failures for s in ss])
    faulted = [s for s in ss if s.faults > 0]
    m.faulted_episodes = len(faulted)
    m.faults = sum(s.faults for s in ss)
    if faulted:
        m.recovered = sum(bool(s.success) for s in faulted)
        m.recovery_rate = m.recovered / len(faulted)
        m.recovery_ci = wilson_interval(m.recovered, len(faulted))
    m.calls_per_episode = _mean([s.model_calls for s in ss])
    m.prompt_tokens_per_episode = _mean([s.prompt_tokens for s in ss])
    m.completion_tokens_per_episode = _mean([s.completion_tokens for s in ss])
    m.tokens_per_episode = _mean([s.total_tokens for s in ss])
    m.tokens_per_success = sum(s.total_tokens for s in ss) / m.successes if m.successes else None
    m.wall_per_episode = _mean([s.wall_seconds for s in ss])
    wall = sum(s.wall_seconds for s in ss)
    m.wall_per_success = wall / m.successes if m.successes else None
    m.planning_share = sum(s.planning_seconds for s in ss) / wall if wall > 0 else 0.0
    m.sim_predictions = sum(s.sim_predictions for s in ss)
    m.sim_exact = sum(s.sim_exact for s in ss)
    m.sim_accuracy = m.sim_exact / m.sim_predictions if m.sim_predictions else None
    routes = ("simulated_decisions", "reactive_decisions", "routed_reactive", "simulated_tokens", "reactive_tokens")
    for name in (*routes, "subgoal_screens", "subgoal_repairs", "backtracks", "backtracks_restored"):
        setattr(m, name, sum(getattr(s, name) for s in ss))
    tracked = [s for s in ss if s.subgoals_unmet is not None]
    m.subgoal_episodes, m.unmet_episodes = len(tracked), sum(bool(s.subgoals_unmet) for s in tracked)
    asking = [s for s in ss if s.asks is not None]
    m.ask_episodes, m.asks = len(asking), sum(s.asks or 0 for s in asking)
    m.asked_episodes = sum(bool(s.asks) for s in asking)
    m.asked_successes = sum(bool(s.asks) and s.success for s in asking)
    lost = Counter(r.loss.label for r in records if r.loss is not None)
    m.losses = {label: lost[label] for label in LOSS_CLASSES if lost[label]}
    prompt_step_metrics(m, records)
    retry_metrics(m, records)
    verdict_metrics(m, ss)
    departure_metrics(m, records)
    return m


def departure_metrics(m: GroupMetrics, records: list[EpisodeRecord]) -> None:
    """Fill m's departure fields (module docstring) from the records' departure accounts."""
    acc = DepartureAccount()
    for r in records:
        acc.add(r.departures)
    m.judged_choices, m.departures = acc.judged_choices, acc.departures
    m.departures_by_part = dict(acc.by_part.most_common())
    departed = [r for r in records if r.departures.departures]
    m.departure_episodes = len(departed)
    m.departure_won_episodes = sum(bool(r.summary.success) for r in departed)


def verdict_metrics(m: GroupMetrics, ss: list[EpisodeSummary]) -> None:
    """Fill m's episode-ending fields (module docstring): sums over the episodes that have verdicts."""
    with_verdicts = [s for s in ss if s.verdicts]
    m.verdict_episodes = len(with_verdicts)
    m.candidates_predicted_lost = sum(s.candidates_predicted_lost for s in with_verdicts)
    m.lost_candidates_avoided = sum(s.lost_candidates_avoided for s in with_verdicts)
    recorded = [s for s in with_verdicts if s.ending_steps is not None]
    m.verdict_episodes_recorded = len(recorded)
    if not recorded:
        return  # unknown, not zero: no episode's acts record the verdict predicted for them
    m.ending_steps = sum(s.ending_steps or 0 for s in recorded)
    m.ending_foreseen = sum(s.ending_foreseen or 0 for s in recorded)
    m.verdict_steps = sum(s.verdict_steps or 0 for s in recorded)
    m.verdict_false_alarms = sum(s.verdict_false_alarms or 0 for s in recorded)
    m.ending_foreseen_share = _per(m.ending_foreseen, m.ending_steps)


def retry_metrics(m: GroupMetrics, records: list[EpisodeRecord]) -> None:
    """Fill m's transient-failure and finish fields (module docstring) from the records' retry accounts."""
    acc = RetryAccount()
    for r in records:
        acc.add(r.retries)
    for f in dataclasses.fields(acc):  # GroupMetrics has a field of each name, the arm's total
        setattr(m, f.name, getattr(acc, f.name))
    m.got_through_share = _per(acc.got_through, acc.transient_failures)
    m.premature_finish_episodes = sum(r.retries.premature_finishes > 0 for r in records)


def _per(tokens: int, count: int) -> float | None:
    return tokens / count if count else None


def prompt_step_metrics(m: GroupMetrics, records: list[EpisodeRecord]) -> None:
    """Fill m's prompt-tokens-per-step fields (module docstring) from the records' summaries and accounts."""
    acc = PromptAccount()
    for r in records:
        acc.add(r.prompts)
    prompt = sum(r.summary.prompt_tokens for r in records)
    cached = sum(r.summary.cached_prompt_tokens for r in records)
    m.real_steps = sum(r.summary.steps for r in records)
    m.decisions, m.imagined_steps, m.unsplit_decisions = acc.decisions, acc.imagined_steps, acc.unsplit_decisions
    m.uncounted_candidates = acc.uncounted_candidates
    m.prompt_per_real_step = _per(prompt, m.real_steps)
    m.prefilled_per_real_step = _per(prompt - cached, m.real_steps)
    m.prompt_cache_share = cached / prompt if prompt else None
    counted = not acc.uncounted_candidates  # else the trace does not say which prompt tokens were candidates
    if counted:
        candidates = acc.decision_candidates + acc.imagined_candidates
        m.candidate_tokens_per_real_step = _per(candidates, m.real_steps)
        m.context_prefilled_per_real_step = _per(prompt - cached - candidates, m.real_steps)
    if acc.unsplit_decisions:
        return  # the trace does not say which of those decisions' tokens were imagination's
    m.prompt_per_decision = _per(acc.decision_prompt, acc.decisions)
    m.prefilled_per_decision = _per(acc.decision_prompt - acc.decision_cached, acc.decisions)
    m.prompt_per_imagined_step = _per(acc.imagined_prompt, acc.imagined_steps)
    m.prefilled_per_imagined_step = _per(acc.imagined_prompt - acc.imagined_cached, acc.imagined_steps)
    if counted:
        m.candidate_tokens_per_decision = _per(acc.decision_candidates, acc.decisions)
        m.context_prefilled_per_decision = _per(
            acc.decision_prompt - acc.decision_cached - acc.decision_candidates, acc.decisions
        )
        m.candidate_tokens_per_imagined_step = _per(acc.imagined_candidates, acc.imagined_steps)
        m.context_prefilled_per_imagined_step = _per(
            acc.imagined_prompt - acc.imagined_cached - acc.imagined_candidates, acc.imagined_steps
        )


ARM_ORDER = ("reactive", PIVOTS_ABLATION, "plan", "simplan")


def _arm_key(arm: str) -> tuple[int, str]:
    return (ARM_ORDER.index(arm) if arm in ARM_ORDER else len(ARM_ORDER), arm)


def aggregate(records: list[EpisodeRecord], by_family: bool = False) -> list[GroupMetrics]:
    """One GroupMetrics per arm (arms in reactive, plan, simplan order), or per (arm, family)."""
    groups: dict[tuple[str, str], list[EpisodeRecord]] = {}
    for r in records:
        key = (r.summary.arm, r.summary.family if by_family else "")
        groups.setdefault(key, []).append(r)
    keys = sorted(groups, key=lambda k: (_arm_key(k[0]), k[1]))
    return [group_metrics(arm, fam, groups[(arm, fam)]) for arm, fam in keys]
