"""Text matching has one definition (core/text.py): offline evaluation, traces and pivots count the same predictions
alike.

    .venv/bin/pytest -q tests/test_text.py
"""

from __future__ import annotations

import pytest

from simplan.core.text import exact, leading_words, normalize, similarity, token_f1
from simplan.evaluation.offline import simulator_metrics, simulator_verb_accuracy
from simplan.inference.planning.trace import ActEvent, EpisodeTrace, summarize

# (predicted, real): differences of case, spacing and punctuation, a reworded one, and two different ones.
PAIRS = [
    ("You see a Door.", "you see a  door."),
    ("The fridge is open.", "The fridge is open"),
    ("Simon says, 'slice olive'.", "Simon says, 'touch banana'."),
    ("You take the lime.", "You take the lime."),
    ("Nothing happens.", "That is already open."),
    ("", "You are in the kitchen."),
]


def test_normalize_and_exact() -> None:
    assert normalize("  You  SEE\ta door. ") == "you see a door."
    assert exact("You see a Door.", "you see a  door.")
    assert not exact("The fridge is open.", "The fridge is open")  # punctuation is content for exact
    assert not exact(None, "x") and exact(None, "")


def test_token_f1_counts_words_only() -> None:
    assert token_f1("Simon says, 'slice olive'.", "Simon says, 'touch banana'.") == pytest.approx(0.5)
    assert token_f1("The fridge is open.", "the fridge is open") == 1.0
    assert token_f1("", "") == 1.0 and token_f1("", "a") == 0.0
    assert token_f1("a a b", "a b b") == pytest.approx(2 / 3)  # multisets: 2 of 3 words shared each way


def test_leading_words_keeps_as_many_words_as_the_other_text() -> None:
    real = "You are in the kitchen.  In one part of the room you see a stove."
    assert leading_words(real, "You are in the kitch") == "You are in the kitchen"  # 5 words, white space collapsed
    assert leading_words(real, "you are in the kitchen. in one part of the room you see a stove, a fridge") == (
        "You are in the kitchen. In one part of the room you see a stove."  # fewer words than that: all of it
    )
    assert leading_words("Nothing happens.", "...") == "Nothing happens."  # no words to count: all of it


def test_similarity_is_the_pivots_rule() -> None:
    assert similarity("Room 2.", "room 2.") == 1.0
    assert similarity("...", "!!") == 0.0  # different texts without words are not alike
    assert similarity("", "x") == 0.0
    assert similarity("abcd", "abce", "ratio") == pytest.approx(0.75)
    with pytest.raises(ValueError, match="token_f1"):
        similarity("a", "b", "cosine")


def test_offline_and_online_simulator_accuracy_agree() -> None:
    """The same predictions scored offline (eval-model's metrics) and online (a trace's act events) give one
    accuracy, per row and per verb."""
    rows = [{"completion": real, "prompt": [{"role": "user", "content": "open door"}]} for _, real in PAIRS]
    preds = [p for p, _ in PAIRS]
    offline = simulator_metrics(preds, None, rows, error_texts=set())
    trace = EpisodeTrace.start(
        episode_id="e", env="toy", task={}, arm="simplan", config={}, budgets={}, goal="g", observation="o"
    )
    for i, (pred, real) in enumerate(PAIRS):
        trace.add(
            ActEvent(action="open door", action_key="open door", observation=real, expectation=pred, source="plan"),
            step=i + 1,
        )
    online = summarize(trace)
    assert online.sim_predictions == len(PAIRS)
    assert offline["exact"] == pytest.approx(online.sim_accuracy) == pytest.approx(2 / len(PAIRS))
    by_verb = simulator_verb_accuracy(preds, rows)
    assert by_verb.overall.n == len(PAIRS) and by_verb.overall.exact == online.sim_exact
    assert offline["token_f1"] == pytest.approx(sum(token_f1(p, r) for p, r in PAIRS) / len(PAIRS))
