"""Backtracking (issue 32 item 4): an env's inverses restore the state they claim to (toy and TWX, the envs check),
and the planner, after a pivot that `pivot_rules.backtrack` names, plays the inverse of the step just taken, checks
that it is back at the recorded valid actions and score, bans the undone step there and decides again.

.venv/bin/pytest -q tests/test_backtrack.py
"""

from __future__ import annotations

import pytest

from simplan.envs.base import Action, Observation, StepResult, env_extra, inverse_restores
from simplan.envs.check import _undo_each_step, check_env
from simplan.envs.textworld_express import TextWorldExpressEnv
from simplan.envs.toy import ToyEnv
from simplan.inference.engines.scripted import ScriptedEngine
from simplan.inference.planning.config import PlannerConfig
from simplan.inference.planning.planner import Planner
from simplan.models.tiny import _tokenizer

WRONG = "You are in a strange dark room."


@pytest.fixture(scope="module")
def tok():
    return _tokenizer()


def test_twx_inverses():
    env = TextWorldExpressEnv.__new__(TextWorldExpressEnv)  # inverse reads the command alone: no JVM needed
    cases = {
        "move north": "move south",
        "move west": "move east",
        "open door to north": "close door to north",
        "close fridge": "open fridge",
        "put blue cap in shoe cabinet": "take blue cap",
        "put red apple on kitchen counter": "take red apple",
    }
    for action, back in cases.items():
        assert env.inverse(Action.command(action)) == Action.command(back), action
    for action in ("take coin", "eat apple", "look around", "move up", "open", "read cookbook"):
        assert env.inverse(Action.command(action)) is None, action
    assert env.inverse(Action.tool_call("move", {"to": "north"})) is None


def test_every_twx_game_undoes_its_expert_steps():
    """On the expert paths of every game, each step with an inverse is undone to the same valid actions and score
    (the envs check's walk; `simplan envs check twx` runs it on its train sample)."""
    env = TextWorldExpressEnv()
    verbs: set[str] = set()

    def inverse(action: Action) -> Action | None:
        back = env.inverse(action)
        if back is not None:
            verbs.add(action.text.split()[0])
        return back

    try:
        undone = 0
        for game in env.families:
            for task in env.tasks("dev", families=[game], limit=2):
                n, problems = _undo_each_step(env, task, inverse)
                assert not problems, problems
                undone += n
        assert undone >= 30 and verbs == {"move", "open", "close", "put"}, (undone, verbs)
    finally:
        env.close()


class WrongWayBack(ToyEnv):
    """A toy whose declared inverse of a move is a look: it restores nothing."""

    def inverse(self, action: Action) -> Action | None:
        return Action.command("look") if action.text in ("go east", "go west") else None


def test_the_envs_check_names_an_inverse_that_does_not_restore():
    assert "undone, each back to its valid actions and score" in _result(check_env(ToyEnv(), 2, progress=False))
    report = check_env(WrongWayBack(), fold_sample=1, progress=False)
    assert not report.ok and "'go east' undone by 'look'" in _result(report)


def _result(report) -> str:
    return next(r.message for r in report.results if r.name == "inverses")


def test_inverse_restores_compares_valid_actions_as_a_set_and_the_score():
    before = Observation("Room 1.", valid_actions=["look", "go east"])
    same = StepResult(Observation("You are back.", valid_actions=["go east", "look"]), score=0.5)
    assert inverse_restores(before, 0.5, same)
    assert not inverse_restores(before, 0.0, same)
    assert not inverse_restores(before, 0.5, StepResult(Observation("x", valid_actions=["look"]), score=0.5))


def _planner_run(env, tok, backtrack: list[str], max_steps: int = 4):
    """simplan on the toy's dev task 3 (the key two rooms east) with a decider that always goes east (while it may)
    and a simulator that is always wrong: every step fires expectation_mismatch."""
    task = env.tasks("dev")[3]

    def decide(req, user):
        return "go east"

    def score(req, text):
        return [0.0 if c == "go east" else -5.0 for c in req.candidates]

    engine = ScriptedEngine(decide, lambda req, user: WRONG, score)
    cfg = PlannerConfig.from_dict(
        {
            "arm": "simplan",
            "k": 1,
            "horizon": 1,
            "adaptive": False,
            "raise_errors": True,
            "max_steps": max_steps,
            "pivot_rules": {"backtrack": backtrack},
        }
    )
    first = env.reset(task)
    return Planner(engine, env, cfg, tokenizer=tok).run(task), first


