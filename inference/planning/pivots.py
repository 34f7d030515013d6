"""Pivot detection: named rules that watch each real step and say when the plan no longer holds.

A rule is a small object with a `name`, a `severity` ("warning" or "error") and
`check(context) -> PivotEvent | None`. The PivotMonitor runs every rule after each real action:
an error fires at once; warnings are counted and fire together once their count since the last
fired pivot (or replan) reaches `warning_threshold` (a delayed trigger, so one odd step does not
throw away a good plan). Every event, fired or only counted, goes into the episode trace with its
evidence (what was expected and what was seen, counts, thresholds).

    monitor = PivotMonitor(default_rules(config, error_patterns), warning_threshold=2)
    events = monitor.check(context)        # all events of this step, `fired` set on those that fire
    if any(e.fired for e in events): ...   # drop the queue, note the failure, replan

Rules (default severities):
    error_observation       error   the env flagged the action, or its observation reads like an error
    expectation_mismatch    error   similarity(expected, real observation) below the threshold (token F1,
                                    difflib's ratio, or the cosine of the engine's embeddings: `embedding`);
                                    a prediction the simulator's token limit cut is compared with as many of
                                    the observation's first words (`cut_expectations: prefix`). Or, with
                                    `likelihood`, no text compared: the simulator's per-token probability of
                                    the real observation (the geometric mean, teacher-forced from the state
                                    the step was decided in) below the threshold: the step surprised it
    repeated_action         warning the same action N times in a row, or the same (action, observation) N times
    no_progress             warning no score increase for N steps (since the last replan)
    score_drop              error   the score fell by more than `min_drop`
    budget_nearly_exhausted warning the step or token budget crossed a fraction of its limit
    fact_mismatch           error   (pivot_rules.fact_mismatch; envs that declare `facts`) the facts of the real
                                    observation depart from those of the expected one (envs/subgoals.py
                                    fact_differences): the plan relied on a record the step did not write
    predicted_loss          error   (pivot_rules.predicted_loss; a simulator trained with outcome lines) the learned
                                    pivot: the outcome model's P(lost) of the step just taken, which did not end
                                    the episode, is over the fitted judge's `loss_pivot` (inference/planning/
                                    outcomes.py): a mistake whose consequence is predicted to come later

The planner adds one check of its own before each queued action (inference/planning/planner.py):
    not_valid_now           error   the next planned action is not among the real state's valid actions
and one after each real step, before the monitor:
    transient_error         error   the action failed in a way the env calls transient (its
                                    `transient_patterns`): retried as it is, with no model call, failure
                                    note or ban, at most `max_retries` times in a row; past that the
                                    failure is an ordinary one and the monitor's rules see it
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from simplan.core.text import SIMILARITIES, leading_words, normalize, similarity
from simplan.data.format import ERROR_RULE
from simplan.envs.failures import FailureRules, looks_like_error
from simplan.envs.subgoals import Fact, fact_differences
from simplan.inference.engines.base import cosine
from simplan.inference.planning.trace_events import SEVERITIES, PivotEvent

BAN_WHERE = ("observation", "belief")  # PivotConfig.ban_where: what a ban's state key reads
# The mismatch rule's similarities: core/text.py's, the engine's embeddings', and the simulator's likelihood of the
# real observation (scored by the planner: no expected text needed)
METHODS = (*SIMILARITIES, "embedding", "likelihood")
CUT_EXPECTATIONS = ("prefix", "whole")  # what a prediction cut by its token limit is compared with


def observation_similarity(
    expected: str, observed: str, method: str, embed: Callable[[list[str]], list[list[float]]] | None = None
) -> float:
    """Similarity in [0, 1] of an expected and a real observation by `method` (METHODS): core/text.py's for the
    text methods; for `embedding`, 1.0 for texts equal after `normalize`, else the cosine of `embed`'s vectors
    (negative cosines read as 0). `likelihood` compares no texts: the planner scores it (PivotContext.likelihood)."""
    if method == "likelihood":
        raise ValueError("similarity `likelihood` is the simulator's score of an observation, not a text's")
    if method != "embedding":
        return similarity(expected, observed, method)
    if normalize(expected) == normalize(observed):
        return 1.0
    if embed is None:
        raise ValueError("observation similarity `embedding` needs the engine's embeddings (an `embed` function)")
    a, b = embed([expected, observed])
    return max(0.0, cosine(a, b))


def expectation_match(
    expected: str,
    observed: str,
    method: str,
    cut: bool = False,
    cut_expectations: str = "prefix",
    embed: Callable[[list[str]], list[list[float]]] | None = None,
) -> tuple[float, str]:
    """How far a real observation meets its expectation: (similarity in [0, 1], the observed text compared). An
    expectation `cut` by the simulator's token limit says only how the observation starts: with `prefix`
    it is compared with the observation's first as many words (core/text.py leading_words), with `whole` with
    all of it (a long observation then reads as a mismatch however right its start was)."""
    compared = leading_words(observed, expected) if cut and cut_expectations == "prefix" else observed
    return observation_similarity(expected, compared, method, embed), compared


@dataclass
class StepRecord:
    """One real step as the rules see it."""

    action_key: str
    observation: str
    score: float
    error: bool = False


@dataclass
class PivotContext:
    """Everything the rules may look at after a real step (the step itself is history[-1])."""

    history: list[StepRecord]
    expectation: str | None = None  # predicted observation for the last step
    expectation_cut: bool = False  # the prediction ended at the simulator's token limit (finish_reason "length")
    since_replan: int = 0  # real steps since the last replan (the last step included)
    score_before: float = 0.0  # score before the last step
    max_steps: int = 0  # 0: no limit
    tokens_used: int = 0
    tokens_before: int = 0  # model tokens used before this step's decisions
    max_tokens: int = 0  # 0: no limit
    # Texts -> their embeddings (the engine's `embed`), given by the planner when the mismatch rule uses `embedding`
    embed: Callable[[list[str]], list[list[float]]] | None = None
    # The env's facts (envs/subgoals.py) of the expected and of the real observation, when the env declares facts
    # and the step had an expectation: (predicted, real); None otherwise
    facts: tuple[list[Fact], list[Fact]] | None = None
    # The outcome model's probabilities (inference/planning/outcomes.py) of the step just taken, from the state it
    # was taken in, when the learned pivot asks for them; None otherwise
    outcome_probs: dict[str, float] | None = None
    # The simulator's per-token probability of the real observation (the geometric mean, in [0, 1]) from the state
    # the step was decided in, when the mismatch rule uses `likelihood`; None otherwise
    likelihood: float | None = None

    @property
    def last(self) -> StepRecord:
        return self.history[-1]


@runtime_checkable
class PivotRule(Protocol):
    name: str
    severity: str

    def check(self, ctx: PivotContext) -> PivotEvent | None: ...


def _check_severity(severity: str) -> str:
    if severity not in SEVERITIES:
        raise ValueError(f"pivot severity {severity!r} is not one of {SEVERITIES}")
    return severity


@dataclass
class ErrorObservation:
    """The environment rejected the action (its error flag) or answered with error-like text."""

    patterns: Sequence[re.Pattern[str]] | None = None  # None: envs/failures.py DEFAULT_ERROR_PATTERNS
    severity: str = "error"
    name: str = ERROR_RULE

    def __post_init__(self) -> None:
        _check_severity(self.severity)

    def check(self, ctx: PivotContext) -> PivotEvent | None:
        last = ctx.last
        by_text = looks_like_error(last.observation, self.patterns)
        if not (last.error or by_text):
            return None
        why = "env flagged the action as failed" if last.error else "observation reads like an error"
        return PivotEvent(
            rule=self.name,
            severity=self.severity,
            evidence={"action": last.action_key, "observation": last.observation, "env_error": last.error},
            message=f"{last.action_key!r}: {why}: {last.observation!r}",
        )


@dataclass
class TransientError:
    """The last action failed transiently (a 503, "try again"): the same call may work if repeated."""

    rules: FailureRules = field(default_factory=FailureRules)  # the env's failure classes (envs/failures.py)
    max_retries: int = 2
    severity: str = "error"
    name: str = "transient_error"

    def __post_init__(self) -> None:
        _check_severity(self.severity)
        if self.max_retries < 0:
            raise ValueError(f"transient max_retries: must be >= 0, got {self.max_retries}")

    def is_transient(self, rec: StepRecord) -> bool:
        return self.rules.is_transient(rec.observation, rec.error)

    def attempts(self, history: Sequence[StepRecord]) -> int:
        """How many times in a row, up to the last step, the last step's action failed transiently."""
        n = 0
        for rec in reversed(history):
            if rec.action_key != history[-1].action_key or not self.is_transient(rec):
                break
            n += 1
        return n

    def check(self, ctx: PivotContext) -> PivotEvent | None:
        last = ctx.last
        attempts = self.attempts(ctx.history)
        if not attempts or attempts > self.max_retries:
            return None  # not transient, or its retries are spent: an ordinary (permanent) failure
        return PivotEvent(
            rule=self.name,
            severity=self.severity,
            evidence={
                "action": last.action_key,
                "observation": last.observation,
                "attempt": attempts,
                "max_retries": self.max_retries,
            },
            message=f"{last.action_key!r} failed transiently ({last.observation!r}): retry {attempts} of "
            f"{self.max_retries}",
        )


