"""One failure rule (envs/failures.py): training data, the planner and evaluation metrics class a failure alike.

.venv/bin/pytest -q tests/test_failures.py
"""

from __future__ import annotations

import re

import pytest

from simplan.data.episode import EpisodeState
from simplan.data.trajectory import Step, Trajectory
from simplan.envs.base import Action, Task
from simplan.envs.failures import DEFAULT_ERROR_PATTERNS, FailureRules, compile_patterns
from simplan.evaluation.metrics import is_transient
from simplan.inference.planning.pivots import StepRecord, TransientError
from simplan.inference.planning.trace import ActEvent

RULES = FailureRules.for_env(None, transient=[r"\b503\b"], replan=[r"sold out"])
# (observation, flagged by the env, class)
CASES = [
    ('{"error": "503 Service Unavailable"}', True, "transient"),
    ("ERROR 503, try again", False, "transient"),  # reads like an error: a failure though unflagged
    ('{"error": "kettle sold out"}', True, "replan"),
    ("You can't do that.", False, "permanent"),
    ("gone", True, "permanent"),
    ("You take the key.", False, None),
    ("503 items in stock", False, None),  # a transient word in a text that is no failure
]


@pytest.mark.parametrize("text, flagged, cls", CASES)
def test_failure_class(text: str, flagged: bool, cls: str | None) -> None:
    assert RULES.failure_class(text, flagged) == cls
    assert RULES.failed(text, flagged) == (cls is not None)


def test_every_reader_uses_the_rule() -> None:
    """The planner's retry rule, the metrics' transient count and the training prompts' failure memory agree on
    every flagged step (the planner and the data mark failures the env flags)."""
    retry = TransientError(RULES, max_retries=2)
    for text, flagged, cls in CASES:
        if not flagged:
            continue
        transient = cls == "transient"
        assert retry.is_transient(StepRecord("a", text, 0.0, flagged)) == transient
        assert is_transient(ActEvent(action="a", observation=text, error=flagged), RULES) == transient
        step = Step(0, "start", Action.command("a"), text, error=flagged)
        traj = Trajectory("t", "toy", Task("toy", "t1", "train"), "goal", "expert", "start", [step])
        (turn, _) = EpisodeState.from_trajectory(traj, failures=RULES).turns
        assert (turn.failure == "transient") == transient


def test_env_patterns_replace_the_defaults_and_are_case_insensitive() -> None:
    class Env:
        error_patterns = (r"^nope\b",)
        transient_patterns = (r"busy",)

    rules = FailureRules.for_env(Env, error=[r"\bbroken\b"])
    assert rules.is_error("NOPE, not here") and rules.is_error("it is broken")
    assert not rules.is_error("You can't do that.")  # the env's own patterns replace the defaults
    assert rules.failure_class("nope: BUSY") == "transient"
    assert FailureRules().error and len(FailureRules().error) == len(DEFAULT_ERROR_PATTERNS)
    with pytest.raises(ValueError, match="not a valid regular expression"):
        compile_patterns(["("])
    assert isinstance(rules.error[0], re.Pattern)
