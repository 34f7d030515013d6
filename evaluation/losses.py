"""Why an episode was lost, read from its trace events alone: one class per lost episode.

    from simplan.evaluation.losses import classify_loss
    for trace in read_traces("runs/eval/twx-dev/traces.jsonl"):
        loss = classify_loss(trace)          # None when the episode was won
        if loss:
            print(loss.episode_id, loss.label, loss.evidence)

The classes, checked in this order (the first that applies wins, so each loss counts once):

    env_error       the episode ended with status "errored" (a crashed env, reset or engine)
    irreversible    the last real action ended the game without a win (done and not won): e.g. a
                    wrong answer in TWX arithmetic/sorting/simonsays, scored -1; nothing after it
                    could have saved the episode
    parse_failures  the decider's output was unparseable at least `parse_share` times per real step:
                    the episode was lost to formatting before planning could matter
    loop            ended by the step (or replan) budget while going in circles: at least
                    `loop_share` of the real steps repeat an earlier (action, observation) pair, or
                    repeated_action / no_progress make up at least `loop_share` of the pivot events;
                    and every episode the stall budget ended (budget_stall: steps without progress)
    step_cap        ended by the step budget otherwise (still making new moves: a larger cap might win)
    budget          ended by the time, token or replan budget (budget_time, budget_tokens, budget_replans)
    other           anything else (e.g. status "failed" with the game still running)

Where the env declares sub-goals (envs/subgoals.py), the evidence ends with those still unmet at the end:
where the episode stood when it was lost.

Parse failures come before loop because a decider that cannot be parsed falls back to the same
action again and again: the loop is then a symptom, not the cause.
"""

from __future__ import annotations

from dataclasses import dataclass

from simplan.inference.planning.trace import ActEvent, EpisodeTrace, ParseFailureEvent, PivotEvent, redundant_steps

LOSS_CLASSES = ("irreversible", "loop", "step_cap", "parse_failures", "env_error", "budget", "other")
LOSS_LABELS = {
    "irreversible": "irreversible wrong action",
    "loop": "loop / no progress",
    "step_cap": "step cap",
    "parse_failures": "parse failures",
    "env_error": "env error",
    "budget": "time/token/replan budget",
    "other": "other",
}
LOOP_RULES = ("repeated_action", "no_progress")
_LOOP_STATUSES = ("budget_steps", "budget_stall", "budget_replans")
_BUDGET_STATUSES = ("budget_time", "budget_tokens", "budget_replans")


@dataclass(frozen=True)
class LossRules:
    """Thresholds of the classes that need one."""

    loop_share: float = 0.5  # share of real steps that repeat, or of pivot events that are loop rules
    parse_share: float = 0.5  # decider parse failures per real step

    def __post_init__(self) -> None:
        for name in ("loop_share", "parse_share"):
            value = getattr(self, name)
            if not 0.0 < value <= 1.0:
                raise ValueError(f"LossRules.{name}: must be in (0, 1], got {value!r}")


@dataclass
class Loss:
    """One lost episode's class and the evidence from its trace."""

    episode_id: str
    arm: str
    family: str
    label: str  # one of LOSS_CLASSES
    evidence: str


def classify_loss(trace: EpisodeTrace, rules: LossRules = LossRules()) -> Loss | None:
    """The loss class of a finished episode; None when it was won or has no end event."""
    end = trace.end
    if end is None or end.success:
        return None
    label, evidence = _classify(trace, end.status, rules)
    if end.unmet:  # where it stood: the env's sub-goals it had not met (inference/planning/subgoals.py)
        evidence += f"; unmet: {', '.join(end.unmet)}"
    family = str((trace.task or {}).get("family", ""))
    return Loss(trace.episode_id, trace.arm, family, label, evidence)


def _classify(trace: EpisodeTrace, status: str, rules: LossRules) -> tuple[str, str]:
    acts: list[ActEvent] = trace.of_type("act")
    if status == "errored":
        error = (trace.end.error if trace.end else None) or "no message"
        return "env_error", f"errored: {error.splitlines()[0]}"
    last = acts[-1] if acts else None
    if last is not None and last.done and not last.won:
        return "irreversible", f"step {last.step} {last.action!r} ended the game unwon (score {last.score:g})"
    parse = [e for e in trace.of_type("parse_failure") if isinstance(e, ParseFailureEvent) and e.role == "decider"]
    if parse and len(parse) >= rules.parse_share * max(1, len(acts)):
        return "parse_failures", f"{len(parse)} decider parse failure(s) in {len(acts)} step(s)"
    if status in _LOOP_STATUSES:
        looping = _loop_evidence(acts, trace.of_type("pivot"), rules)
        if looping:
            return "loop", looping
        if status == "budget_stall":
            return "loop", f"ended after {len(acts)} step(s), the last ones without progress (budgets.stall_steps)"
    if status == "budget_steps":
        return "step_cap", f"step cap reached after {len(acts)} step(s), the last ones new"
    if status in _BUDGET_STATUSES:
        return "budget", status
    return "other", f"status {status} after {len(acts)} step(s)"


def _loop_evidence(acts: list[ActEvent], pivots: list[PivotEvent], rules: LossRules) -> str:
    """Why the episode counts as a loop ('' when it does not)."""
    repeats = len(redundant_steps(acts))
    if acts and repeats >= rules.loop_share * len(acts):
        return f"{repeats} of {len(acts)} steps repeat an earlier (action, observation)"
    looping = [p for p in pivots if p.rule in LOOP_RULES]
    if looping and len(looping) >= rules.loop_share * len(pivots):
        return f"{len(looping)} of {len(pivots)} pivot events are {' / '.join(LOOP_RULES)}"
    return ""