@dataclass
class ExpectationMismatch:
    """The real observation departs from the predicted one beyond the threshold."""

    threshold: float = 0.75
    method: str = "token_f1"
    cut_expectations: str = "prefix"  # CUT_EXPECTATIONS: what a prediction cut by its token limit is compared with
    severity: str = "error"
    name: str = "expectation_mismatch"

    def __post_init__(self) -> None:
        _check_severity(self.severity)
        if not 0.0 <= self.threshold <= 1.0:
            raise ValueError(f"expectation mismatch threshold: must be in [0, 1], got {self.threshold}")
        if self.method not in METHODS:
            raise ValueError(f"similarity method {self.method!r} is not one of {METHODS}")
        if self.cut_expectations not in CUT_EXPECTATIONS:
            raise ValueError(f"cut_expectations {self.cut_expectations!r} is not one of {CUT_EXPECTATIONS}")

    def check(self, ctx: PivotContext) -> PivotEvent | None:
        observed = ctx.last.observation
        if self.method == "likelihood":  # the simulator's score of the real observation: no text compared
            if ctx.likelihood is None or ctx.likelihood >= self.threshold:
                return None
            sim = ctx.likelihood
            return self._event(
                ctx, sim, f"the simulator gave {observed!r} a per-token probability of {sim:.2f} (< {self.threshold})"
            )
        if ctx.expectation is None:
            return None
        sim, compared = expectation_match(
            ctx.expectation, observed, self.method, ctx.expectation_cut, self.cut_expectations, ctx.embed
        )
        if sim >= self.threshold:
            return None
        cut = " (cut at its token limit)" if ctx.expectation_cut else ""
        message = f"expected {ctx.expectation!r}{cut}, saw {observed!r} ({self.method} {sim:.2f} < {self.threshold})"
        # what a cut prediction was compared with, only then, so the events of uncut predictions read as before
        extra = {"expectation_cut": True, "compared": compared} if ctx.expectation_cut else {}
        return self._event(ctx, sim, message, extra)

    def _event(self, ctx: PivotContext, sim: float, message: str, extra: dict[str, Any] | None = None) -> PivotEvent:
        evidence = {
            "action": ctx.last.action_key,
            **({"expected": ctx.expectation} if ctx.expectation is not None else {}),
            "observed": ctx.last.observation,
            "similarity": round(sim, 4),
            "threshold": self.threshold,
            "method": self.method,
            **(extra or {}),
        }
        return PivotEvent(rule=self.name, severity=self.severity, evidence=evidence, message=message)


