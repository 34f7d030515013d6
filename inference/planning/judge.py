"""Judge imagined rollouts with explicit, logged score parts; detect error-like observations.

Used by the planner (inference/planning/planner.py) after imagination and by the ErrorObservation pivot
rule. No model is involved: every part is a rule over the predicted texts and the episode's
memory, so a trace shows exactly why a plan won.

    judge = Judge(JudgeWeights(), FailureRules.for_env(env))
    parts, total = judge.score(rollout_actions, predicted_obs, memory)

Score parts (each already multiplied by its weight; the total is their sum). A rollout is scored up
to its first predicted failure after the first action: the planner never commits that follow-up
(planner._commit cuts it), so it does not count against the first action.
    error       the first action's predicted outcome is an error/invalid action
    progress    predicted progress/reward words, discounted by depth
    repeat      steps whose (action, predicted observation) repeats a real pair of the episode or an
                earlier step of the same rollout
    failed      actions in the failure memory (down-weighted, not banned); a transient failure is not one,
                so retrying it costs nothing
    premature   a finish whose imagined outcome is "goal not met": the env's verdict (`accepts()`) for a
                finish from the real state, else the predicted observation against the env's
                `accept_patterns`; no verdict (neither declared): not judged.
    length      per scored step (a small cost that prefers shorter plans at equal merit)
    likelihood  the decider's probability of the first action (0..1)
    won, lost   only where the env's verdict on a predicted step is known (`Outcome`: from the env oracle, or
                from a learned simulator trained with verdicts, whose reply ends "[episode over: won|lost]"): the
                first action predicted to end the episode unwon (lost), a step predicted to win (won, discounted
                by depth). The rollout is scored up to that step (nothing after an ended episode is real); an
                imagined follow-up that loses is cut there, like one that fails, not held against the first
                action (the planner commits the plan only up to it). A step whose reward is positive counts
                as progress even when its text names none. Texts-only predictions (a learned
                simulator without verdicts) have none: these parts are absent and the score is what the texts give.

Simulator confidence (`confidence`, weight `JudgeWeights.confidence`, 0 by default): the parts a predicted
observation decides (error, progress, and premature when judged from the prediction) shrink toward 0 as
the simulator's confidence in it falls: they are multiplied by 1 - w * (1 - exp(mean token logprob)), the
geometric mean probability of the prediction's tokens. A confident prediction counts fully; an unsure one
counts (1 - w) at the least. A step without a confidence (not simulated, the env oracle, a backend without
logprobs) counts fully.

Failure classes (`Judge.failure_class`, the one rule of envs/failures.py): a failed observation is transient
(`transient_patterns`: retry the same call), replan (`replan_patterns`: the world changed under the plan)
or permanent (anything else).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from simplan.core.text import normalize
from simplan.data.format import episode_verdict
from simplan.envs.base import StepResult
from simplan.envs.failures import DEFAULT_PROGRESS_PATTERNS, FailureRules, compile_patterns, mentions_progress


def _help(text: str) -> dict[str, str]:
    return {"help": text}


@dataclass
class JudgeWeights:
    """The judge's weights and threshold: PlannerConfig's `judge` section (`--planner.judge.error -3`)."""

    error: float = field(default=-2.0, metadata=_help("weight of a predicted error/invalid outcome of the 1st action"))
    progress: float = field(default=1.0, metadata=_help("weight of predicted progress/reward, discounted by depth"))
    repeat: float = field(default=-0.5, metadata=_help("weight of repeats of seen (action, observation) pairs"))
    failed: float = field(default=-1.0, metadata=_help("weight of actions in the failure memory"))
    length: float = field(default=-0.05, metadata=_help("weight per imagined step"))
    likelihood: float = field(default=0.5, metadata=_help("weight of the decider's probability of the 1st action"))
    premature: float = field(
        default=-2.0, metadata=_help("weight of a finish whose imagined outcome is 'goal not met'")
    )
    lost: float = field(
        default=-10.0,
        metadata=_help(
            "weight (<= 0) of a predicted step the env says ends the episode unwon (env oracle or verdicts); "
            "large, so it outweighs progress and likelihood"
        ),
    )
    won: float = field(default=10.0, metadata=_help("weight (>= 0) of a predicted step the env says wins"))
    discount: float = field(default=0.9, metadata=_help("imagined step i counts discount**i"))
    confidence: float = field(
        default=0.0,
        metadata=_help(
            "0..1: how far a predicted outcome's parts shrink toward 0 as the simulator's confidence in it "
            "(geometric mean token probability) falls; 0 = predictions count whatever their confidence"
        ),
    )
    threshold: float = field(
        default=-1.0, metadata=_help("below this total only the plan's first action is committed")
    )

    def __post_init__(self) -> None:
        checks = [
            ("discount", 0.0 < self.discount <= 1.0, "in (0, 1]"),
            ("confidence", 0.0 <= self.confidence <= 1.0, "in [0, 1]"),
            ("lost", self.lost <= 0.0, "<= 0 (a penalty)"),
            ("won", self.won >= 0.0, ">= 0 (a bonus)"),
        ]
        for name, ok, expected in checks:
            if not ok:
                raise ValueError(f"judge.{name}: must be {expected}, got {getattr(self, name)!r}")


@dataclass(frozen=True)
class Outcome:
    """The env's verdict on a predicted step: the env oracle knows it; a learned simulator trained with verdicts
    predicts done and won (its reward and score are unknown: 0)."""

    done: bool = False
    won: bool = False
    reward: float = 0.0
    score: float = 0.0

    @classmethod
    def of(cls, result: StepResult) -> Outcome:
        return cls(done=result.done, won=result.won, reward=result.reward, score=result.score)

    @property
    def lost(self) -> bool:
        return self.done and not self.won

    @property
    def verdict(self) -> str | None:
        """'won' / 'lost' for a step that ends the episode, None when it goes on (data/format.py episode_verdict)."""
        return episode_verdict(self.done, self.won)

    def label(self) -> str:
        """One short line for traces: 'won' / 'lost' / 'on' (the episode goes on), the score and the reward."""
        return f"{self.verdict or 'on'} score={self.score:g} reward={self.reward:+g}"


@dataclass
class JudgeMemory:
    """What the judge knows of the real episode: seen (action key, normalized observation) pairs, failed actions."""

    seen_pairs: set[tuple[str, str]] = field(default_factory=set)
    failed_actions: set[str] = field(default_factory=set)  # permanent and replan failures: down-weighted
    failure_classes: dict[str, str] = field(default_factory=dict)  # action key -> class of its latest failure


FINISH_KEY = "finish"


def is_finish(action_key: str) -> bool:
    """True for the key of a finish: `Action(kind="finish")` or a tool env's `finish(...)` tool call."""
    return action_key == FINISH_KEY or action_key.startswith(FINISH_KEY + "(")


