"""Imagination with a simulator that predicts outcomes: class probabilities per candidate, and the fitted judge.

    probs = outcome_probabilities(engine.score([outcome_request(messages, "simulator")]))[0]
    judge = OutcomeJudge.for_adapter(simulator_adapter_dir)     # outcome_judge.json beside the adapter, or defaults
    judge.bad(probs), judge.value(logprob, probs)

A simulator built with `--outcomes true` opens every reply with an outcome line (data/format.py
`outcome_line`: error, no change, progress, won, lost). The planner asks for the five lines teacher-forced,
as prefixes of the reply (`ScoreRequest.complete = False`: no end-of-turn token after them), from the
prompt that asks for the candidate's observation, and reads the softmax of the five log-likelihoods as the
probability of each outcome. No text is generated for that; only the committed candidate's observation is
generated, as the expectation the pivots compare the real observation with.

The decision (`OutcomeJudge`): the decider's top action is taken unless its predicted probability of a bad
outcome (lost or error) exceeds `veto`; then the candidate of highest `value` among those at or under `veto`
is taken (the decider's next ranked actions are scored too, `imagination.widen_lost` rounds, when none is),
else the least bad. `value` is a linear function of the decider's log-probability of the action and the
outcome probabilities; `veto` and the weights are fitted on dev data by `simplan fit-judge`
(evaluation/judge_fit.py) and saved as outcome_judge.json beside the simulator adapter. Without that file
the defaults hold: veto 0.5 (a bad outcome more likely than not) and value = the decider's log-probability,
which keeps the decider's ranking among the candidates that are not vetoed.

The learned pivot (`pivot_rules.predicted_loss`, inference/planning/pivots.py `PredictedLoss`): the same outcome
probabilities of the real step just taken (from the state it was taken in); a step that did not end the episode
but whose P(lost) exceeds `loss_pivot` is called a mistake whose consequence comes later, and the loop pivots
(replans, bans the step there, backtracks where `pivot_rules.backtrack` names the rule). `loss_pivot` is fitted
with the veto, as the lowest threshold whose "lost" calls are right at the same precision; 0.5 unfitted.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from simplan.core.errors import InputError
from simplan.data.format import Messages, outcome_line
from simplan.data.outcomes import OUTCOMES
from simplan.inference.engines.base import ScoreRequest, ScoreResult, softmax

OUTCOME_JUDGE_FILE = "outcome_judge.json"
BAD = ("lost", "error")  # what the veto guards against
GOOD = ("progress", "won")  # what the fitted value learns to prefer (evaluation/judge_fit.py)
FEATURES = ("logprob", *(f"p_{o}" for o in OUTCOMES))


def outcome_request(messages: Messages, adapter: str | None, session: str | None = None) -> ScoreRequest:
    """The five outcome lines as prefixes of the simulator's reply to `messages`."""
    return ScoreRequest(
        candidates=[outcome_line(o) for o in OUTCOMES],
        adapter=adapter,
        messages=messages,
        tag="outcomes",
        complete=False,
        session=session,
    )


def outcome_probabilities(results: list[ScoreResult]) -> list[dict[str, float]]:
    """Each result's softmax over the outcome classes (OUTCOMES order); uniform where every logprob is -inf."""
    return [dict(zip(OUTCOMES, softmax(res.logprobs))) for res in results]


def features(logprob: float | None, probs: dict[str, float]) -> dict[str, float]:
    """The judge's inputs for one candidate: the decider's log-probability (0 where unknown) and the outcome
    probabilities."""
    return {"logprob": 0.0 if logprob is None else float(logprob), **{f"p_{o}": probs[o] for o in OUTCOMES}}


@dataclass
class OutcomeJudge:
    """Which candidate to take from outcome probabilities (module docstring). Fitted by `simplan fit-judge`."""

    veto: float = 0.5
    loss_pivot: float = 0.5  # P(lost) over which a real step is a predicted loss (the learned pivot)
    weights: dict[str, float] = field(default_factory=lambda: {"logprob": 1.0})
    bias: float = 0.0
    fitted: dict[str, Any] = field(default_factory=dict)  # how: data, precision target, dev metrics ({}: defaults)

    def __post_init__(self) -> None:
        for name in ("veto", "loss_pivot"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise InputError(f"outcome judge {name}: must be in [0, 1], got {getattr(self, name)!r}")
        unknown = sorted(set(self.weights) - set(FEATURES))
        if unknown:
            raise InputError(f"outcome judge weights: unknown features {unknown}; known: {', '.join(FEATURES)}")

    @staticmethod
    def bad(probs: dict[str, float]) -> float:
        """The predicted probability that the action loses the episode or fails."""
        return sum(probs[o] for o in BAD)

    def value(self, logprob: float | None, probs: dict[str, float]) -> float:
        x = features(logprob, probs)
        return self.bias + sum(w * x[name] for name, w in self.weights.items())

    def choose(self, logprobs: list[float | None], probs: list[dict[str, float]]) -> tuple[int, str]:
        """The index of the candidate to take (candidates in the decider's order) and why."""
        bad = [self.bad(p) for p in probs]
        if bad[0] <= self.veto:
            return 0, f"decider's top kept: P(lost or error) {bad[0]:.2f} <= veto {self.veto:.2f}"
        ok = [i for i in range(len(probs)) if bad[i] <= self.veto]
        if not ok:
            i = min(range(len(probs)), key=lambda k: (bad[k], k))
            return i, f"every candidate over the veto {self.veto:.2f}: the least bad ({bad[i]:.2f})"
        i = max(ok, key=lambda k: (self.value(logprobs[k], probs[k]), -k))
        return i, f"decider's top vetoed (P(lost or error) {bad[0]:.2f} > {self.veto:.2f}): took #{i + 1}"

    def write(self, path: str | Path) -> Path:
        from simplan.core.io import write_json

        write_json(path, asdict(self))
        return Path(path)

    @classmethod
    def read(cls, path: str | Path) -> OutcomeJudge:
        data = json.loads(Path(path).read_text())
        try:
            return cls(**data)
        except (TypeError, ValueError) as e:
            raise InputError(f"{path}: not an outcome judge ({e}); refit it with `simplan fit-judge`") from None

    @classmethod
    def for_adapter(cls, adapter_dir: str | Path | None) -> OutcomeJudge:
        """The judge fitted for a simulator adapter (its outcome_judge.json), else the defaults."""
        path = Path(adapter_dir) / OUTCOME_JUDGE_FILE if adapter_dir else None
        return cls.read(path) if path is not None and path.is_file() else cls()
