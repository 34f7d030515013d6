"""The loss classifier labels hand-made traces of each kind of lost episode."""

from __future__ import annotations

import pytest

from simplan.evaluation.losses import LOSS_CLASSES, LossRules, classify_loss
from simplan.inference.planning.trace import ActEvent, EndEvent, EpisodeTrace, ParseFailureEvent, PivotEvent


def episode(
    status: str,
    actions: list[str],
    observations: list[str] | None = None,
    last: dict | None = None,
    pivots: list[str] = (),
    parse_failures: int = 0,
    success: bool = False,
    error: str | None = None,
) -> EpisodeTrace:
    """A trace of `actions` (observation i defaults to "o{i}"); `last` overrides fields of the last act."""
    t = EpisodeTrace.start(
        "s/twx/sorting-1/simplan/0", "twx", {"task_id": "sorting-1", "family": "sorting"}, "simplan"
    )
    observations = observations or [f"o{i}" for i in range(len(actions))]
    for i, (a, o) in enumerate(zip(actions, observations), start=1):
        extra = last if (last and i == len(actions)) else {}
        t.add(ActEvent(**{"action": a, "observation": o, **extra}), step=i)
    for rule in pivots:
        t.add(PivotEvent(rule=rule, severity="warning"))
    for _ in range(parse_failures):
        t.add(ParseFailureEvent(role="decider", text="???", reason="not an action", handled="fallback"))
    t.add(EndEvent(status=status, success=success, steps=len(actions), error=error))
    return t


def test_a_won_or_unfinished_episode_has_no_loss() -> None:
    assert classify_loss(episode("success", ["a"], last={"done": True, "won": True}, success=True)) is None
    unfinished = EpisodeTrace.start("s/toy/c/plan/0", "toy", {"task_id": "c"}, "plan")
    assert classify_loss(unfinished) is None


def test_irreversible_wrong_action() -> None:
    # TWX sorting: putting the wrong item in the box ends the game with score -1
    t = episode("failed", ["take 3", "put 3 in box"], last={"done": True, "won": False, "score": -1.0})
    loss = classify_loss(t)
    assert (loss.label, loss.arm, loss.family) == ("irreversible", "simplan", "sorting")
    assert "step 2 'put 3 in box' ended the game unwon (score -1)" == loss.evidence


def test_loop_from_repeated_steps_at_the_step_cap() -> None:
    # 6 steps, the same (action, observation) pair: 5 repeat the first
    t = episode("budget_steps", ["go east"] * 6, ["wall"] * 6)
    loss = classify_loss(t)
    assert loss.label == "loop" and loss.evidence.startswith("5 of 6 steps repeat")


def test_loop_from_no_progress_pivots() -> None:
    # new observations each step (no repeats), but 3 of 4 pivot events are loop rules
    t = episode("budget_steps", ["a", "b", "c", "d"], pivots=["no_progress", "repeated_action", "no_progress", "x"])
    loss = classify_loss(t)
    assert loss.label == "loop" and loss.evidence == "3 of 4 pivot events are repeated_action / no_progress"
    # 1 of 4 is not a majority: the step cap
    t = episode("budget_steps", ["a", "b", "c", "d"], pivots=["no_progress", "x", "y", "z"])
    assert classify_loss(t).label == "step_cap"


def test_step_cap_with_new_moves() -> None:
    # 4 steps, only the last repeats an earlier pair (1/4 < 1/2)
    t = episode("budget_steps", ["a", "b", "c", "a"], ["o", "p", "q", "o"])
    assert classify_loss(t).label == "step_cap"


def test_parse_failures_outrank_the_loop_they_cause() -> None:
    # the decider was unparseable 3 times in 4 steps; its fallback "look" repeats
    t = episode("budget_steps", ["look"] * 4, ["room"] * 4, parse_failures=3)
    loss = classify_loss(t)
    assert loss.label == "parse_failures" and loss.evidence == "3 decider parse failure(s) in 4 step(s)"
    # one failure in 4 steps is not a large share: the loop stands
    assert classify_loss(episode("budget_steps", ["look"] * 4, ["room"] * 4, parse_failures=1)).label == "loop"


def test_env_error_and_budgets() -> None:
    t = episode("errored", ["a"], error="EnvStuck: step timed out\ntraceback ...")
    loss = classify_loss(t)
    assert loss.label == "env_error" and loss.evidence == "errored: EnvStuck: step timed out"
    assert classify_loss(episode("budget_time", ["a", "b"])).label == "budget"
    assert classify_loss(episode("budget_tokens", ["a", "b"])).evidence == "budget_tokens"
    assert classify_loss(episode("failed", ["a"])).label == "other"


def test_every_class_is_reachable_and_rules_are_checked() -> None:
    labels = {
        classify_loss(t).label
        for t in (
            episode("errored", ["a"]),
            episode("failed", ["a"], last={"done": True}),
            episode("budget_steps", ["a"] * 2, ["o"] * 2),
            episode("budget_steps", ["a", "b"]),
            episode("budget_steps", ["a"], parse_failures=1),
            episode("budget_time", ["a"]),
            episode("failed", []),
        )
    }
    assert labels == set(LOSS_CLASSES)
    with pytest.raises(ValueError, match="LossRules.loop_share"):
        LossRules(loop_share=0.0)
