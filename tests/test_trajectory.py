"""Trajectory schema: round trip and field-level validation messages."""

from __future__ import annotations

from simplan.data.trajectory import Step, Trajectory, validate_record
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
