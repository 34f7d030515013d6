"""Pivot rules fire on their case and not on a near miss; the monitor's delayed trigger; the judge's classifier."""

from __future__ import annotations

import pytest

from simplan.core.text import similarity
from simplan.envs.failures import compile_patterns, looks_like_error
from simplan.inference.planning.judge import Judge, JudgeMemory, JudgeWeights
from simplan.inference.planning.pivots import (
    BudgetNearlyExhausted,
    ErrorObservation,
    ExpectationMismatch,
    NoProgress,
    PivotConfig,
    PivotContext,
    PivotMonitor,
    RepeatedAction,
    ScoreDrop,
    StepRecord,
    default_rules,
    observation_similarity,
)


def rec(action: str = "look", obs: str = "You are in room 1 of 4.", score: float = 0.0, error: bool = False):
    return StepRecord(action, obs, score, error)


def ctx(history, **kw) -> PivotContext:
    kw.setdefault("since_replan", len(history))
    return PivotContext(history=list(history), **kw)


# -- similarity ------------------------------------------------------------------------------------
def test_similarity_token_f1_hand_values():
    assert similarity("You are in room 2 of 4.", "you are in room 2 of 4.") == 1.0  # case and spacing only
    # 7 words each (punctuation does not count), 6 in common -> P = R = F1 = 6/7
    assert similarity("You are in room 2 of 4.", "You are in room 3 of 4.") == pytest.approx(6 / 7)
    # 4 words against 5 (you, can, t, do, that), 1 in common
    assert similarity("You take the key.", "You can't do that.") == pytest.approx(
        2 * (1 / 4) * (1 / 5) / (1 / 4 + 1 / 5)
    )
    # the shared comma, quotes and period of a short instruction do not make two instructions alike
    assert similarity("Simon says, 'touch banana'.", "Simon says, 'slice olive'.") == pytest.approx(0.5)
    assert similarity("...", "!") == 0.0  # different texts without a word
    assert similarity("", "") == 1.0 and similarity("", "x") == 0.0
    assert similarity("abc", "abd", method="ratio") == pytest.approx(2 / 3)
    with pytest.raises(ValueError, match="similarity method"):
        similarity("a", "b", method="cosine")


# -- rules -----------------------------------------------------------------------------------------
def test_error_observation_fires_on_env_flag_and_error_text_not_on_near_miss():
    rule = ErrorObservation()
    flagged = rule.check(ctx([rec("open door", "The door is locked.", error=True)]))
    assert flagged is not None and flagged.severity == "error" and flagged.evidence["env_error"] is True
    by_text = rule.check(ctx([rec("jump", "You can't do that.")]))
    assert by_text is not None and "reads like an error" in by_text.message
    assert rule.check(ctx([rec("go east", "There is a locked door here.")])) is None  # mentions a lock, no error
    assert rule.check(ctx([rec("inventory", "You carry nothing.")])) is None


def test_error_observation_uses_env_patterns():
    rule = ErrorObservation(patterns=compile_patterns([r"^ERR\b"]))
    assert rule.check(ctx([rec("x", "ERR 42: bad tool")])) is not None
    assert rule.check(ctx([rec("x", "You can't do that.")])) is None  # only the env's own patterns count


def test_an_expectation_cut_at_its_token_limit_is_compared_with_the_start_of_the_observation():
    real = "You are in the kitchen. In one part of the room you see a stove. There is also an oven."
    cut = "You are in the kitchen. In one part of the"  # what a simulator stopped by its token limit says
    seen = ctx([rec("go north", real)], expectation=cut, expectation_cut=True)
    assert ExpectationMismatch(threshold=0.75).check(seen) is None  # its 10 words are the observation's first 10
    whole = ExpectationMismatch(threshold=0.75, cut_expectations="whole").check(seen)  # 10 of 19 words: F1 0.69
    assert whole is not None and whole.evidence["expectation_cut"] and whole.evidence["compared"] == real
    assert "(cut at its token limit)" in whole.message
    # cut or not, a start that departs from the observation's is a mismatch
    bathroom = "You are in the bathroom. You see a bath mat"
    wrong = ctx([rec("go north", real)], expectation=bathroom, expectation_cut=True)
    e = ExpectationMismatch(threshold=0.75).check(wrong)
    assert e is not None and e.evidence["compared"] == "You are in the kitchen. In one part of the"
    # an uncut prediction is compared with the whole observation, and its evidence reads as before
    short = ExpectationMismatch(threshold=0.75).check(ctx([rec("go north", real)], expectation=cut))
    assert short is not None and "compared" not in short.evidence and "expectation_cut" not in short.evidence
    with pytest.raises(ValueError, match="cut_expectations"):
        PivotConfig(cut_expectations="half")