@dataclass
class RepeatedAction:
    """The same action `limit` times in a row (since the last replan), or the same (action, observation) pair
    `limit` times in the episode: the agent is looping."""

    limit: int = 3
    severity: str = "warning"
    name: str = "repeated_action"

    def __post_init__(self) -> None:
        _check_severity(self.severity)
        if self.limit < 2:
            raise ValueError(f"repeated action limit: must be >= 2, got {self.limit}")

    def check(self, ctx: PivotContext) -> PivotEvent | None:
        last = ctx.last
        run = 0
        for rec in reversed(ctx.history[len(ctx.history) - ctx.since_replan :] if ctx.since_replan else []):
            if rec.action_key != last.action_key:
                break
            run += 1
        obs = normalize(last.observation)
        pair = sum(r.action_key == last.action_key and normalize(r.observation) == obs for r in ctx.history)
        if run < self.limit and pair < self.limit:
            return None
        kind = "in a row" if run >= self.limit else "with the same observation"
        count = run if run >= self.limit else pair
        return PivotEvent(
            rule=self.name,
            severity=self.severity,
            evidence={
                "action": last.action_key,
                "consecutive": run,
                "same_pair": pair,
                "limit": self.limit,
                "observation": last.observation,
            },
            message=f"{last.action_key!r} taken {count} times {kind} (limit {self.limit})",
        )