def trust(mean_logprob: float | None, weight: float) -> float:
    """The factor of a predicted outcome's parts: 1 - weight * (1 - geometric mean token probability); 1 when
    the confidence is unknown or the weight is 0."""
    if mean_logprob is None or weight <= 0.0:
        return 1.0
    return 1.0 - weight * (1.0 - math.exp(min(0.0, mean_logprob)))


class Judge:
    """Scores rollouts (module docstring). `rules`: what counts as a failure and of which class (envs/failures.py)."""

    def __init__(
        self,
        weights: JudgeWeights,
        rules: FailureRules | None = None,
        progress_patterns: Sequence[str] = DEFAULT_PROGRESS_PATTERNS,
        accept_patterns: Sequence[str] = (),
    ) -> None:
        self.w = weights
        self.rules = rules if rules is not None else FailureRules()
        self.progress_re = compile_patterns(progress_patterns)
        self.accept_re = compile_patterns(accept_patterns)

    def is_error(self, text: str | None) -> bool:
        return self.rules.is_error(text)

    def failure_class(self, text: str, flagged: bool = False) -> str | None:
        """The class of an observation (envs/failures.py), None when it is no failure. `flagged`: the env set
        `Observation.error`."""
        return self.rules.failure_class(text, flagged)

    def goal_met(self, predicted: str | None) -> bool | None:
        """The verdict a predicted observation after a finish gives: None when the env declares no
        `accept_patterns` or nothing was predicted."""
        if not self.accept_re or predicted is None:
            return None
        return any(p.search(predicted) for p in self.accept_re)

    def reads_predictions(self, first_keys: Sequence[str]) -> bool:
        """Whether the score of a one-step rollout of these first actions depends on its predicted observation (a
        text without verdicts): a part read from the text (error, progress, repeat) weighs something, or a finish is
        among them and `premature` weighs something. When it does not, only the committed candidate's observation
        is worth imagining (imagination.py): the others' cannot change the choice."""
        w = self.w
        return bool(w.error or w.progress or w.repeat) or (bool(w.premature) and any(map(is_finish, first_keys)))

    def score(
        self,
        action_keys: Sequence[str],
        predicted: Sequence[str | None],
        memory: JudgeMemory,
        probability: float | None = None,
        finish_verdict: bool | None = None,
        confidence: Sequence[float | None] | None = None,
        outcomes: Sequence[Outcome | None] | None = None,
    ) -> tuple[dict[str, float], float]:
        """(weighted parts, total) of one rollout: action keys and the predicted observation after each.

        `predicted[i]` is None when step i was not simulated (reactive or adaptive-horizon choices).
        `finish_verdict`: whether the goal is met in the real state (the env's `accepts()`), the verdict on
        a finish as the first action; None: from the prediction. `confidence[i]`: the simulator's mean token
        logprob of `predicted[i]` (None: unknown), weighed by `JudgeWeights.confidence`. `outcomes[i]`: the env's
        verdict on step i (None: unknown); the parts won and lost appear only when some verdict is known.
        """
        w = self.w
        error = progress = repeat = failed = premature = won = lost = 0.0
        seen_in_rollout: set[tuple[str, str | None]] = set()
        steps = 0
        for depth, key in enumerate(action_keys):
            d = w.discount**depth
            obs = predicted[depth] if depth < len(predicted) else None
            conf = confidence[depth] if confidence is not None and depth < len(confidence) else None
            t = trust(conf, w.confidence)  # how much this step's predicted outcome counts
            out = outcomes[depth] if outcomes is not None and depth < len(outcomes) else None
            if depth > 0 and obs is not None and self.is_error(obs):
                break  # an imagined follow-up that fails is cut, not held against the first action
            if depth > 0 and out is not None and out.lost:
                break  # so is one that loses the game: the planner commits the plan only up to it
            steps += 1
            if key in memory.failed_actions and memory.failure_classes.get(key) != "transient":
                failed += d
            if is_finish(key):
                real = depth == 0 and finish_verdict is not None
                met = finish_verdict if real else self.goal_met(obs)
                premature += (d if real else d * t) if met is False else 0.0
            # A repeat is the same action with the same outcome (walking on down a corridor is not one).
            pair = (key, normalize(obs) if obs is not None else None)
            if pair in seen_in_rollout or (obs is not None and pair in memory.seen_pairs):
                repeat += d
            seen_in_rollout.add(pair)
            if out is not None and out.done:
                won += d if out.won else 0.0
                lost += d if out.lost else 0.0
            if obs is not None:
                if self.is_error(obs):
                    error += d * t
                    break  # the rollout's remaining steps are conditioned on a failure
                if mentions_progress(obs, self.progress_re) or (out is not None and out.reward > 0):
                    progress += d * t
            if out is not None and out.done:
                break  # the env's episode ended here: any later step is "the episode is over", not real
        parts = {
            "error": w.error * error,
            "progress": w.progress * progress,
            "repeat": w.repeat * repeat,
            "failed": w.failed * failed,
            "premature": w.premature * premature,
            "length": w.length * steps,
            "likelihood": w.likelihood * (probability if probability is not None else 0.0),
        }
        if outcomes is not None and any(o is not None for o in outcomes):
            parts |= {"won": w.won * won, "lost": w.lost * lost}
        parts = {k: round(v, 6) for k, v in parts.items()}
        return parts, round(sum(parts.values()), 6)