def test_expectation_mismatch_threshold_and_near_miss():
    rule = ExpectationMismatch(threshold=0.75)
    e = rule.check(ctx([rec("take key", "You can't do that.")], expectation="You take the key."))
    assert e is not None and e.fired is False and e.severity == "error"
    assert e.evidence["expected"] == "You take the key." and e.evidence["observed"] == "You can't do that."
    assert e.evidence["similarity"] < 0.75
    # near miss: same words, different case/punctuation spacing -> similarity 1
    assert rule.check(ctx([rec("go east", "you are in room 2 of 4 .")], expectation="You are in room 2 of 4.")) is None
    # 6/7 = 0.857 >= 0.75 does not fire; with a stricter threshold it does
    near = ctx([rec("go east", "You are in room 3 of 4.")], expectation="You are in room 2 of 4.")
    assert rule.check(near) is None
    assert ExpectationMismatch(threshold=0.9).check(near) is not None
    assert rule.check(ctx([rec()], expectation=None)) is None  # nothing predicted, nothing to compare
    # a different instruction in the same frame is a mismatch (a committed simonsays plan went on past it)
    simon = ctx([rec("touch cucumber", "Simon says, 'slice olive'.")], expectation="Simon says, 'touch banana'.")
    assert rule.check(simon) is not None


def test_the_likelihood_mismatch_reads_the_simulators_score_of_the_observation_and_no_text():
    rule = ExpectationMismatch(threshold=0.5, method="likelihood")
    step = [rec("take key", "You can't do that.")]
    e = rule.check(ctx(step, likelihood=0.2))
    assert e is not None and e.evidence["similarity"] == 0.2 and e.evidence["method"] == "likelihood"
    assert "expected" not in e.evidence  # nothing was predicted; with a text, the evidence shows it
    with_text = rule.check(ctx(step, likelihood=0.2, expectation="You take the key."))
    assert with_text is not None and with_text.evidence["expected"] == "You take the key."
    assert rule.check(ctx(step, likelihood=0.5)) is None  # at the threshold: not surprised
    assert rule.check(ctx(step, likelihood=None, expectation="Something else entirely.")) is None  # not scored
    # the text methods do not read it
    same = ctx(step, likelihood=0.0, expectation="You can't do that.")
    assert ExpectationMismatch(threshold=0.75).check(same) is None
    assert PivotConfig(similarity="likelihood").similarity == "likelihood"
    with pytest.raises(ValueError, match="likelihood"):
        observation_similarity("a", "b", "likelihood")


def test_repeated_action_in_a_row_and_same_pair():
    rule = RepeatedAction(limit=3)
    three = [rec("look", f"obs {i}") for i in range(3)]
    e = rule.check(ctx(three))
    assert e is not None and e.evidence["consecutive"] == 3 and e.severity == "warning"
    assert rule.check(ctx(three[:2])) is None  # near miss: twice
    # since the last replan only two of the three count in a row
    assert rule.check(ctx(three, since_replan=2)) is None
    # the same (action, observation) three times, not in a row
    pair = [rec("go east", "Room A"), rec("go west", "Room B"), rec("go east", "Room A"), rec("look", "Room A")]
    pair += [rec("go east", "Room A")]
    e = rule.check(ctx(pair))
    assert e is not None and e.evidence["same_pair"] == 3 and e.evidence["consecutive"] == 1
    assert rule.check(ctx(pair[:3])) is None  # near miss: the pair twice


def test_no_progress_window():
    rule = NoProgress(steps=3)
    flat = [rec(score=0.5), rec(score=0.5), rec(score=0.5), rec(score=0.5)]
    e = rule.check(ctx(flat))
    assert e is not None and e.evidence["best_in_window"] == 0.5
    assert rule.check(ctx(flat[:3] + [rec(score=1.0)])) is None  # near miss: progress on the last step
    assert rule.check(ctx(flat, since_replan=2)) is None  # a replan restarts the window
    assert rule.check(ctx([rec(score=0.0), rec(score=0.0)])) is None  # too few steps


def test_score_drop():
    rule = ScoreDrop()
    e = rule.check(ctx([rec(score=0.5), rec(score=0.0)], score_before=0.5))
    assert e is not None and e.evidence["drop"] == 0.5
    assert rule.check(ctx([rec(score=0.5), rec(score=0.5)], score_before=0.5)) is None
    assert ScoreDrop(min_drop=0.2).check(ctx([rec(score=0.3)], score_before=0.5)) is None  # drop 0.2 is not > 0.2


def test_budget_nearly_exhausted_fires_once_when_crossed():
    rule = BudgetNearlyExhausted(fraction=0.9)
    assert rule.check(ctx([rec()] * 9, max_steps=10)) is not None
    assert rule.check(ctx([rec()] * 8, max_steps=10)) is None
    assert rule.check(ctx([rec()] * 10, max_steps=10)) is None  # crossed already one step earlier
    tok = rule.check(ctx([rec()], tokens_before=80, tokens_used=95, max_tokens=100))
    assert tok is not None and "tokens 95/100" in tok.message
    assert rule.check(ctx([rec()], tokens_before=91, tokens_used=95, max_tokens=100)) is None
    assert rule.check(ctx([rec()] * 9, max_steps=0)) is None  # no limit


