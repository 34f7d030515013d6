"""Counterfactual transitions: outcome classes, schema version 2, and alternatives that are what the env returns.

    OMP_NUM_THREADS=1 .venv/bin/pytest -q tests/test_counterfactual.py     # ~20 s (toy, the shop, one TWX game)

Every recorded alternative is checked against a fresh env brought to the step's state by hand: the prefix of
recorded actions, then the alternative, field by field.
"""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import pytest

from simplan.data.collect import CollectConfig, collect
from simplan.data.counterfactual import CounterfactualConfig, collect_counterfactuals
from simplan.data.outcomes import OUTCOMES, classify_outcome, score_change
from simplan.data.trajectory import Alternative, Trajectory, validate_record
from simplan.data.validate import validate_file
from simplan.envs.base import Action
from simplan.envs.failures import FailureRules, rules_of_env
from simplan.envs.registry import UnknownEnvError, make_env
from simplan.scripts import counterfactuals as script


def _collect(tmp_path: Path, env: str = "toy", **kw) -> Path:
    out = tmp_path / f"{env}.jsonl"
    cfg = dict(env=env, limit=2, policies=["expert", "noisy_expert"], out=str(out), progress=False) | kw
    collect(CollectConfig(**cfg))
    return out


def _branch(inputs: list[Path], out: Path, **kw):
    return collect_counterfactuals(
        CounterfactualConfig(inputs=[str(p) for p in inputs], out=str(out), progress=False, **kw)
    )


def _trajectories(path: Path) -> list[Trajectory]:
    return [Trajectory.from_dict(json.loads(line)) for line in path.read_text().splitlines()]


def _check_against_a_fresh_env(path: Path, env_name: str) -> int:
    """Play every recorded alternative again by hand, from a reset and the recorded prefix; returns how many."""
    env = make_env(env_name)
    rules = FailureRules.for_env(env)
    checked = 0
    try:
        for traj in _trajectories(path):
            for t, step in enumerate(traj.steps):
                keys = [alt.action.key() for alt in step.alternatives]
                assert step.action.key() not in keys and len(set(keys)) == len(keys)
                for alt in step.alternatives:
                    env.reset(traj.task)
                    score = 0.0
                    for before in traj.steps[:t]:
                        score = env.step(before.action).score
                    real = env.step(alt.action)
                    seen = real.observation
                    assert alt == Alternative(
                        action=alt.action,
                        next_observation=seen.text,
                        reward=real.reward,
                        score=real.score,
                        done=real.done,
                        won=real.won,
                        error=seen.error,
                        outcome=classify_outcome(seen.error, seen.text, score, real.score, real.done, real.won, rules),
                    ), f"{traj.id} step {t}: {alt.action.key()}"
                    checked += 1
    finally:
        env.close()
    return checked


# ------------------------------------------------------------------------------------------ outcome classes
def test_each_outcome_class_by_hand() -> None:
    rules = rules_of_env("toy")  # the default failure patterns
    assert classify_outcome(False, "You unlock the door.", 0.5, 1.0, done=True, won=True, rules=rules) == "won"
    assert classify_outcome(True, "You can't do that.", 0.0, 0.0, done=True, won=True, rules=rules) == "won"
    assert classify_outcome(False, "Wrong box. Game over.", 0.5, 0.5, done=True, won=False, rules=rules) == "lost"
    assert classify_outcome(True, "The door is locked.", 0.0, 0.0, done=False, won=False, rules=rules) == "error"
    assert classify_outcome(False, "You can't do that.", 0.0, 0.0, done=False, won=False, rules=rules) == "error"
    assert classify_outcome(False, "You take the key.", 0.0, 0.5, done=False, won=False, rules=rules) == "progress"
    assert classify_outcome(False, "You are in room 2.", 0.5, 0.5, done=False, won=False, rules=rules) == "no_change"
    assert classify_outcome(False, "You drop the key.", 0.5, 0.0, done=False, won=False, rules=rules) == "no_change"
    shop = FailureRules(error=(), transient=(), replan=())  # an env whose failures are only those it flags
    assert classify_outcome(False, "You can't do that.", 0.0, 0.0, False, False, shop) == "no_change"
    assert score_change(0.5, 1.0) == 0.5 and score_change(1.0, 0.5) == -0.5
    assert OUTCOMES == ("error", "no_change", "progress", "won", "lost")


# ------------------------------------------------------------------------------------------ schema version 2
def _record(tmp_path: Path) -> dict:
    return json.loads(_collect(tmp_path, policies=["expert"], limit=1).read_text().splitlines()[0])


ALT = {
    "action": {"kind": "command", "text": "look", "name": "", "arguments": {}},
    "next_observation": "You are in room 1 of 3.",
    "reward": 0.0,
    "score": 0.0,
    "done": False,
    "won": False,
    "error": False,
    "outcome": "no_change",
}


