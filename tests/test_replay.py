"""Replaying a miss in its environment: an equally short other order vs a real mistake."""

from __future__ import annotations

from pathlib import Path

import pytest

from simplan.data.replay import Replayer, plan_position
from simplan.data.trajectory import Step, Trajectory
from simplan.envs.base import Action, ActionParseError, Observation, StepResult, Task, parse_command
from simplan.envs.registry import register
from simplan.evaluation.offline import EvalModelConfig, decider_metrics, load_replay_trajectories, replay_verdicts


class PantryEnv:
    """Take an apple and a pear in any order, then put both in the basket; 'eat apple' loses it."""

    name = "pantry"

    def tasks(self, fold: str, families: list[str] | None = None, limit: int | None = None) -> list[Task]:
        return [Task(env=self.name, task_id="pantry-0", fold=fold, family="pantry", params={})]

    def reset(self, task: Task) -> Observation:
        self.where = {"apple": "shelf", "pear": "shelf"}
        return self._obs("A shelf holds an apple and a pear. A basket is empty.")

    def _obs(self, text: str, error: bool = False) -> Observation:
        return Observation(text=text, goal="Put the apple and the pear in the basket.", error=error)

    def step(self, action: Action) -> StepResult:
        verb, _, thing = action.text.partition(" ")
        thing = thing.removesuffix(" in basket")
        if verb == "take" and self.where.get(thing) == "shelf":
            self.where[thing] = "hand"
            return StepResult(observation=self._obs(f"You take the {thing}."))
        if verb == "put" and self.where.get(thing) == "hand":
            self.where[thing] = "basket"
            won = all(w == "basket" for w in self.where.values())
            return StepResult(observation=self._obs(f"The {thing} is in the basket."), won=won, done=won)
        if verb == "drop" and self.where.get(thing) == "hand":
            self.where[thing] = "shelf"
            return StepResult(observation=self._obs(f"You put the {thing} back on the shelf."))
        if verb == "eat" and self.where.get(thing) == "hand":
            self.where[thing] = "eaten"
            return StepResult(observation=self._obs(f"You eat the {thing}."))
        return StepResult(observation=self._obs("Nothing happens.", error=True))

    def expert_plan(self) -> list[Action]:
        return [Action.command(c) for c in ("take apple", "take pear", "put apple in basket", "put pear in basket")]

    def parse_action(self, text: str) -> Action:
        return parse_command(text)

    def close(self) -> None:
        pass


register("pantry", PantryEnv)


def _trajectory(actions: list[str], sources: list[str] | None = None) -> Trajectory:
    env = PantryEnv()
    task = env.tasks("dev")[0]
    first = env.reset(task).text
    steps, text = [], first
    for i, command in enumerate(actions):
        result = env.step(Action.command(command))
        source = sources[i] if sources else "expert"
        steps.append(
            Step(
                index=i,
                observation=text,
                action=Action.command(command),
                next_observation=result.observation.text,
                won=result.won,
                source=source,
            )
        )
        text = result.observation.text
    return Trajectory(
        id=f"pantry/{len(actions)}",
        env="pantry",
        task=task,
        goal="g",
        policy="expert",
        initial_observation=first,
        steps=steps,
    )


EXPERT = ["take apple", "take pear", "put apple in basket", "put pear in basket"]


def test_plan_position_skips_mistakes_in_between() -> None:
    plan = ["a", "b", "c"]
    assert plan_position(plan, []) == 0
    assert plan_position(plan, ["a", "x", "b"]) == 2
    assert plan_position(plan, ["b", "a"]) == 1  # in order only


def test_another_order_of_interchangeable_steps_is_equivalent() -> None:
    traj = _trajectory(EXPERT)
    with Replayer() as replayer:
        assert replayer.equally_short(traj, 0, "take pear") == "equivalent"
        assert replayer.equally_short(traj, 2, "put pear in basket") == "equivalent"
        # A later plan step that cannot be done yet, an action not in the plan, output that does not parse:
        assert replayer.equally_short(traj, 0, "put apple in basket") == "worse"
        assert replayer.equally_short(traj, 1, "eat apple") == "other"
        assert replayer.equally_short(traj, 1, "take pear\ntake apple") == "other"


def test_after_a_mistake_the_undoing_step_is_part_of_what_is_left() -> None:
    # take apple, (mistake) drop apple, (recovery) take apple, then the plan goes on.
    traj = _trajectory(
        ["take apple", "drop apple", *EXPERT], ["expert", "noise", "recovery", "expert", "expert", "expert"]
    )
    with Replayer() as replayer:
        assert replayer.equally_short(traj, 2, "take pear") == "equivalent"  # pear first, apple again after
        assert replayer.equally_short(traj, 2, "put apple in basket") == "worse"


def test_a_step_the_env_does_not_reproduce_is_unknown() -> None:
    traj = _trajectory(EXPERT)
    traj.steps[0].next_observation = "You take a banana."  # recorded by another version of the game
    with Replayer() as replayer:
        assert replayer.equally_short(traj, 1, "put apple in basket") == "unknown"
        with pytest.raises(IndexError, match="no step 9"):
            replayer.equally_short(traj, 9, "take pear")


def test_parse_errors_of_the_env_count_as_other() -> None:
    class Strict(PantryEnv):
        def parse_action(self, text: str) -> Action:
            raise ActionParseError("never")

    register("pantry-strict", Strict)
    traj = _trajectory(EXPERT)
    traj.env = "pantry-strict"
    with Replayer() as replayer:
        assert replayer.equally_short(traj, 0, "take pear") == "other"


def test_eval_model_replay_counts_equivalent_misses(tmp_path: Path) -> None:
    traj = _trajectory(EXPERT)
    files = tmp_path / "dev.jsonl"
    files.write_text(traj.to_json() + "\n", encoding="utf-8")
    rows = [
        {"completion": a, "trajectory_id": traj.id, "step": i, "family": "pantry", "valid_actions": []}
        for i, a in enumerate(EXPERT)
    ]
    preds = ["take pear", "take pear", "put pear in basket", "eat apple"]
    cfg = EvalModelConfig(role="decider", dataset=str(tmp_path), replay=True, trajectories=str(files))
    verdicts = replay_verdicts(load_replay_trajectories(cfg, rows), rows, preds)
    assert verdicts == ["equivalent", None, "equivalent", "other"]
    as_folder = EvalModelConfig(role="decider", dataset=str(tmp_path), replay=True, trajectories=str(tmp_path))
    # Folders and globs are read as `simplan build` reads them.
    assert replay_verdicts(load_replay_trajectories(as_folder, rows), rows, preds) == verdicts
    metrics = decider_metrics(preds, [True] * 4, rows, verdicts)
    assert metrics["exact"] == 0.25 and metrics["equivalent"] == 0.5
    assert metrics["exact_or_equivalent"] == 0.75 and metrics["replay_unknown"] == 0.0

    rows[1]["completion"] = "take banana"  # a dataset built from other files: refuse, name the option
    with pytest.raises(ValueError, match="--trajectories"):
        replay_verdicts(load_replay_trajectories(cfg, rows), rows, ["take pear", "take pear", "x", "x"])
    with pytest.raises(FileNotFoundError, match="--trajectories"):
        load_replay_trajectories(EvalModelConfig(dataset=str(tmp_path), replay=True), rows)
    with pytest.raises(ValueError, match="only the decider"):
        EvalModelConfig(role="simulator", dataset="d", replay=True)