def test_rule_validation():
    with pytest.raises(ValueError, match="severity"):
        ErrorObservation(severity="fatal")
    with pytest.raises(ValueError, match="threshold"):
        ExpectationMismatch(threshold=1.5)
    with pytest.raises(ValueError, match="limit"):
        RepeatedAction(limit=1)
    with pytest.raises(ValueError, match="distinct names"):
        PivotMonitor([NoProgress(), NoProgress()])


# -- monitor ---------------------------------------------------------------------------------------
def test_monitor_delays_warnings_and_fires_errors_at_once():
    monitor = PivotMonitor([RepeatedAction(limit=2), ExpectationMismatch()], warning_threshold=2)
    h = [rec("look", "a"), rec("look", "b")]
    first = monitor.check(ctx(h))
    assert [(e.rule, e.fired) for e in first] == [("repeated_action", False)]
    assert first[0].evidence["warnings_counted"] == 1
    h.append(rec("look", "c"))
    second = monitor.check(ctx(h))
    assert [(e.rule, e.fired) for e in second] == [("repeated_action", True)]
    assert monitor.warnings == 0  # a fired pivot resets the count
    h.append(rec("go east", "room 2"))
    err = monitor.check(ctx(h, expectation="You can't do that."))
    assert [(e.rule, e.severity, e.fired) for e in err] == [("expectation_mismatch", "error", True)]


def test_monitor_reset_clears_counted_warnings():
    monitor = PivotMonitor([RepeatedAction(limit=2)], warning_threshold=2)
    monitor.check(ctx([rec("look", "a"), rec("look", "b")]))
    assert monitor.warnings == 1
    monitor.reset()
    again = monitor.check(ctx([rec("look", "a"), rec("look", "b")]))
    assert not again[0].fired


def test_default_rules_cover_the_design():
    names = [r.name for r in default_rules()]
    assert names == [
        "error_observation",
        "expectation_mismatch",
        "repeated_action",
        "no_progress",
        "score_drop",
        "budget_nearly_exhausted",
    ]


# -- judge -----------------------------------------------------------------------------------------
def test_looks_like_error_defaults():
    assert looks_like_error("You can't do that.")
    assert looks_like_error("The door is locked. You need a key.")
    assert looks_like_error("Unknown command: fly")
    assert not looks_like_error("You are in room 4 of 4. There is a locked door here.")
    assert not looks_like_error("You take the key.")


def test_a_judge_reads_predictions_only_through_its_text_parts_or_a_judged_finish():
    off = JudgeWeights(error=0.0, progress=0.0, repeat=0.0)
    assert not Judge(off).reads_predictions(["look", "take key"])  # failed, length, likelihood: no text
    assert Judge(off).reads_predictions(["look", "finish()"])  # premature: a finish judged from its prediction
    assert not Judge(JudgeWeights(error=0.0, progress=0.0, repeat=0.0, premature=0.0)).reads_predictions(["finish()"])
    for part in ("error", "progress", "repeat"):
        assert Judge(JudgeWeights(**{"error": 0.0, "progress": 0.0, "repeat": 0.0, part: -0.1})).reads_predictions(
            ["look"]
        )
    memory = JudgeMemory(seen_pairs={("look", "you are in room 1 of 4.")}, failed_actions={"look"})
    for predicted in ([], ["You are in room 1 of 4."], ["You can't do that."]):  # what is not read scores the same
        assert Judge(off).score(["look"], predicted, memory, probability=0.3) == Judge(off).score(
            ["look"], [], memory, probability=0.3
        )


def test_judge_parts_by_hand():
    judge = Judge(
        JudgeWeights(error=-2, progress=1, repeat=-0.5, failed=-1, length=-0.1, likelihood=0.5, discount=0.5)
    )
    memory = JudgeMemory(seen_pairs={("look", "you are in room 1 of 4.")}, failed_actions={"jump"})
    parts, total = judge.score(
        ["look", "take key", "look"],
        ["You are in room 1 of 4.", "You take the key.", "You are in room 1 of 4."],
        memory,
        probability=0.8,
    )
    # look: seen pair (repeat 1); take key: progress 0.5; the same look outcome again in the rollout: repeat 0.25
    assert parts == {
        "error": 0.0,
        "progress": 0.5,
        "repeat": -0.5 * 1.25,
        "failed": 0.0,
        "premature": 0.0,
        "length": -0.3,
        "likelihood": 0.4,
    }
    assert total == pytest.approx(0.5 - 0.625 - 0.3 + 0.4)
    # the same action with a new outcome is progress along the way, not a repeat
    parts, _ = judge.score(["go east", "go east"], ["Room 2.", "Room 3."], memory)
    assert parts["repeat"] == 0.0
    # a failing first action is penalised; a failing follow-up is cut instead
    parts, _ = judge.score(["jump"], ["You can't do that."], memory)
    assert parts["error"] == -2 and parts["failed"] == -1
    parts, _ = judge.score(["take key", "jump"], ["You take the key.", "You can't do that."], memory)
    assert parts["error"] == 0 and parts["failed"] == 0 and parts["length"] == pytest.approx(-0.1)
