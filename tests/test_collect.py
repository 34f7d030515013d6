"""Trajectory collection: policies, noise and recovery, resume, crashes, workers (toy env; one small TWX run)."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest

from simplan.core.io import read_jsonl_tolerant
from simplan.data.collect import CollectConfig, collect
from simplan.data.mistakes import inverse_candidates, is_look_only
from simplan.data.trajectory import Trajectory
from simplan.data.validate import validate_file
from simplan.envs.base import Action, StepResult
from simplan.envs.registry import register
from simplan.envs.toy import ToyEnv
from simplan.scripts import collect as collect_script


class CrashyEnv(ToyEnv):
    """A toy env whose 'JVM' dies on the second step of every third seed."""

    name = "crashy"
    created = 0

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        type(self).created += 1
        self._n = 0

    def reset(self, task):
        self._n = 0
        obs = super().reset(task)
        return obs

    def step(self, action):
        self._n += 1
        if int(self._task.params["seed"]) % 3 == 0 and self._n == 2:
            raise RuntimeError("JVM died (simulated)")
        return super().step(action)


class TrapEnv(ToyEnv):
    """A toy env with an irreversible valid action: 'smash door' loses the game at once."""

    name = "trap"

    def reset(self, task):
        self.smashed = False
        return super().reset(task)

    def valid_actions(self):
        return sorted(super().valid_actions() + ([] if getattr(self, "smashed", False) else ["smash door"]))

    def step(self, action):
        if action.kind == "command" and action.text.strip().lower() == "smash door" and not self.smashed:
            self.smashed = True
            obs = self._observe("You smash the door to pieces. It can never be opened now.", error=False)
            return StepResult(observation=obs, score=self._score(), done=True, won=False)
        return super().step(action)


register("crashy", CrashyEnv)
register("trap", TrapEnv)


def _records(path: Path) -> list[dict]:
    records, problems = read_jsonl_tolerant(path)
    assert problems == []
    return records


def _cfg(tmp_path: Path, **kw) -> CollectConfig:
    base = dict(env="toy", limit=12, out=str(tmp_path / "toy.jsonl"), progress=False)
    return CollectConfig(**(base | kw))


def test_expert_trajectories_succeed_and_validate(tmp_path):
    report = collect(_cfg(tmp_path, policies=["expert"]))
    records = _records(tmp_path / "toy.jsonl")
    assert len(records) == report.written == 12
    for r in records:
        traj = Trajectory.from_dict(r)
        assert traj.success and traj.status == "ok"
        assert traj.id == f"toy/{traj.task.task_id}/expert/0"
        assert all(s.source == "expert" and not s.error for s in traj.steps)
        assert [s.index for s in traj.steps] == list(range(len(traj.steps)))
        # Steps chain: each step starts where the previous one ended.
        assert traj.steps[0].observation == traj.initial_observation
        assert all(a.next_observation == b.observation for a, b in zip(traj.steps, traj.steps[1:]))
    assert validate_file(tmp_path / "toy.jsonl").ok


def test_noisy_expert_has_real_mistakes_then_recovery(tmp_path):
    collect(_cfg(tmp_path, policies=["noisy_expert"], limit=20, noise_rate=0.3))
    records = [r for r in _records(tmp_path / "toy.jsonl") if r["policy"] == "noisy_expert"]
    assert len(records) == 20
    env = ToyEnv()
    for r in records:
        steps = r["steps"]
        noise = [i for i, s in enumerate(steps) if s["source"] == "noise"]
        assert noise, f"{r['id']} has no mistake"
        for i in noise:  # every kept mistake is followed by a recovery step, never by another mistake
            assert steps[i + 1]["source"] == "recovery"
        # Replaying the recorded actions in a fresh env reproduces every recorded observation.
        obs = env.reset(Trajectory.from_dict(r).task)
        assert obs.text == r["initial_observation"]
        for s in steps:
            assert env.step(Action.from_dict(s["action"])).observation.text == s["next_observation"]
    assert any(s["error"] for r in records for s in r["steps"]), "no invalid action with an error observation"
    assert any(s["action"]["text"] == "go west" and s["source"] == "noise" for r in records for s in r["steps"])
    assert sum(r["success"] for r in records) >= 0.8 * len(records)


def test_irreversible_mistakes_split_off_as_branches(tmp_path):
    cfg = _cfg(tmp_path, env="trap", policies=["noisy_expert"], limit=15, noise_rate=0.5, invalid_share=0.0)
    collect(cfg)
    records = _records(tmp_path / "toy.jsonl")
    main = [r for r in records if r["policy"] == "noisy_expert"]
    branches = [r for r in records if r["meta"].get("kind") == "branch"]
    assert branches, "no smash-door mistake was split off"
    for b in branches:
        assert b["policy"] == "random" and b["meta"]["parent"].startswith("trap/")
        assert b["steps"][b["meta"]["branch_step"]]["source"] == "noise"
    # The main runs never keep an irreversible mistake and all still succeed.
    assert all(r["success"] for r in main)
    assert not any(s["action"]["text"] == "smash door" for r in main for s in r["steps"])
    assert any(s["action"]["text"] == "smash door" and s["done"] for b in branches for s in b["steps"])
    assert validate_file(tmp_path / "toy.jsonl").ok


def test_random_and_branch_policies(tmp_path):
    collect(_cfg(tmp_path, policies=["random"], attempts=2, branches=2, random_steps=5, limit=5))
    records = _records(tmp_path / "toy.jsonl")
    ids = {r["id"] for r in records}
    assert len(records) == 5 * (2 + 2) and len(ids) == len(records)
    walks = [r for r in records if r["meta"]["kind"] == "episode"]
    assert all(len(r["steps"]) <= 5 and r["status"] in ("ok", "truncated") for r in walks)
    assert any(r["status"] == "truncated" for r in walks)
    for b in (r for r in records if r["meta"]["kind"] == "branch"):
        k = b["meta"]["branch_step"]
        assert len(b["steps"]) == k + 1 and b["steps"][k]["source"] == "random"
        assert all(s["source"] == "expert" for s in b["steps"][:k])


def test_same_seed_same_data_and_max_steps_truncates(tmp_path):
    a = _cfg(tmp_path, policies=["noisy_expert"], out=str(tmp_path / "a.jsonl"))
    b = _cfg(tmp_path, policies=["noisy_expert"], out=str(tmp_path / "b.jsonl"))
    collect(a), collect(b)

    def strip(r):
        r["meta"].pop("elapsed_s")
        return r

    assert [strip(r) for r in _records(tmp_path / "a.jsonl")] == [strip(r) for r in _records(tmp_path / "b.jsonl")]
    collect(_cfg(tmp_path, policies=["expert"], max_steps=2, out=str(tmp_path / "c.jsonl")))
    assert {r["status"] for r in _records(tmp_path / "c.jsonl")} == {"truncated"}


def test_resume_skips_finished_episodes_and_repairs_a_torn_line(tmp_path):
    out = tmp_path / "toy.jsonl"
    first = collect(_cfg(tmp_path, policies=["expert", "noisy_expert"], limit=6))
    assert first.written == 12
    n_lines = len(out.read_text().splitlines())
    again = collect(_cfg(tmp_path, policies=["expert", "noisy_expert"], limit=6))
    assert (again.written, again.skipped) == (0, 12)
    assert len(out.read_text().splitlines()) == n_lines
    # A crash mid-append leaves a torn last line: it is reported, set aside, and its episode redone.
    lines = out.read_text().splitlines(keepends=True)
    torn_id = json.loads(lines[-1])["id"]
    out.write_text("".join(lines[:-1]) + lines[-1][: len(lines[-1]) // 2])
    third = collect(_cfg(tmp_path, policies=["expert", "noisy_expert"], limit=6))
    assert third.written == 1 and any("torn" in p for p in third.problems)
    assert Path(f"{out}.torn").exists()
    assert torn_id in {r["id"] for r in _records(out)}
    assert validate_file(out).ok
    # More tasks later: only the new ones are collected.
    fourth = collect(_cfg(tmp_path, policies=["expert", "noisy_expert"], limit=8))
    assert (fourth.written, fourth.skipped) == (4, 12)


def test_crashing_env_yields_errored_records_and_a_fresh_env(tmp_path):
    CrashyEnv.created = 0
    report = collect(_cfg(tmp_path, env="crashy", policies=["expert"], limit=9))
    records = {r["id"]: r for r in _records(tmp_path / "toy.jsonl")}
    assert len(records) == 9 and report.unfinished == 0
    errored = [r for r in records.values() if r["status"] == "errored"]
    assert sorted(r["task"]["params"]["seed"] for r in errored) == [0, 3, 6]
    assert all("JVM died" in r["error"] and len(r["steps"]) == 1 for r in errored)
    assert all(r["success"] for r in records.values() if r["status"] != "errored")
    assert CrashyEnv.created == 1 + 1 + 3  # task listing, the worker's env, one fresh env per crash
    assert validate_file(tmp_path / "toy.jsonl").ok
    # --retry-errored drops the errored records and collects those episodes again (they crash again).
    again = collect(_cfg(tmp_path, env="crashy", policies=["expert"], limit=9, retry_errored=True))
    assert again.written == 3 and len(_records(tmp_path / "toy.jsonl")) == 9


def test_two_workers_collect_every_episode(tmp_path):
    report = collect(_cfg(tmp_path, policies=["expert", "noisy_expert"], limit=10, workers=2))
    assert report.written == 20 and report.unfinished == 0
    records = _records(tmp_path / "toy.jsonl")
    assert len({r["id"] for r in records}) == 20 and all(r["success"] for r in records if r["policy"] == "expert")
    # Workers see envs registered at run time too (they are spawned, not forked).
    collect(_cfg(tmp_path, env="crashy", policies=["expert"], limit=3, workers=2, out=str(tmp_path / "c.jsonl")))
    assert sum(r["status"] == "errored" for r in _records(tmp_path / "c.jsonl")) == 1


def test_recovery_rules():
    assert inverse_candidates(Action.command("go east")) == ["go west"]
    assert inverse_candidates(Action.command("move north")) == ["move south"]
    assert inverse_candidates(Action.command("open door to west")) == ["close door to west"]
    assert inverse_candidates(Action.command("take apple from fridge"))[0] == "put apple in fridge"
    assert inverse_candidates(Action.command("take coin")) == ["drop coin", "put down coin"]
    assert inverse_candidates(Action.command("eat apple")) == []
    assert is_look_only(Action.command("look around")) and is_look_only(Action.command("inventory"))
    assert not is_look_only(Action.command("take key"))
    assert is_look_only(Action.tool_call("ls", {})) and not is_look_only(Action.tool_call("rm", {"file": "a"}))


def test_config_validation_and_script(tmp_path, capsys):
    with pytest.raises(ValueError, match="policies"):
        CollectConfig(policies=["expert", "greedy"])
    with pytest.raises(ValueError, match="noise_rate"):
        CollectConfig(noise_rate=1.5)
    with pytest.raises(ValueError, match="fold"):
        CollectConfig(fold="valid")
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"env: toy\nlimit: 4\npolicies: [expert, random]\nout: {tmp_path / 'r.jsonl'}\n")
    assert collect_script.main(["--config", str(recipe), "--limit", "3", "--progress", "false"]) == 0
    assert len(_records(tmp_path / "r.jsonl")) == 6
    assert "expert: 3/3 succeeded" in capsys.readouterr().out


@pytest.mark.skipif(
    importlib.util.find_spec("textworld_express") is None or shutil.which("java") is None,
    reason="needs textworld-express and Java",
)
def test_twx_trajectories_validate(tmp_path):
    pytest.importorskip("simplan.envs.textworld_express")
    from simplan.envs.registry import make_env

    env = make_env("twx")
    try:
        games = sorted({t.family for t in env.tasks("train")})[:2]
    finally:
        env.close()
    cfg = CollectConfig(
        env="twx",
        families=games,
        limit=1,
        policies=["expert", "noisy_expert"],
        branches=1,
        out=str(tmp_path / "twx.jsonl"),
        progress=False,
    )
    report = collect(cfg)
    assert report.written == 2 * 3 and report.statuses["errored"] == 0
    records = _records(tmp_path / "twx.jsonl")
    assert all(r["success"] for r in records if r["policy"] == "expert")
    assert any(s["source"] == "noise" for r in records for s in r["steps"])
    assert validate_file(tmp_path / "twx.jsonl").ok


def test_tools_added_mid_episode_reach_the_dataset_prompts(tmp_path):
    pytest.importorskip("bfcl_eval")
    from simplan.data.format import trajectory_states

    cfg = CollectConfig(
        env="bfcl",
        families=["multi_turn_miss_func"],
        limit=3,
        policies=["expert"],
        out=str(tmp_path / "bfcl.jsonl"),
        progress=False,
    )
    assert collect(cfg).written == 3
    checked = 0
    for record in _records(tmp_path / "bfcl.jsonl"):
        traj = Trajectory.from_dict(record)
        states = trajectory_states(traj)
        first = {t["name"] for t in traj.tools}
        for i, step in enumerate(traj.steps[:-1]):
            if "tools_added" in step.info:  # the env released withheld functions with this observation
                added = set(step.info["tools_added"])
                assert {t["name"] for t in step.info["tools"]} >= added and not added & first
                assert not added & {t["name"] for t in states[i].tools}
                assert added <= {t["name"] for t in states[i + 1].tools}
                checked += 1
    assert checked >= 1


def test_family_limits_override_the_limit_for_the_families_they_name() -> None:
    from simplan.data.collect import select_tasks

    env = ToyEnv()
    assert len(select_tasks(env, CollectConfig(env="toy", limit=10))) == 10
    picked = select_tasks(env, CollectConfig(env="toy", limit=10, family_limits={"corridor": 3}))
    assert [t.task_id for t in picked] == ["corridor-0", "corridor-1", "corridor-2"]
    with pytest.raises(ValueError, match=r"family_limits: \['kitchen'\].*corridor"):
        select_tasks(env, CollectConfig(env="toy", family_limits={"kitchen": 3}))
    with pytest.raises(ValueError, match="at least 1"):
        CollectConfig(env="toy", family_limits={"corridor": 0})


def test_skip_holds_out_the_first_tasks_of_each_family() -> None:
    from simplan.data.collect import select_tasks
    from simplan.envs.toy import ToyEnv

    env = ToyEnv()
    first = select_tasks(env, CollectConfig(env="toy", fold="dev", limit=2))
    later = select_tasks(env, CollectConfig(env="toy", fold="dev", limit=2, skip=2))
    both = select_tasks(env, CollectConfig(env="toy", fold="dev", limit=4))
    assert [t.task_id for t in first + later] == [t.task_id for t in both]
    with pytest.raises(ValueError, match="skip"):
        CollectConfig(env="toy", skip=-1)


def test_a_noisy_experts_invalid_commands_do_not_depend_on_the_hash_seed():
    """The same rng draws the same invalid command in every process: the valid actions are read in the env's order,
    not a set's (whose order is the process's string hash seed; collection was not reproducible across runs)."""
    import os
    import subprocess
    import sys

    code = (
        "import random; from simplan.data.mistakes import invalid_command; "
        "valid = ['take apple', 'open fridge', 'move east', 'examine cookbook', 'put knife in box', 'eat meal']; "
        "print([invalid_command(valid, random.Random(s)) for s in range(20)])"
    )
    draws = {
        subprocess.run(
            [sys.executable, "-c", code], env={**os.environ, "PYTHONHASHSEED": seed}, capture_output=True, text=True,
            check=True,
        ).stdout
        for seed in ("1", "2", "3")
    }  # fmt: skip
    assert len(draws) == 1, draws