@dataclass
class NoProgress:
    """No score increase over the last `steps` real steps (counted since the last replan)."""

    steps: int = 8
    severity: str = "warning"
    name: str = "no_progress"

    def __post_init__(self) -> None:
        _check_severity(self.severity)
        if self.steps < 1:
            raise ValueError(f"no progress steps: must be >= 1, got {self.steps}")

    def check(self, ctx: PivotContext) -> PivotEvent | None:
        window = min(ctx.since_replan, len(ctx.history))
        if window < self.steps:
            return None
        recent = ctx.history[-self.steps :]
        before = ctx.history[-self.steps - 1].score if len(ctx.history) > self.steps else 0.0
        best = max(r.score for r in recent)
        if best > before:
            return None
        return PivotEvent(
            rule=self.name,
            severity=self.severity,
            evidence={"steps": self.steps, "score_before_window": before, "best_in_window": best},
            message=f"no score increase in the last {self.steps} steps (score {before:g})",
        )


@dataclass
class ScoreDrop:
    """The score fell by more than `min_drop` on the last step."""

    min_drop: float = 0.0
    severity: str = "error"
    name: str = "score_drop"

    def __post_init__(self) -> None:
        _check_severity(self.severity)
        if self.min_drop < 0:
            raise ValueError(f"score drop min_drop: must be >= 0, got {self.min_drop}")

    def check(self, ctx: PivotContext) -> PivotEvent | None:
        drop = ctx.score_before - ctx.last.score
        if drop <= self.min_drop:
            return None
        return PivotEvent(
            rule=self.name,
            severity=self.severity,
            evidence={"before": ctx.score_before, "after": ctx.last.score, "drop": drop, "min_drop": self.min_drop},
            message=f"score fell from {ctx.score_before:g} to {ctx.last.score:g} after {ctx.last.action_key!r}",
        )


