"""Recording an episode: actions played in an env, kept as the Steps of one Trajectory (a continuous real run).

    from simplan.data.recorder import EpisodeSpec, Recorder
    rec = Recorder(env, EpisodeSpec(task, "expert", "0"), meta={"kind": "episode"})
    rec.act(Action.command("look around"), "expert")      # steps the env, records the Step
    rec.restore(0)                                          # reset, replay the first 0 recorded actions
    trajectory = rec.finish()

An `EpisodeSpec` names one episode ("{env}/{task_id}/{policy}/{attempt}"). Steps keep the env's `info`;
when an observation brings a new goal (a BFCL user turn, a TWX recipe or map the agent has read),
`info["goal"]` holds it, and when it changes the tool list (BFCL miss_func adds functions mid episode),
`info["tools"]` holds the new list. `Recorder.note` records an action that never reached the env, and
`branch_record` splits off-path steps into a record of their own (simulator data only). Collection
(data/collect.py, data/policies.py) and trace harvesting (`simplan traces`) record through it.

Given the env's failure rules (`notes=`, as collection does), a step that failed for good (not transiently)
leaves the planner's note of a failed step (data/format.py failed_step_note) in the next step's `notes`, the
note every planning arm writes there; harvesting copies the traced notes instead. Each step keeps what its
observation told as belief-state facts (`Step.facts`, by the env's `facts`; the planner extracts the same).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any

from simplan.data.format import failed_step_note
from simplan.data.trajectory import Step, Trajectory
from simplan.envs.actions import render_action
from simplan.envs.base import Action, Env, StepResult, Task
from simplan.envs.failures import FailureRules
from simplan.envs.subgoals import env_facts


@dataclass(frozen=True)
class EpisodeSpec:
    """One episode to collect. `attempt` is a number, `branch{k}` for a branch transition or `lose{k}` for a
    losing branch."""

    task: Task
    policy: str
    attempt: str

    @property
    def id(self) -> str:
        return episode_id(self.task.env, self.task.task_id, self.policy, self.attempt)


def episode_id(env: str, task_id: str, policy: str, attempt: int | str) -> str:
    return f"{env}/{task_id}/{policy}/{attempt}"


def jsonable(value: Any) -> Any:
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        return json.loads(json.dumps(value, default=str))


class Recorder:
    """Plays actions in an env and records them as Steps of one Trajectory (a continuous real run)."""

    def __init__(self, env: Env, spec: EpisodeSpec, meta: dict[str, Any], notes: FailureRules | None = None) -> None:
        self.env, self.spec, self.notes = env, spec, notes
        self.pending: list[str] = []  # the notes of the next step (shown with the current observation)
        self.env_steps = 0
        self.obs = env.reset(spec.task)
        self.facts = self._facts(None, self.obs.text, False)  # what the current observation told (Step.facts)
        self.last: StepResult | None = None
        self.traj = Trajectory(
            id=spec.id,
            env=spec.task.env,
            task=spec.task,
            goal=self.obs.goal,
            policy=spec.policy,
            initial_observation=self.obs.text,
            tools=jsonable(self.obs.tools),
            meta=dict(meta),
        )

    @property
    def steps(self) -> list[Step]:
        return self.traj.steps

    @property
    def score(self) -> float:
        return self.last.score if self.last is not None else 0.0

    @property
    def done(self) -> bool:
        return self.last is not None and self.last.done

    def act(self, action: Action, source: str) -> StepResult:
        before = self.obs
        result = self.env.step(action)
        self.env_steps += 1
        obs = result.observation
        info = jsonable(dict(result.info or {}))
        if obs.goal and obs.goal != self.traj.goal:  # a BFCL user turn, or what a TWX agent read
            info["goal"] = obs.goal
        if obs.tools is not None and before.tools is not None and obs.tools != before.tools:
            info["tools"] = jsonable(obs.tools)
        self.steps.append(
            Step(
                index=len(self.steps),
                observation=before.text,
                action=action,
                next_observation=obs.text,
                reward=float(result.reward),
                score=float(result.score),
                done=bool(result.done),
                won=bool(result.won),
                error=bool(obs.error),
                valid_actions=list(before.valid_actions) if before.valid_actions is not None else None,
                source=source,
                info=info,
                notes=self.pending,
                facts=self.facts,
            )
        )
        self.obs, self.last = obs, result
        self.pending = self._notes_after(action, obs.text, bool(obs.error))
        self.facts = self._facts(action, obs.text, bool(obs.error))
        return result

    def _facts(self, action: Action | None, observation: str, error: bool) -> list[dict[str, Any]]:
        return [f.to_dict() for f in env_facts(self.env, action, observation, error)]

    def _notes_after(self, action: Action, observation: str, flagged: bool) -> list[str]:
        """The notes a step leaves for the next one: a failure the env flagged, unless transient, gets the failed
        step's note (the planner's condition, inference/planning/planner.py `_act`)."""
        cls = self.notes.failure_class(observation, True) if self.notes is not None and flagged else None
        if cls is None or cls == "transient":
            return []
        return [failed_step_note(render_action(action), cls)]

    def note(self, action: Action, text: str, source: str) -> None:
        """Record an action that never reached the env (an injected transient fault, evaluation/faults.py): it
        failed with `text` and the state is unchanged."""
        before = self.obs
        self.steps.append(
            Step(
                index=len(self.steps),
                observation=before.text,
                action=action,
                next_observation=text,
                score=float(self.score),
                error=True,
                valid_actions=list(before.valid_actions) if before.valid_actions is not None else None,
                source=source,
                notes=self.pending,
                facts=self.facts,
            )
        )
        self.obs = replace(before, text=text, error=True)
        self.pending = []  # a fault the env never ran is transient: retried, not noted
        self.facts = self._facts(action, text, True)  # as the planner extracts them from the failed step

    def restore(self, keep: int) -> bool:
        """Reset and replay the first `keep` recorded actions; the replayed steps replace the record.

        Returns whether the replay reproduced the recorded observations (a deterministic env).
        """
        old = self.steps[:keep]
        self.obs = self.env.reset(self.spec.task)
        matched = self.obs.text == self.traj.initial_observation
        self.traj.initial_observation = self.obs.text
        self.traj.steps = []
        self.last, self.pending = None, []
        self.facts = self._facts(None, self.obs.text, False)
        for step in old:
            self.act(step.action, step.source)
            matched = matched and self.steps[-1].next_observation == step.next_observation
        return matched

    def finish(self, truncated: bool = False) -> Trajectory:
        self.traj.success = bool(self.last is not None and self.last.won)
        self.traj.final_score = float(self.score)
        self.traj.status = "truncated" if truncated and not self.done else "ok"
        return self.traj


def branch_record(rec: Recorder, steps: list[Step], branch_step: int, tag: str) -> Trajectory:
    """A split-off record of off-path steps (simulator data only)."""
    last = steps[-1]
    return Trajectory(
        id=episode_id(rec.spec.task.env, rec.spec.task.task_id, "random", tag),
        env=rec.traj.env,
        task=rec.traj.task,
        goal=rec.traj.goal,
        policy="random",
        initial_observation=rec.traj.initial_observation,
        steps=[Step.from_dict(s.to_dict()) for s in steps],
        tools=rec.traj.tools,
        success=last.won,
        final_score=last.score,
        status="ok",
        meta={**rec.traj.meta, "kind": "branch", "parent": rec.traj.id, "branch_step": branch_step},
    )