def test_version_1_records_read_and_version_2_round_trips(tmp_path: Path) -> None:
    d = _record(tmp_path)
    assert d["schema_version"] == 2 and "alternatives" not in d["steps"][0]  # none: written as before
    v1 = {**copy.deepcopy(d), "schema_version": 1}
    assert validate_record(v1) == []
    assert Trajectory.from_dict(v1).to_dict() == d  # read as version 2 without alternatives
    d["steps"][0]["alternatives"] = [ALT, {**ALT, "action": {**ALT["action"], "text": "go east"}, "reward": 1}]
    traj = Trajectory.from_dict(d)
    assert traj.steps[0].alternatives[1].action == Action.command("go east")
    assert traj.to_dict() == d and Trajectory.from_dict(traj.to_dict()) == traj
    v1["steps"][0]["alternatives"] = [ALT]
    assert validate_record(v1) == [
        "steps[0].alternatives: a version-2 field in a version-1 record; set schema_version to 2"
    ]
    assert validate_record({**d, "schema_version": 3}) == [
        "schema_version: 3 is not supported (expected one of (1, 2))"
    ]


def test_alternatives_are_validated_field_by_field(tmp_path: Path) -> None:
    d = _record(tmp_path)
    bad = [
        {**ALT, "outcome": "maybe"},
        {k: v for k, v in ALT.items() if k != "score"} | {"surprise": 1},
        {**ALT, "done": "yes"},
        {**ALT, "done": True, "won": False, "outcome": "won"},
        {**ALT, "outcome": "lost"},
        {**ALT, "error": True},
        {**ALT, "action": {"kind": "teleport"}},
        "look",
    ]
    d["steps"][0]["alternatives"] = bad
    d["steps"][1]["alternatives"] = {"look": ALT}
    p = "steps[0].alternatives"
    assert validate_record(d) == [
        f"{p}[0].outcome: 'maybe' is not one of ('error', 'no_change', 'progress', 'won', 'lost')",
        f"{p}[1].score: missing",
        f"{p}[1].surprise: not an alternative field",
        f"{p}[2].done: expected bool, got str",
        f"{p}[3].outcome: 'won' but done is true and won False ('lost')",
        f"{p}[4].outcome: 'lost' but done is false",
        f"{p}[5].outcome: 'no_change' but error is true ('error')",
        f"{p}[6].action.kind: 'teleport' is not one of ('command', 'tool_call', 'answer', 'finish')",
        f"{p}[7]: expected an object, got str",
        "steps[1].alternatives: expected a list of objects, got dict",
    ]
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(d) + "\n")
    report = validate_file(path)
    assert f"{path}:1: {p}[4].outcome: 'lost' but done is false" in report.problems and not report.ok


# ------------------------------------------------------------------------------------------ toy env
def test_toy_alternatives_are_what_the_env_returns_and_the_stats_add_up(tmp_path: Path) -> None:
    src = _collect(tmp_path, limit=3)
    out = tmp_path / "cf.jsonl"
    report = _branch([src], out, per_state=3)
    assert report.written == 6 and not report.problems and validate_file(out).ok
    trajs = _trajectories(out)
    originals = {t.id: t for t in _trajectories(src)}
    for traj in trajs:  # the path itself is unchanged; alternatives are added to it
        assert [s.action for s in traj.steps] == [s.action for s in originals[traj.id].steps]
        assert all(1 <= len(s.alternatives) <= 3 for s in traj.steps)  # a toy state lists 3-4 actions
        for step in traj.steps:
            assert {a.action.text for a in step.alternatives} <= set(step.valid_actions) - {step.action.text}
    assert _check_against_a_fresh_env(out, "toy") == report.alternatives
    stats = json.loads(Path(f"{out}.stats.json").read_text())
    run, file = stats["run"], stats["file"]
    assert run["lines"] == run["selected"] + run["not_selected"] + sum(
        run["skipped"][r] for r in ("bad_line", "duplicate_id", "errored")
    )
    assert run["selected"] == run["already_done"] + run["written"] + run["skipped"]["diverged"] + run["unfinished"]
    assert file["alternatives"] == run["alternatives"] == sum(len(s.alternatives) for t in trajs for s in t.steps)
    assert sum(sum(row.values()) for row in file["outcomes"].values()) == file["alternatives"]
    assert file["states_branched"] == sum(len(t.steps) for t in trajs) and file["trajectories"] == 6
    assert "| corridor |" in Path(f"{out}.stats.md").read_text()
    again = tmp_path / "again.jsonl"
    _branch([src], again, per_state=3)
    assert again.read_text() == out.read_text()  # seeded: the same alternatives every time


def test_resume_skips_done_trajectories_and_never_writes_one_twice(tmp_path: Path) -> None:
    src = _collect(tmp_path, limit=3)
    out = tmp_path / "cf.jsonl"
    first = _branch([src], out, limit=2)
    assert (first.written, first.not_selected) == (2, 4)
    with open(out, "a") as f:  # a crash mid-append leaves a torn line
        f.write('{"id": "toy/corridor-2/exp')
    second = _branch([src], out)
    assert (second.already_done, second.written) == (2, 4)
    assert any("not valid JSON" in p for p in second.problems) and Path(f"{out}.torn").exists()
    ids = [t.id for t in _trajectories(out)]
    assert len(ids) == len(set(ids)) == 6
    third = _branch([src], out)
    assert (third.already_done, third.written, third.alternatives) == (6, 0, 0)
    assert json.loads(Path(f"{out}.stats.json").read_text())["file"]["trajectories"] == 6  # the whole file