@dataclass
class BudgetNearlyExhausted:
    """The step or token budget just crossed `fraction` of its limit (fires once per resource)."""

    fraction: float = 0.9
    severity: str = "warning"
    name: str = "budget_nearly_exhausted"

    def __post_init__(self) -> None:
        _check_severity(self.severity)
        if not 0.0 < self.fraction <= 1.0:
            raise ValueError(f"budget fraction: must be in (0, 1], got {self.fraction}")

    def check(self, ctx: PivotContext) -> PivotEvent | None:
        steps = len(ctx.history)
        crossed = []
        if ctx.max_steps and (steps - 1) < self.fraction * ctx.max_steps <= steps:
            crossed.append(f"steps {steps}/{ctx.max_steps}")
        if ctx.max_tokens and ctx.tokens_before < self.fraction * ctx.max_tokens <= ctx.tokens_used:
            crossed.append(f"tokens {ctx.tokens_used}/{ctx.max_tokens}")
        if not crossed:
            return None
        return PivotEvent(
            rule=self.name,
            severity=self.severity,
            evidence={
                "steps": steps,
                "max_steps": ctx.max_steps,
                "tokens": ctx.tokens_used,
                "max_tokens": ctx.max_tokens,
                "fraction": self.fraction,
            },
            message=f"budget above {self.fraction:.0%}: " + ", ".join(crossed),
        )


@dataclass
class PivotMonitor:
    """Runs the rules after each real step; errors fire at once, warnings after `warning_threshold` of them."""

    rules: list[PivotRule]
    warning_threshold: int = 2
    warnings: int = field(default=0, init=False)  # warnings counted since the last fire / reset

    def __post_init__(self) -> None:
        if self.warning_threshold < 1:
            raise ValueError(f"warning_threshold: must be >= 1, got {self.warning_threshold}")
        names = [r.name for r in self.rules]
        if len(set(names)) != len(names):
            raise ValueError(f"pivot rules must have distinct names, got {names}")

    def reset(self) -> None:
        self.warnings = 0

    def check(self, ctx: PivotContext) -> list[PivotEvent]:
        events = [e for rule in self.rules if (e := rule.check(ctx)) is not None]
        fired_error = False
        for e in events:
            if e.severity == "error":
                e.fired = fired_error = True
        pending = [e for e in events if e.severity == "warning"]
        self.warnings += len(pending)
        if pending and (fired_error or self.warnings >= self.warning_threshold):
            for e in pending:
                e.fired = True
        for e in pending:
            e.evidence["warnings_counted"] = self.warnings
            e.evidence["warning_threshold"] = self.warning_threshold
        if any(e.fired for e in events):
            self.warnings = 0
        return events


def _help(text: str) -> dict[str, str]:
    return {"help": text}


@dataclass
class FactMismatch:
    """The facts of the real observation depart from those the expected observation gives (a record the plan
    relied on was written under another key or value, or not at all): a precise mismatch where the env
    declares `facts`, which word overlap misses when one id in a JSON result differs."""

    severity: str = "error"
    name: str = "fact_mismatch"

    def __post_init__(self) -> None:
        _check_severity(self.severity)

    def check(self, ctx: PivotContext) -> PivotEvent | None:
        if ctx.facts is None or ctx.last.error:  # a failed step: the error rule's
            return None
        differences = fact_differences(*ctx.facts)
        if not differences:
            return None
        return PivotEvent(
            rule=self.name,
            severity=self.severity,
            evidence={"action": ctx.last.action_key, "differences": differences},
            message=f"{ctx.last.action_key!r}: {'; '.join(differences)}",
        )


@dataclass
class PredictedLoss:
    """The learned pivot: the outcome model says the step just taken loses, though the episode goes on (a mistake
    whose consequence comes later). Its threshold is the fitted judge's `loss_pivot`."""

    threshold: float = 0.5
    severity: str = "error"
    name: str = "predicted_loss"

    def __post_init__(self) -> None:
        _check_severity(self.severity)
        if not 0.0 <= self.threshold <= 1.0:
            raise ValueError(f"predicted_loss: threshold must be in [0, 1], got {self.threshold!r}")

    def check(self, ctx: PivotContext) -> PivotEvent | None:
        if ctx.outcome_probs is None or ctx.last.error:  # a failed step: the error rule's
            return None
        p_lost = ctx.outcome_probs.get("lost", 0.0)
        if p_lost <= self.threshold:
            return None
        return PivotEvent(
            rule=self.name,
            severity=self.severity,
            evidence={"action": ctx.last.action_key, "p_lost": round(p_lost, 6), "threshold": self.threshold},
            message=f"{ctx.last.action_key!r}: P(lost) {p_lost:.2f} > {self.threshold:.2f}",
        )


