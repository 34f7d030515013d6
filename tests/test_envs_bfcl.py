"""BFCL multi-turn adapter: expert replay, folds, strict parsing, withheld tools, bfcl's checker.

Run: .venv/bin/pytest -q tests/test_envs_bfcl.py   (add `-m slow` for the replay of all 799 tasks)
"""

from __future__ import annotations

import os

import pytest

pytest.importorskip("bfcl_eval")

from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils  # noqa: E402

from simplan.envs.base import FOLDS, Action, ActionParseError, Env  # noqa: E402
from simplan.envs.bfcl import BFCLEnv  # noqa: E402
from simplan.envs.bfcl_tasks import CATEGORIES, base_id_of, load_category, unplayable_reason  # noqa: E402
from simplan.envs.registry import make_env  # noqa: E402


@pytest.fixture
def env():
    e = BFCLEnv()
    yield e
    e.close()


def _replay(env: BFCLEnv, task, skip_turn: int | None = None):
    env.reset(task)
    results, turn = [], 0
    for action in env.expert_plan():
        if action.kind == "finish" or turn != skip_turn:
            results.append(env.step(action))
        if action.kind == "finish":
            turn += 1
    return results


def _instances_of(model_name: str) -> list[str]:
    return [k for k in vars(multi_turn_utils) if k.startswith(model_name + "_")]


@pytest.mark.parametrize("category", CATEGORIES)
def test_expert_replay_succeeds(env, category):
    tasks = env.tasks("train", families=[category], limit=3)
    assert len(tasks) == 3 and all(t.family == category for t in tasks)
    for task in tasks:
        results = _replay(env, task)
        final = results[-1]
        assert final.done and final.won and final.info["tasksuccess"], (task.task_id, final.info)
        assert final.score == 1.0 and final.info["checker"]["valid"]
        assert not any(r.done for r in results[:-1])
        assert not any(r.observation.error for r in results), task.task_id
        assert sum(r.reward for r in results) == pytest.approx(1.0)


def test_registry_and_protocol():
    e = make_env("bfcl")
    assert isinstance(e, Env) and e.name == "bfcl"


def test_folds_disjoint_by_base_id(env):
    folds = {fold: env.tasks(fold) for fold in FOLDS}
    base_ids = {fold: {t.params["base_id"] for t in tasks} for fold, tasks in folds.items()}
    assert base_ids["train"].isdisjoint(base_ids["dev"]) and base_ids["train"].isdisjoint(base_ids["test"])
    assert base_ids["dev"].isdisjoint(base_ids["test"])
    assert [len(base_ids[f]) for f in FOLDS] == [140, 30, 30]
    for fold, tasks in folds.items():
        assert {t.family for t in tasks} == set(CATEGORIES)
        assert all(t.fold == fold and base_id_of(t.task_id) == t.params["base_id"] for t in tasks)
    task_ids = [t.task_id for tasks in folds.values() for t in tasks]
    assert len(task_ids) == len(set(task_ids)) == 4 * 200 - 1  # miss_func_49 is unplayable
    # Stable order: the first few tasks of a fold cover all four variants of one base task.
    assert {t.family for t in env.tasks("train", limit=4)} == set(CATEGORIES)
    with pytest.raises(ValueError, match="families"):
        env.tasks("train", families=["web_search"])


def test_unplayable_task_left_out():
    entry = load_category("multi_turn_miss_func")["multi_turn_miss_func_49"]
    assert "tail" in unplayable_reason(entry)
    assert unplayable_reason(load_category("multi_turn_base")["multi_turn_base_49"]) is None


@pytest.mark.parametrize(
    "text",
    [
        "system(command='ls')",  # not one of the task's tools
        "cd(folder=x)",  # a name, not a literal
        "cd(folder=open('/etc/passwd'))",  # a call inside an argument
        "__import__('os')",
        "__import__(name='os').system('ls')",
        "os.system(command='ls')",
        "cd('document')",  # positional
        "cd(folder='a'); ls()",
        "cd(**{'folder': 'a'})",
        "cd(folder='a', folder='b')",  # one argument given twice
        "",
    ],
)
def test_parse_action_rejects(env, text):
    env.reset(env.tasks("train", families=["multi_turn_base"], limit=1)[0])
    with pytest.raises(ActionParseError):
        env.parse_action(text)


def test_parse_action_accepts_tools_and_finish(env):
    task = next(
        t for t in env.tasks("train", families=["multi_turn_base"]) if "GorillaFileSystem" in t.params["classes"]
    )
    env.reset(task)
    assert env.parse_action("  cd(folder='document') ") == Action.tool_call("cd", {"folder": "document"})
    assert env.parse_action("ls(a=True)").arguments == {"a": True}
    assert env.parse_action("finish()").kind == "finish"


def test_invalid_calls_give_error_observations_and_are_not_executed(env):
    task = next(
        t for t in env.tasks("train", families=["multi_turn_base"]) if "GorillaFileSystem" in t.params["classes"]
    )
    env.reset(task)
    before = env.step(Action.tool_call("pwd")).observation.text
    bad = [
        Action.tool_call("system", {"command": "touch /tmp/pwned"}),  # unknown tool
        Action.tool_call("cd", {"folder": object()}),  # not a literal
        Action.tool_call("cd", {"folder": float("nan")}),  # repr is not a literal
        Action.tool_call("cd", {"folder='.'), __import__('os').system('true'), cd(folder": "x"}),  # key injection
        Action(kind="command", text="ls -la"),
    ]
    for action in bad:
        result = env.step(action)
        assert result.observation.error and not result.done, action
        assert result.info["call"] is None, action
        assert result.observation.text.startswith("Error:")
    assert "not an available tool" in env.step(bad[0]).observation.text
    # The backend answers a well-formed call with an error: error observation, call recorded.
    result = env.step(Action.tool_call("cd", {"folder": "no_such_dir_xyz"}))
    assert result.observation.error and result.info["call"] == "cd(folder='no_such_dir_xyz')"
    result = env.step(Action.tool_call("cd", {"nope": 1}))  # bad keyword: bfcl's executor reports it
    assert result.observation.error and "Error during execution" in result.observation.text
    assert env.step(Action.tool_call("pwd")).observation.text == before  # nothing moved


