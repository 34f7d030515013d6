"""A tiny deterministic text game for tests and examples: fetch a key, walk to the door, open it.

No JVM and no package: tests of collection, datasets and the planning loop use it to run in
milliseconds. `simplan envs check toy` validates it like any other adapter.

World (per seed): a corridor of 3-5 rooms, the key in one room, a locked door in the last one.
"""

from __future__ import annotations

import re

from simplan.envs.base import Action, ActionParseError, Observation, StepResult, Task
from simplan.envs.subgoals import Fact

_FOLD_SEEDS = {"train": range(0, 100), "dev": range(100, 150), "test": range(150, 200)}
_VERBS = ("go east", "go west", "take key", "open door", "look", "inventory")
_ROOM = re.compile(r"^You are in room (\d+) of \d+\.")


class ToyEnv:
    name = "toy"

    def __init__(self, max_rooms: int = 5) -> None:
        self.max_rooms = max_rooms
        self._task: Task | None = None

    # -- task listing ------------------------------------------------------------------------
    def tasks(self, fold: str, families: list[str] | None = None, limit: int | None = None) -> list[Task]:
        if fold not in _FOLD_SEEDS:
            raise ValueError(f"fold {fold!r}: expected one of {sorted(_FOLD_SEEDS)}")
        if families and "corridor" not in families:
            return []
        seeds = list(_FOLD_SEEDS[fold])[: limit if limit is not None else None]
        return [
            Task(env=self.name, task_id=f"corridor-{s}", fold=fold, family="corridor", params={"seed": s})
            for s in seeds
        ]

    # -- episode -----------------------------------------------------------------------------
    def reset(self, task: Task) -> Observation:
        seed = int(task.params.get("seed", task.task_id.rsplit("-", 1)[-1]))
        self._task = task
        self.n_rooms = 3 + seed % (self.max_rooms - 2)
        self.key_room = (seed * 7) % (self.n_rooms - 1)
        self.pos = 0
        self.has_key = False
        self.door_open = False
        self._last_score = 0.0
        self.goal = "Take the key and open the door at the east end of the corridor."
        return self._observe(self._describe(), error=False)

    def _describe(self) -> str:
        parts = [f"You are in room {self.pos + 1} of {self.n_rooms}."]
        if self.pos == self.key_room and not self.has_key:
            parts.append("A key lies on the floor.")
        if self.pos == self.n_rooms - 1:
            parts.append("The door is open." if self.door_open else "There is a locked door here.")
        return " ".join(parts)

    def valid_actions(self) -> list[str]:
        acts = ["look", "inventory"]
        if self.pos < self.n_rooms - 1:
            acts.append("go east")
        if self.pos > 0:
            acts.append("go west")
        if self.pos == self.key_room and not self.has_key:
            acts.append("take key")
        if self.pos == self.n_rooms - 1 and not self.door_open:
            acts.append("open door")
        return sorted(acts)

    def _observe(self, text: str, error: bool) -> Observation:
        return Observation(text=text, goal=self.goal, valid_actions=self.valid_actions(), error=error)

    def _score(self) -> float:
        return 0.5 * self.has_key + 0.5 * self.door_open

    def step(self, action: Action) -> StepResult:
        if self._task is None:
            raise RuntimeError("ToyEnv.step called before reset")
        cmd = action.text.strip().lower() if action.kind == "command" else ""
        error = False
        if cmd not in self.valid_actions():
            text, error = "You can't do that.", True
        elif cmd == "go east":
            self.pos += 1
            text = self._describe()
        elif cmd == "go west":
            self.pos -= 1
            text = self._describe()
        elif cmd == "take key":
            self.has_key = True
            text = "You take the key."
        elif cmd == "open door":
            if self.has_key:
                self.door_open = True
                text = "You unlock the door with the key and open it."
            else:
                text, error = "The door is locked. You need a key.", True
        elif cmd == "inventory":
            text = "You carry: a key." if self.has_key else "You carry nothing."
        else:
            text = self._describe()
        before = self._last_score
        score = self._score()
        self._last_score = score
        done = self.door_open
        return StepResult(
            observation=self._observe(text, error),
            reward=score - before,
            score=score,
            done=done,
            won=self.door_open,
            info={"tasksuccess": self.door_open},
        )

    def expert_plan(self) -> list[Action]:
        plan = ["go east"] * self.key_room + ["take key"] + ["go east"] * (self.n_rooms - 1 - self.key_room)
        return [Action.command(c) for c in plan + ["open door"]]

    def inverse(self, action: Action) -> Action | None:
        """A move back (EnvDefaults.inverse): "go east" undoes "go west" and the other way round; nothing else."""
        back = {"go east": "go west", "go west": "go east"}.get(action.text if action.kind == "command" else "")
        return Action.command(back) if back is not None else None

    def facts(self, action: Action | None, observation: str | None, error: bool) -> list[Fact]:
        """The belief-state facts of an answer (EnvDefaults.facts): the room the agent is in, the key once taken."""
        if observation is None or error:
            return []
        if room := _ROOM.match(observation):
            return [Fact("location", "", {"room": room.group(1)})]
        return [Fact("inventory", "key")] if observation == "You take the key." else []

    def parse_action(self, text: str) -> Action:
        cmd = " ".join(text.strip().lower().split())
        if not cmd:
            raise ActionParseError("empty action")
        if "\n" in text.strip():
            raise ActionParseError(f"an action is one line, got {text!r}")
        return Action.command(cmd)

    def close(self) -> None:
        self._task = None
