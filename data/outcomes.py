"""What one real transition led to, as one of five outcome classes.

    from simplan.data.outcomes import classify_outcome, score_change
    from simplan.envs.failures import rules_of_env
    classify_outcome(False, "You take the key.", 0.0, 0.5, done=False, won=False, rules=rules_of_env("toy"))
    # "progress"

The classes, first match wins (`OUTCOMES` lists them):

    won        the episode ended (`done`) and the env said it was won
    lost       the episode ended and was not won: an irreversible wrong action (TWX sorting's wrong item
               in the box, a wrong answer), or a `finish` before the goal was met
    error      the action failed: the env flagged it, or its observation reads like a failure by the env's
               one failure rule (`envs.failures.FailureRules.failed`)
    progress   the score went up (`score_change` > 0)
    no_change  anything else: the score stayed (or fell) and the episode goes on; a valid move that
               changed the world without scoring is here too

An ending outranks a failure: a step that ends the episode says what the episode came to, whatever its text.
Counterfactual collection (data/counterfactual.py) labels each alternative it plays with its class.
"""

from __future__ import annotations

from simplan.envs.failures import FailureRules

OUTCOMES: tuple[str, ...] = ("error", "no_change", "progress", "won", "lost")


def score_change(score_before: float, score_after: float) -> float:
    """How much a transition raised the running score (negative when it fell)."""
    return float(score_after) - float(score_before)


def classify_outcome(
    flagged_error: bool,
    next_observation: str,
    score_before: float,
    score_after: float,
    done: bool,
    won: bool,
    rules: FailureRules,
) -> str:
    """The outcome class (one of `OUTCOMES`) of one real transition; precedence as in the module docstring."""
    if done:
        return "won" if won else "lost"
    if rules.failed(next_observation, flagged_error):
        return "error"
    if score_change(score_before, score_after) > 0:
        return "progress"
    return "no_change"
