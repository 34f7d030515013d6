"""Replay a recorded step in its environment: is another action as good as the expert's next one?

Exact match against the expert's next action counts a decider wrong whenever the expert's order is
one of several equally short ones: sorting's items may be picked up in any order before they go in
the box, twc's objects taken in any order before they are put away. `equally_short` tells such
predictions apart from real mistakes by playing them:

1. reset the trajectory's task and replay its actions up to the step (the reached observation must
   equal the recorded one, else the env is not replayable and the verdict is `unknown`);
2. find what is left to do: the expert plan's actions are matched in order against the replayed
   ones (mistakes and their undoing in noisy-expert runs are skipped), and the rest of the plan is
   what follows, after the step's recorded action where that is not the plan's next one (a recovery
   that undoes a mistake);
3. the prediction is `equivalent` when it is one of those later actions and playing it now, then the
   rest without it, wins with no failed step in at most as many steps: as short as the expert, only
   in another order. A later action that does not win that way is `worse`; anything else (not in
   the rest) is `other`.

A sufficient test, not a complete one: an equally short path the expert plan does not contain (a
different route) is `other`. So `exact <= exact + equivalent <= the share of actions as good as
the expert's`.
"""

from __future__ import annotations

from typing import Literal

from simplan.data.trajectory import Trajectory
from simplan.envs.base import Action, ActionParseError, Env
from simplan.envs.registry import make_env

Verdict = Literal["equivalent", "worse", "other", "unknown"]


def plan_position(plan: list[str], done: list[str]) -> int:
    """How many of the plan's actions (keys) `done` has played in order; other actions are skipped."""
    position = 0
    for key in done:
        if position < len(plan) and key == plan[position]:
            position += 1
    return position


class Replayer:
    """Replays steps of recorded trajectories; keeps one env per env name and closes them on exit."""

    def __init__(self) -> None:
        self._envs: dict[str, Env] = {}

    def _env(self, name: str) -> Env:
        if name not in self._envs:
            self._envs[name] = make_env(name)
        return self._envs[name]

    def _replay(self, env: Env, traj: Trajectory, step: int) -> list[Action] | None:
        """Reset the trajectory's task and play its first `step` actions; returns the expert plan
        (read right after the reset), or None when the env has none or did not reach the recorded
        observation (not replayable: its dynamics or its expert are random)."""
        text = env.reset(traj.task).text
        try:
            plan = env.expert_plan()
        except RuntimeError:  # no expert plan for this task
            return None
        for recorded in traj.steps[:step]:
            text = env.step(recorded.action).observation.text
        expected = traj.steps[step - 1].next_observation if step else traj.initial_observation
        return plan if " ".join(text.split()) == " ".join(expected.split()) else None

    def equally_short(self, traj: Trajectory, step: int, prediction: str) -> Verdict:
        """Verdict on playing `prediction` (model output text) instead of the expert at `traj.steps[step]`."""
        if not 0 <= step < len(traj.steps):
            raise IndexError(f"trajectory {traj.id}: no step {step} (it has {len(traj.steps)})")
        env = self._env(traj.env)
        try:
            action = env.parse_action(prediction)
        except ActionParseError:
            return "other"
        plan = self._replay(env, traj, step)
        if plan is None:
            return "unknown"
        done = [s.action.key() for s in traj.steps[:step]]
        rest = plan[plan_position([a.key() for a in plan], done) :]
        target = traj.steps[step].action
        if not rest or rest[0].key() != target.key():
            rest = [target, *rest]  # a recovery that undoes a mistake, then the plan goes on
        keys = [a.key() for a in rest]
        if action.key() not in keys[1:]:
            return "other"
        later = list(rest)
        del later[keys.index(action.key(), 1)]
        for move in [action, *later]:  # the env stands at the step: play the prediction first
            result = env.step(move)
            if result.observation.error:
                return "worse"
            if result.won:
                return "equivalent"
            if result.done:
                return "worse"
        return "worse"

    def close(self) -> None:
        for env in self._envs.values():
            env.close()
        self._envs.clear()

    def __enter__(self) -> Replayer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