def test_miss_func_withheld_until_its_turn(env):
    task = next(
        t
        for t in env.tasks("train", families=["multi_turn_miss_func"])
        if min(load_category("multi_turn_miss_func")[t.task_id].missed) >= 1
    )
    entry = load_category("multi_turn_miss_func")[task.task_id]
    (release_turn, names), *_ = sorted(entry.missed.items())
    withheld = names[0]
    obs = env.reset(task)
    assert withheld not in {t["name"] for t in obs.tools} and withheld not in env.available_tools()
    with pytest.raises(ActionParseError, match="not one of this task's tools"):
        env.parse_action(f"{withheld}()")
    result = env.step(Action.tool_call(withheld, {}))
    assert result.observation.error and "not an available tool" in result.observation.text
    for _ in range(release_turn - 1):
        result = env.step(Action(kind="finish"))
        assert withheld not in {t["name"] for t in result.observation.tools}
    result = env.step(Action(kind="finish"))  # now at the holdout turn
    assert result.info["tools_added"] == names
    assert withheld in {t["name"] for t in result.observation.tools}
    assert "updated some more functions" in result.observation.text
    assert env.parse_action(f"{withheld}()").name == withheld


def test_wrong_episode_fails_bfcl_checker(env):
    task = env.tasks("train", families=["multi_turn_base"], limit=1)[0]
    last = len(load_category("multi_turn_base")[task.task_id].ground_truth) - 1
    results = _replay(env, task, skip_turn=last)  # say finish() without doing the last turn's calls
    final = results[-1]
    assert final.done and not final.won and not final.info["tasksuccess"]
    assert final.info["turn_check"] == {
        "turn": last,
        "valid": False,
        "error_type": "multi_turn:empty_turn_model_response",
        "error_message": f"Model response list is empty for turn {last}",
    }
    assert final.info["checker"]["valid"] is False
    assert final.score == pytest.approx(
        1 - 1 / sum(1 for gt in load_category("multi_turn_base")[task.task_id].ground_truth if gt)
    )


def test_answer_ends_turn_and_step_after_done_raises(env):
    task = next(t for t in env.tasks("dev", families=["multi_turn_base"]) if t.params["turns"] == 2)
    env.reset(task)
    assert not env.step(Action(kind="answer", text="Sorry, I cannot.")).done
    result = env.step(Action(kind="finish"))
    assert result.done and not result.won and result.score == 0.0
    with pytest.raises(RuntimeError, match="reset"):
        env.step(Action(kind="finish"))


def test_step_limit_force_terminates():
    env = BFCLEnv(max_steps_per_turn=2)
    task = next(
        t for t in env.tasks("train", families=["multi_turn_base"]) if "GorillaFileSystem" in t.params["classes"]
    )
    env.reset(task)
    assert not env.step(Action.tool_call("pwd")).done
    assert not env.step(Action.tool_call("pwd")).done
    result = env.step(Action.tool_call("pwd"))
    assert result.done and not result.won and result.info["truncated"]
    assert result.info["checker"]["error_type"] == "multi_turn:force_terminated"
    env.close()


def test_tool_schemas_are_json_schema(env):
    obs = env.reset(env.tasks("train", families=["multi_turn_long_context"], limit=1)[0])
    assert [t["name"] for t in obs.tools] == env.available_tools()
    text = str(obs.tools)
    assert "'dict'" not in text and "'float'" not in text and "'object'" in text
    assert all(set(t) == {"name", "description", "parameters"} for t in obs.tools)
    assert obs.text.startswith("User: ") and obs.goal and obs.goal in obs.text
    compact = BFCLEnv(compact_tools=True)
    compact_obs = compact.reset(env.tasks("train", families=["multi_turn_long_context"], limit=1)[0])
    assert not any("This tool belongs to" in t["description"] for t in compact_obs.tools)
    assert any("This tool belongs to" in t["description"] for t in obs.tools)
    compact.close()


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_backend_instances_live_in_one_worker_process_per_episode(env):
    task = env.tasks("train", families=["multi_turn_miss_param"], limit=1)[0]
    pids = []
    for _ in range(3):
        assert _replay(env, task)[-1].won  # the checkers ran in the worker, against its instances
        pids.append(env._worker._process.pid)
        assert _running(pids[-1])
        assert not _instances_of(env._model_name)  # bfcl's instances never enter this process
    assert len(set(pids)) == 3  # a fresh worker per reset ...
    assert not any(_running(p) for p in pids[:-1])  # ... and the earlier ones are gone
    env.close()
    assert not _running(pids[-1])


@pytest.mark.slow
def test_expert_replay_all_tasks():
    env = BFCLEnv()
    failed = [
        t.task_id for fold in FOLDS for t in env.tasks(fold) if not (r := _replay(env, t)[-1]).won or r.score != 1.0
    ]
    env.close()
    assert failed == []