class RecordingToy(ToyEnv):
    """The toy keeping every step's observation, to compare a restored state with the recorded one."""

    def reset(self, task):
        self.seen = [super().reset(task)]
        return self.seen[0]

    def step(self, action):
        result = super().step(action)
        self.seen.append(result.observation)
        return result


def test_the_planner_undoes_a_step_to_the_recorded_state_and_bans_it_there(tok):
    env = RecordingToy()
    result, first = _planner_run(env, tok, ["expectation_mismatch"])
    acts = result.trace.of_type("act")
    assert [(a.action, a.source) for a in acts[:2]] == [("go east", "plan"), ("go west", "backtrack")]
    replan = result.trace.of_type("replan")[0]
    assert replan.reason == "expectation_mismatch" and replan.backtrack == "go west" and replan.step == 1
    (event,) = result.trace.of_type("backtrack")
    assert (event.undone, event.action, event.rules, event.restored) == (
        "go east",
        "go west",
        ["expectation_mismatch"],
        True,
    )
    assert event.step == 2 and event.banned == ["go east"] and event.score == event.score_before == 0.0
    # back in the reset state (its valid actions and score as recorded there), where "go east" is now banned: the
    # decision made again takes something else although the decider still says "go east"
    assert env.seen[2].valid_actions == env.seen[0].valid_actions == first.valid_actions
    assert env.seen[1].valid_actions != first.valid_actions and acts[1].score == 0.0
    assert acts[2].action != "go east" and acts[2].source != "backtrack"
    assert result.summary.backtracks == result.summary.backtracks_restored == 1


def test_no_backtrack_by_default_nor_after_a_rule_not_named(tok):
    for backtrack in ([], ["score_drop"]):
        result, _ = _planner_run(ToyEnv(), tok, backtrack)
        assert not result.trace.of_type("backtrack")
        assert all(a.source != "backtrack" for a in result.trace.of_type("act"))
        assert all(r.backtrack is None for r in result.trace.of_type("replan"))


def test_an_inverse_that_does_not_restore_bans_nothing(tok):
    result, _ = _planner_run(WrongWayBack(), tok, ["expectation_mismatch"])
    event = result.trace.of_type("backtrack")[0]
    assert event.action == "look" and not event.restored and event.banned == []
    assert result.summary.backtracks >= 1 and result.summary.backtracks_restored == 0


def test_an_inverse_is_never_undone_and_a_failed_step_never_backtracked(tok):
    """Every step mismatches, the inverses too: each backtrack is followed by a decision, never by the inverse's
    own inverse; a step the env refused changed nothing and is not undone."""
    result, _ = _planner_run(ToyEnv(), tok, ["expectation_mismatch"], max_steps=10)
    acts = result.trace.of_type("act")
    for a, b in zip(acts, acts[1:]):
        assert not (a.source == "backtrack" and b.source == "backtrack")
    undone = {e.step - 1 for e in result.trace.of_type("backtrack")}
    assert all(not acts[s - 1].error for s in undone)
    assert env_extra(object(), "inverse") is None  # an adapter without inverses never backtracks


def test_the_setting_names_rules_that_change_the_state():
    with pytest.raises(ValueError, match="cannot be backtracked from"):
        PlannerConfig.from_dict({"pivot_rules": {"backtrack": ["error_observation"]}})
    assert PlannerConfig().pivot_rules.backtrack == []


def test_the_report_counts_the_steps_undone_only_for_runs_that_backtracked(tok, tmp_path):
    from simplan.evaluation.report import write_report
    from simplan.inference.planning.trace import append_trace

    on, off = tmp_path / "on", tmp_path / "off"
    append_trace(on / "traces.jsonl", _planner_run(ToyEnv(), tok, ["expectation_mismatch"])[0].trace)
    append_trace(off / "traces.jsonl", _planner_run(ToyEnv(), tok, [])[0].trace)
    assert "Backtracking" not in write_report([off], tmp_path / "off-report")["md"].read_text()
    md = write_report([on, off], tmp_path / "report")["md"].read_text()
    table = md.split("### Backtracking")[1].split("###")[0]
    assert "| on | simplan | 1 | 1 | 1 |" in table and "| off |" not in table