def test_divergence_errored_and_bad_lines_are_skipped_and_counted(tmp_path: Path) -> None:
    src = _collect(tmp_path, limit=2)
    lines = src.read_text().splitlines()
    tampered = json.loads(lines[0])
    tampered["steps"][1]["next_observation"] = "You are somewhere else."
    errored = {**json.loads(lines[1]), "status": "errored", "error": "EnvCrashed: gone"}
    messy = tmp_path / "messy.jsonl"
    messy.write_text("\n".join([json.dumps(tampered), json.dumps(errored), "{not json", lines[2], lines[2]]) + "\n")
    out = tmp_path / "cf.jsonl"
    report = _branch([messy], out)
    assert report.skipped == {"diverged": 1, "errored": 1, "bad_line": 1, "duplicate_id": 1}
    assert [t.id for t in _trajectories(out)] == [json.loads(lines[2])["id"]]  # never recorded wrong
    assert any(p.startswith(f"{messy}:3: (json): not valid JSON") for p in report.problems)
    assert any(p.startswith(f"{tampered['id']}: not replayable: step 1 (") for p in report.problems)
    assert Path(f"{out}.rejects.jsonl").read_text() == "{not json\n"
    assert script.main(["--inputs", str(messy), "--out", str(tmp_path / "cli.jsonl"), "--progress", "false"]) == 1


def test_missing_input_and_unknown_env_are_clear_errors(tmp_path: Path, capsys) -> None:
    out = tmp_path / "cf.jsonl"
    assert script.main(["--inputs", str(tmp_path / "nope.jsonl"), "--out", str(out)]) == 2
    assert "no such file" in capsys.readouterr().err
    record = json.loads(_collect(tmp_path, policies=["expert"], limit=1).read_text().splitlines()[0])
    alien = tmp_path / "alien.jsonl"
    alien.write_text(json.dumps({**record, "env": "nosuchenv"}) + "\n")
    with pytest.raises(UnknownEnvError, match=r"env 'nosuchenv' of trajectory 'toy/corridor-0/expert/0'.*Install"):
        _branch([alien], out)
    assert not out.exists()  # checked before anything ran
    assert script.main(["--inputs", str(alien), "--out", str(out)]) == 2


def test_two_workers_give_the_same_records(tmp_path: Path) -> None:
    src = _collect(tmp_path, limit=2)
    one, two = tmp_path / "one.jsonl", tmp_path / "two.jsonl"
    _branch([src], one)
    report = _branch([src], two, workers=2)
    assert report.written == 4
    assert sorted(one.read_text().splitlines()) == sorted(two.read_text().splitlines())


# ------------------------------------------------------------------------------------------ tool env: the shop
def test_shop_alternatives_are_perturbed_tool_calls_as_the_env_answers_them(tmp_path: Path, shop_on_path) -> None:
    src = _collect(tmp_path, env="shop", policies=["expert"], limit=1)  # one task per family
    out = tmp_path / "cf.jsonl"
    report = _branch([src], out, per_state=50)  # every candidate: the outcome classes below are sure to occur
    assert report.written == 3 and not report.problems
    trajs = _trajectories(out)
    tools = {t["name"] for t in trajs[0].tools}
    alternatives = [a for t in trajs for s in t.steps for a in s.alternatives]
    assert all(a.action.kind == "tool_call" for a in alternatives)  # the shop's `finish` is one of its tools
    assert {a.action.name for a in alternatives} >= tools  # every tool of the task is tried
    assert any(a.action.name not in tools for a in alternatives)  # and unknown ones
    outcomes = {a.outcome for a in alternatives}
    assert {"error", "lost", "no_change"} <= outcomes  # an invalid call fails; finish() before shipping loses
    assert _check_against_a_fresh_env(out, "shop") == len(alternatives)


# ------------------------------------------------------------------------------------------ TextWorld-Express
def test_twx_alternatives_are_what_the_game_returns(tmp_path: Path) -> None:
    pytest.importorskip("textworld_express")
    if shutil.which("java") is None:
        pytest.skip("TextWorld-Express needs Java")
    src = _collect(tmp_path, env="twx", families=["arithmetic"], limit=1, policies=["expert"])
    out = tmp_path / "cf.jsonl"
    report = _branch([src], out, per_state=100, env_kwargs={"gold_path": False})
    assert report.written == 1 and not report.problems
    (traj,) = _trajectories(out)
    assert {a.outcome for s in traj.steps for a in s.alternatives} >= {"lost", "no_change"}  # a wrong answer loses
    assert _check_against_a_fresh_env(out, "twx") == report.alternatives
