"""envs/check.py on the toy env (milliseconds): the checker passes a good adapter and names what a bad one breaks.

.venv/bin/pytest -q tests/test_env_check.py
"""

from __future__ import annotations

from simplan.envs.base import Action, ActionParseError, Observation, StepResult, Task
from simplan.envs.check import check_env
from simplan.envs.toy import ToyEnv
from simplan.scripts import envs_cmd


def _by_name(report):
    return {r.name.split(" (")[0]: r for r in report.results}


def test_toy_env_passes_every_check():
    report = check_env(ToyEnv(), fold_sample=2, progress=False)
    assert report.ok, report.table()
    names = [r.name for r in report.results]
    assert names[:6] == ["protocol", "tasks", "folds disjoint", "reset/step types", "parse_action", "invalid action"]
    assert "2/2 won" in _by_name(report)["expert success"].message
    assert "toy: all checks passed" in report.table()


class LeakyFolds(ToyEnv):
    """dev lists a train task id."""

    def tasks(self, fold, families=None, limit=None):
        ts = super().tasks(fold, families, limit)
        if fold == "dev":
            ts = ts + [Task(env=self.name, task_id="corridor-0", fold="dev", family="corridor", params={"seed": 0})]
        return ts[:limit] if limit is not None else ts


class RaisesOnInvalid(ToyEnv):
    def step(self, action):
        if action.text not in self.valid_actions():
            raise ValueError("unknown command")
        return super().step(action)


class LazyParser(ToyEnv):
    def parse_action(self, text):
        return Action.command(text.strip().splitlines()[0] if text.strip() else "look")


class WrongExpert(ToyEnv):
    def expert_plan(self):
        return [Action.command("go east")]


class SilentErrors(ToyEnv):
    def step(self, action):
        r = super().step(action)
        obs = Observation(text=r.observation.text, goal=r.observation.goal, valid_actions=r.observation.valid_actions)
        return StepResult(obs, reward=r.reward, score=r.score, done=r.done, won=r.won, info=r.info)


class ShortList(ToyEnv):
    """Claims its valid-action lists are complete but never lists "take key" (the expert needs it)."""

    def valid_actions(self):
        return [a for a in super().valid_actions() if a != "take key"]

    def step(self, action):
        if action.text == "take key" and self.pos == self.key_room and not self.has_key:
            self.has_key = True
            return StepResult(self._observe("You take the key.", error=False), reward=0.5, score=0.5)
        return super().step(action)


def test_incomplete_list_marked_complete_fails_the_expert_check():
    r = _by_name(check_env(ShortList(), fold_sample=1, progress=False))["expert success"]
    assert not r.passed and "'take key'" in r.message and "valid_actions_complete=False" in r.message

    class HonestShortList(ShortList):
        def _observe(self, text, error):
            obs = super()._observe(text, error)
            obs.valid_actions_complete = False
            return obs

    assert _by_name(check_env(HonestShortList(), fold_sample=1, progress=False))["expert success"].passed


def test_leaking_folds_fail_with_the_task_id():
    report = _by_name(check_env(LeakyFolds(), fold_sample=1, progress=False))
    assert not report["folds disjoint"].passed
    assert "corridor-0" in report["folds disjoint"].message


def test_exception_on_invalid_action_is_a_failure_not_a_crash():
    report = check_env(RaisesOnInvalid(), fold_sample=1, progress=False)
    r = _by_name(report)["invalid action"]
    assert not r.passed and "ValueError" in r.message
    assert not report.ok


def test_lenient_parser_fails():
    r = _by_name(check_env(LazyParser(), fold_sample=1, progress=False))["parse_action"]
    assert not r.passed and "accepted" in r.message


def test_expert_that_does_not_win_fails_and_names_tasks():
    r = _by_name(check_env(WrongExpert(), fold_sample=2, progress=False))["expert success"]
    assert not r.passed and "expert failed on 2/2" in r.message and "corridor-0" in r.message


def test_invalid_action_without_error_flag_fails():
    r = _by_name(check_env(SilentErrors(), fold_sample=1, progress=False))["invalid action"]
    assert not r.passed and "Observation.error is False" in r.message


def test_families_filter_and_parse_errors():
    report = check_env(ToyEnv(), fold_sample=1, families=["nope"], progress=False)
    assert not _by_name(report)["tasks"].passed
    env = ToyEnv()
    env.reset(env.tasks("train", limit=1)[0])
    for bad in ("", "go east\ngo west"):
        try:
            env.parse_action(bad)
        except ActionParseError:
            continue
        raise AssertionError(bad)


def test_cli_check_exit_codes(capsys):
    assert envs_cmd.main(["check", "toy", "--sample", "1", "--progress", "false"]) == 0
    assert "all checks passed" in capsys.readouterr().out
    assert envs_cmd.main(["list"]) == 0
    out = capsys.readouterr().out
    assert "twx" in out and "scienceworld" in out and "toy" in out
    assert envs_cmd.main(["frobnicate"]) == 2


class BadExtras(ToyEnv):
    """Optional attributes of the wrong shape: a family its tasks do not use, a pattern that is no regex."""

    families = ("hallway",)
    error_patterns = ("(unclosed",)


def test_optional_attributes_are_checked_and_default_when_absent():
    from simplan.envs.base import EnvDefaults, env_extra

    toy = ToyEnv()
    assert env_extra(toy, "families") == () and env_extra(toy, "step_timeout") is None  # EnvDefaults' values
    assert env_extra(BadExtras(), "families") == ("hallway",)
    try:
        env_extra(toy, "familes")
    except AttributeError as e:
        assert "'familes' is not an optional env attribute" in str(e)
    else:
        raise AssertionError("a misspelt optional attribute must raise")
    assert _by_name(check_env(toy, fold_sample=1, progress=False))["optional attributes"].passed

    class Declared(EnvDefaults, ToyEnv):
        families = ("corridor",)

    assert _by_name(check_env(Declared(), fold_sample=1, progress=False))["optional attributes"].passed
    result = _by_name(check_env(BadExtras(), fold_sample=1, progress=False))["optional attributes"]
    assert not result.passed and "families ['corridor'] that `families` does not list" in result.message
    bad_pattern = type("BadPattern", (BadExtras,), {"families": ("corridor",)})
    result = _by_name(check_env(bad_pattern(), fold_sample=1, progress=False))["optional attributes"]
    assert not result.passed and "error_patterns: '(unclosed' is not a regular expression" in result.message