# The rules after which a step may be undone (PivotConfig.backtrack): the step changed the state, and not for the
# better or not as planned. A failed step (error_observation) changed nothing.
BACKTRACK_RULES = (
    "expectation_mismatch",
    "score_drop",
    "fact_mismatch",
    "repeated_action",
    "no_progress",
    "predicted_loss",
)
# The rules whose firing may ban the step just taken where it was taken (PivotConfig.ban_after): each speaks against
# the action itself (it failed, it loops, it lowered the score, it is predicted to lose), not against the plan.
BAN_AFTER_RULES = (ERROR_RULE, "repeated_action", "score_drop", "predicted_loss")
BAN_AFTER = [ERROR_RULE, "repeated_action", "predicted_loss"]  # the default (score_drop measured on and off)


@dataclass
class PivotConfig:
    """The pivot rules' settings: PlannerConfig's `pivot_rules` section (`--planner.pivot_rules.repeat_limit 4`)."""

    mismatch_threshold: float = field(
        default=0.75, metadata=_help("expectation_mismatch fires below this similarity (0..1)")
    )
    similarity: str = field(
        default="token_f1",
        metadata=_help(
            f"observation similarity: {', '.join(METHODS)} (embedding: cosine of the engine's mean-pooled hidden "
            "states, hf only; likelihood: the simulator's per-token probability of the real observation, scored "
            "after the step instead of generating the expected text; their scales differ from token F1's: set "
            "mismatch_threshold with them)"
        ),
    )
    cut_expectations: str = field(
        default="prefix",
        metadata=_help(
            "expectation_mismatch on a prediction cut by sampling.simulator_max_tokens: 'prefix' compares it with "
            "the real observation's first as many words, 'whole' with all of it (a long observation then misses "
            "however right its start was)"
        ),
    )
    embedding_adapter: str = field(
        default="", metadata=_help("similarity embedding: the model that embeds ('' the base model, or an adapter)")
    )
    repeat_limit: int = field(default=3, metadata=_help("repeated_action: same action / same pair this many times"))
    no_progress_steps: int = field(default=8, metadata=_help("no_progress: steps without a score increase"))
    min_score_drop: float = field(default=0.0, metadata=_help("score_drop: fires when the score falls more"))
    budget_fraction: float = field(default=0.9, metadata=_help("budget_nearly_exhausted: fraction of a budget"))
    warning_threshold: int = field(default=2, metadata=_help("warnings that together fire a pivot"))
    fact_mismatch: bool = field(
        default=False,
        metadata=_help(
            "fact_mismatch: compare the env's facts (envs/subgoals.py) of the expected and the real observation, "
            "where the env declares them"
        ),
    )
    predicted_loss: bool = field(
        default=False,
        metadata=_help(
            "predicted_loss, the learned pivot: the outcome model's P(lost) of each real step that did not end the "
            "episode, over the fitted judge's loss_pivot (outcome_judge.json beside the simulator; 0.5 unfitted); "
            "needs a simulator trained with outcome lines (simplan build --outcomes true)"
        ),
    )
    backtrack: list[str] = field(
        default_factory=list,
        metadata=_help(
            "rules after which the loop backtracks where the env knows the inverse of the step just taken "
            f"(EnvDefaults.inverse): plays it, bans the undone step in the state it restores, replans from there; "
            f"any of {', '.join(BACKTRACK_RULES)}; [] = never"
        ),
    )
    ban_after: list[str] = field(
        default_factory=lambda: list(BAN_AFTER),
        metadata=_help(
            "rules after which the step just taken is banned in the state it was taken in (not proposed there "
            f"again); any of {', '.join(BAN_AFTER_RULES)}; [] = never (a failure still writes its note)"
        ),
    )
    ban_where: str = field(
        default="observation",
        metadata=_help(
            "where a ban holds (an action banned after a pivot is not proposed there again): 'observation' the real "
            "state's text and valid actions; 'belief' what the env's facts told so far (the TWX location, exits and "
            "inventory) and the valid actions, so the same place under another description (after `read map`) "
            "keeps its bans; envs without facts: observation"
        ),
    )
    max_transient_retries: int = field(
        default=2,
        metadata=_help(
            "transient_error: retries of a call that failed transiently (the env's transient_patterns), "
            "without a model call; past them the failure is permanent"
        ),
    )

    def __post_init__(self) -> None:
        checks = [
            ("mismatch_threshold", 0.0 <= self.mismatch_threshold <= 1.0, "in [0, 1]"),
            ("repeat_limit", self.repeat_limit >= 2, ">= 2"),
            ("no_progress_steps", self.no_progress_steps >= 1, ">= 1"),
            ("min_score_drop", self.min_score_drop >= 0.0, ">= 0"),
            ("budget_fraction", 0.0 < self.budget_fraction <= 1.0, "in (0, 1]"),
            ("warning_threshold", self.warning_threshold >= 1, ">= 1"),
            ("max_transient_retries", self.max_transient_retries >= 0, ">= 0"),
        ]
        for name, ok, expected in checks:
            if not ok:
                raise ValueError(f"pivot_rules.{name}: must be {expected}, got {getattr(self, name)!r}")
        if unknown := sorted(set(self.backtrack) - set(BACKTRACK_RULES)):
            raise ValueError(
                f"pivot_rules.backtrack: {unknown} cannot be backtracked from; use any of "
                f"{', '.join(BACKTRACK_RULES)} (a failed step changed nothing to undo)"
            )
        if unknown := sorted(set(self.ban_after) - set(BAN_AFTER_RULES)):
            raise ValueError(
                f"pivot_rules.ban_after: {unknown} cannot ban the step; use any of {', '.join(BAN_AFTER_RULES)} "
                "(the other rules speak against the plan, not the action)"
            )
        if self.ban_where not in BAN_WHERE:
            raise ValueError(f"pivot_rules.ban_where: {self.ban_where!r} is not one of {', '.join(BAN_WHERE)}")
        if self.similarity not in METHODS:
            raise ValueError(f"pivot_rules.similarity: {self.similarity!r} is not one of {', '.join(METHODS)}")
        if self.cut_expectations not in CUT_EXPECTATIONS:
            raise ValueError(
                f"pivot_rules.cut_expectations: {self.cut_expectations!r} is not one of {', '.join(CUT_EXPECTATIONS)}"
            )


def default_rules(
    config: PivotConfig | None = None, error_patterns: Sequence[re.Pattern[str]] | None = None
) -> list[PivotRule]:
    """The six monitor rules (docs/architecture.md) with their default severities, set from `config`, and
    fact_mismatch where `config.fact_mismatch` asks for it."""
    c = config if config is not None else PivotConfig()
    rules: list[PivotRule] = [
        ErrorObservation(patterns=error_patterns),
        ExpectationMismatch(threshold=c.mismatch_threshold, method=c.similarity, cut_expectations=c.cut_expectations),
        RepeatedAction(limit=c.repeat_limit),
        NoProgress(steps=c.no_progress_steps),
        ScoreDrop(min_drop=c.min_score_drop),
        BudgetNearlyExhausted(fraction=c.budget_fraction),
    ]
    return rules + ([FactMismatch()] if c.fact_mismatch else [])
