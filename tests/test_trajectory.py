"""Trajectory schema: round trip, field-level validation messages, and validate/convert agreement."""

from __future__ import annotations

import copy
import json
import random
from collections.abc import Iterator

import pytest

from simplan.data.trajectory import InvalidRecord, Step, Trajectory, validate_record
from simplan.envs.actions import render_action
from simplan.envs.base import Action, Task
from simplan.envs.registry import make_env


def _expert_trajectory() -> Trajectory:
    env = make_env("toy")
    task = env.tasks("train", limit=1)[0]
    obs = env.reset(task)
    traj = Trajectory(
        id=f"toy/{task.task_id}/expert/0",
        env="toy",
        task=task,
        goal=obs.goal,
        policy="expert",
        initial_observation=obs.text,
    )
    for i, action in enumerate(env.expert_plan()):
        before = obs
        res = env.step(action)
        obs = res.observation
        traj.steps.append(
            Step(
                index=i,
                observation=before.text,
                action=action,
                next_observation=obs.text,
                reward=res.reward,
                score=res.score,
                done=res.done,
                won=res.won,
                error=obs.error,
                valid_actions=before.valid_actions,
            )
        )
    traj.success, traj.final_score = res.won, res.score
    return traj


def test_round_trip_and_expert_success():
    traj = _expert_trajectory()
    assert traj.success and traj.steps[-1].done
    d = traj.to_dict()
    assert validate_record(d) == []
    again = Trajectory.from_dict(d)
    assert again.to_dict() == d
    assert again.steps[0].action == Action.command(traj.steps[0].action.text)
    assert again.task == Task.from_dict(d["task"])


def test_validation_names_the_field():
    d = _expert_trajectory().to_dict()
    d["steps"][1]["action"]["kind"] = "teleport"
    d["steps"][0]["reward"] = "lots"
    d["task"]["fold"] = "validation"
    problems = validate_record(d)
    assert "steps[1].action.kind: 'teleport' is not one of ('command', 'tool_call', 'answer', 'finish')" in problems
    assert "steps[0].reward: expected int, got str" in problems
    assert any(p.startswith("task.fold:") for p in problems)
    assert validate_record([1, 2]) == ["(record): expected a JSON object, got list"]
    del d["steps"]
    assert validate_record(d) == ["steps: missing"]


def test_validation_is_deep_and_names_the_path():
    d = _expert_trajectory().to_dict()
    d["steps"][0]["action"]["text"] = 7
    d["steps"][1]["action"] = {"kind": "tool_call", "name": "go", "arguments": ["east"]}
    d["steps"][2]["score"] = float("nan")
    d["steps"][2]["info"] = {"x": [1.0, float("-inf")], "tools": "all"}
    d["meta"] = {"note": "bad \udc80 text"}
    problems = validate_record(d)
    assert problems == [
        "steps[0].action.text: expected a string or null, got int",
        "steps[1].action.arguments: expected an object of argument names to values, got list",
        "steps[2].info.tools: expected a list of objects or null, got str",
        "steps[2].score: nan is not a finite number",
        "steps[2].info.x[1]: -inf is not a finite number",
        "meta.note: not valid Unicode (a lone surrogate at character 5)",
    ]
    with pytest.raises(InvalidRecord) as e:
        Trajectory.from_dict(d)
    assert e.value.problems == problems
    with pytest.raises(InvalidRecord, match=r"^action\.text: expected a string or null, got int$"):
        Step.from_dict(d["steps"][0])


SHAPES = (None, 0, -1, 2.5, float("nan"), True, "", "x", "\udc80", [], ["a"], [1])


def _mutations(rng: random.Random, d: dict) -> Iterator[tuple[list, object]]:
    """(path, value) pairs: every field of the record set to values of the wrong (or right) shape."""
    values = [*SHAPES, {"kind": "finish"}, {"a": 1}, {}]
    paths: list[list] = []

    def walk(obj: object, path: list) -> None:
        if isinstance(obj, dict):
            for k, v in obj.items():
                paths.append([*path, k])
                walk(v, [*path, k])
        elif isinstance(obj, list):
            for i, v in enumerate(obj):
                paths.append([*path, i])
                walk(v, [*path, i])

    walk(d, [])
    for _ in range(600):
        yield rng.choice(paths), rng.choice(values)


def test_whatever_validates_converts_and_renders_and_nothing_else_does():
    """The build path (from_dict, then every prompt and completion) never fails on a record validate passes."""
    from simplan.data import format as fmt

    good = _expert_trajectory().to_dict()
    good["steps"][1]["info"] = {"goal": "new goal", "tools": [{"name": "go"}]}
    accepted = rejected = 0
    for path, value in _mutations(random.Random(0), good):
        d = copy.deepcopy(good)
        obj = d
        for key in path[:-1]:
            obj = obj[key]
        obj[path[-1]] = value
        if validate_record(d):
            rejected += 1
            with pytest.raises(InvalidRecord):
                Trajectory.from_dict(d)
            continue
        accepted += 1
        traj = Trajectory.from_dict(d)
        for step, state in zip(traj.steps, fmt.trajectory_states(traj)):
            fmt.decider_messages(state)
            fmt.simulator_messages(state, step.action)
            render_action(step.action)
            fmt.observation_completion(step.next_observation)
        json.dumps(traj.to_dict(), allow_nan=False).encode("utf-8")
    assert accepted > 50 and rejected > 200, (accepted, rejected)
