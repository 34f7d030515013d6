"""ScienceWorld adapter on a real JVM. Fast tests use task types that load in about a second;
tests that load many task types or slow ones (gold paths up to 25 s) are marked slow.

    .venv/bin/pytest -q tests/test_envs_scienceworld.py            # fast ones (~15 s)
    .venv/bin/pytest -q -m slow tests/test_envs_scienceworld.py    # the rest (minutes)
"""

from __future__ import annotations

import pytest

pytest.importorskip("scienceworld")

from simplan.envs.base import Action, ActionParseError, EnvCrashed  # noqa: E402
from simplan.envs.failures import FailureRules  # noqa: E402
from simplan.envs.scienceworld import (  # noqa: E402
    _SELF_MOVE_RE,
    ScienceWorldEnv,
    filter_valid_actions,
    is_error_response,
    task_names,
)
from simplan.inference.planning.judge import Judge, JudgeWeights  # noqa: E402

FAST = ["lifespan-longest-lived", "power-component"]


@pytest.fixture(scope="module")
def env():
    e = ScienceWorldEnv()
    yield e
    e.close()


def _play(env, plan):
    result = None
    for action in plan:
        result = env.step(action)
        if result.done:
            break
    return result


def test_thirty_task_types_without_a_jvm():
    names = task_names()
    assert len(names) == 30 and "boil" in names and "mendelian-genetics-unknown-plant" in names


def test_folds_are_scienceworld_variation_splits(env):
    by_fold = {f: env.tasks(f, families=FAST) for f in ("train", "dev", "test")}
    ids = {f: {t.task_id for t in ts} for f, ts in by_fold.items()}
    assert not (ids["train"] & ids["dev"]) and not (ids["train"] & ids["test"]) and not (ids["dev"] & ids["test"])
    assert {t.family for t in by_fold["train"]} == set(FAST)
    assert "power-component-0" in ids["train"] and "power-component-10" in ids["dev"]  # 10/5/5 of 20
    assert len([t for t in by_fold["dev"] if t.family == "power-component"]) == 5
    first = env.tasks("train", families=FAST, limit=2)
    assert [t.task_id for t in first] == ["lifespan-longest-lived-0", "power-component-0"]
    assert first[1].params == {"task_name": "power-component", "variation": 0, "simplifications": ""}


@pytest.mark.parametrize("family", FAST)
def test_expert_wins_and_invalid_input_is_an_error_observation(env, family):
    task = env.tasks("train", families=[family], limit=1)[0]
    obs = env.reset(task)
    assert obs.goal.startswith("Your task is") and obs.text.startswith("This room is called")
    assert 0 < len(obs.valid_actions) <= env.max_valid_actions
    assert "reset task" not in obs.valid_actions
    assert not obs.valid_actions_complete  # a filtered, capped hint: other actions may work
    r = env.step(Action.command("xyzzy frobnicate"))
    assert r.observation.error and not r.done and r.score == 0.0
    env.reset(task)
    result = _play(env, env.expert_plan())
    assert result.won and result.done and result.score == 1.0 and result.info["tasksuccess"]
    after = env.step(Action.command("look around"))
    assert after.done and after.won and after.observation.error


def test_wrong_focus_fails_the_task(env):
    task = env.tasks("train", families=["lifespan-longest-lived"], limit=1)[0]
    env.reset(task)
    r = env.step(Action.command("focus on agent"))
    assert r.done and not r.won and r.score < 0 and r.info["taskfailure"]


def test_valid_action_policy():
    raw = ["connect a to b", "reset task", "look at cup", "open door", "look around", "disconnect a", "move a to b"]
    assert filter_valid_actions(raw, "boil", None) == ["look around", "open door", "move a to b", "look at cup"]
    electrical = filter_valid_actions(raw, "power-component", None)
    assert "connect a to b" in electrical and "reset task" not in electrical
    assert filter_valid_actions(raw, "boil", 2) == ["look around", "open door"]
    assert is_error_response("No known action matches that input.")
    assert is_error_response("The glass jar isn't open, so you can't see inside.")
    assert not is_error_response("Ambiguous request: Please enter the number for the action you intended")
    assert not is_error_response("You move the apple seed to the flower pot 1.")
    assert _SELF_MOVE_RE.match("pour metal pot into metal pot")  # dropped from expert plans
    assert not _SELF_MOVE_RE.match("pour metal pot into sink")


def test_parse_action_is_strict(env):
    assert env.parse_action(" open  door to kitchen ").text == "open door to kitchen"
    for bad in ("", "\n", "open door\ngo to kitchen"):
        with pytest.raises(ActionParseError):
            env.parse_action(bad)


@pytest.mark.slow  # a fresh ScienceWorld JVM takes ~10 s to load a task; the shared logic is tested on TWX
def test_dead_jvm_raises_env_crashed_then_reset_restarts(env):
    task = env.tasks("train", families=["power-component"], limit=1)[0]
    obs = env.reset(task)
    proc = env.jvm.process()
    proc.kill()
    proc.wait()
    with pytest.raises(EnvCrashed, match="next reset"):
        env.step(Action.command("look around"))
    assert env.reset(task).text == obs.text
    assert env.jvm.process().poll() is None


@pytest.mark.slow
def test_ambiguity_questions_offer_numbers_and_the_gold_path_answers_them(env):
    task = env.tasks("train", families=["grow-plant"], limit=1)[0]
    env.reset(task)
    seen = []
    result = None
    for action in env.expert_plan():
        result = env.step(action)
        if result.info["ambiguous"]:
            seen.append(result.observation.valid_actions)
            assert not result.observation.error and result.observation.valid_actions_complete
        else:
            assert not result.observation.valid_actions_complete
        if result.done:
            break
    assert seen and seen[0][:2] == ["0", "1"]
    assert result.won


@pytest.mark.slow
def test_all_thirty_task_types_have_disjoint_folds(env):
    ids = {f: {t.task_id for t in env.tasks(f)} for f in ("train", "dev", "test")}
    assert not (ids["train"] & ids["dev"]) and not (ids["train"] & ids["test"]) and not (ids["dev"] & ids["test"])
    assert sum(len(v) for v in ids.values()) == 7207


def test_the_judge_reads_failures_with_the_adapters_own_patterns():
    """The judge (and the error pivot) read predicted texts with the adapter's own patterns: first line only,
    an ambiguity question is none."""
    judge = Judge(JudgeWeights(), FailureRules.for_env(ScienceWorldEnv))
    texts = [
        "No known action matches that input.",
        "  I'm not sure what you mean.",
        "The glass jar isn't open, so you can't see inside.",
        "The door is not openable.",
        "That doesn't appear to be something you can pick up.",
        "Ambiguous request: Please enter the number for the action you intended (or blank to cancel):\n0: you can't",
        "You move the apple seed to the flower pot 1.",
        "You are in the kitchen.\nYou can't see a stove here.",
        "The stove is now activated.",
    ]
    expected = [True] * 5 + [False] * 4
    assert [judge.is_error(t) for t in texts] == [is_error_response(t) for t in texts] == expected
