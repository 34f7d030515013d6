"""TextWorld-Express (textworld-express==1.1.0) as a simplan environment: 8 text games, TWX's own folds.

    env = make_env("twx")                               # or TextWorldExpressEnv(game_params={...})
    task = env.tasks("dev", families=["coin"], limit=1)[0]          # "coin-dev-0"
    obs = env.reset(task)                               # obs.goal, obs.text, obs.valid_actions
    result = env.step(env.parse_action("look around"))
    plan = env.expert_plan()                            # TWX's gold path for this episode
    env.close()                                         # shuts the JVM down
    simplan envs check twx                              # the generic adapter check

Games (`Task.family`): cookingworld, twc, coin, mapreader, arithmetic, sorting, simonsays,
peckingorder. Folds are TWX's own seed lists (train 0-999, dev 10000-10999, test 20000-20999 in
1.1.0, read from the JVM); the fold also selects TWX's object set (`gameSet`), so train games never
share their items with dev/test. `task_id` is "{game}-{fold}-{index}" (index into the fold's seed
list; `params["seed"]` is the TWX seed), `params` = {"game", "seed", "game_params"}: a task carries
the game parameters it was listed with, so it replays the same world under any adapter config.

Game parameters (`game_params`, a dict game -> TWX `gameParams` string, merged over the defaults
below). TWX's own defaults give cookingworld gold paths up to ~130 steps (mean 44, 30% over 50) and
up to 76 valid actions, so the defaults here keep every gold path well under a 50-step budget
(measured on 100 train seeds per game: max gold length in brackets):
- cookingworld  numLocations=3,numIngredients=2,numDistractorItems=5,includeDoors=0,limitInventorySize=0 [23]
- coin          numLocations=5,numDistractorItems=5,includeDoors=1,limitInventorySize=0 [29]
- twc           numLocations=2,numItemsToPutAway=3,includeDoors=0,limitInventorySize=0 [13]
- mapreader, arithmetic, sorting, simonsays, peckingorder: TWX defaults [13, 5, 10, 5, 9]
  (mapreader with fewer locations, e.g. numLocations=8, makes TWX throw while generating some seeds)
Pass `game_params={"cookingworld": ""}` for TWX's own defaults of a game.

Episode semantics.
- `Observation.goal` is TWX's task description, followed by what the agent has read so far this
  episode (`goal_with_reading`: the cookbook's recipe, the map, the math problem, the latest
  instruction), so that a prompt's few recent steps never lose the text that defines the task.
- `Observation.valid_actions` are TWX's valid actions for the current state (sorted).
- `Observation.error` is True when the command is not among the valid actions (TWX answers
  "Unknown action: I'm not sure what you mean.") or TWX's answer says it had no effect ("That is
  already open.", "You can't move there, the door is closed.", a full inventory, ...). The command is
  still sent to TWX, so the observation is TWX's own text. The adapter's `error_patterns` are the same
  patterns, so the planner's judge reads a predicted "That is already open." as the failure it is. A
  valid but wrong move (e.g. simonsays "Incorrect!") is not an error: it is a task failure
  (`info["taskfailure"]`, score -1, done).
- `StepResult.score` is TWX's score: 0..1, but arithmetic, sorting, simonsays and peckingorder end a
  failed episode with -1. `won` is `info["tasksuccess"]` or score >= 1. `done` on success, failure,
  or after `max_steps` steps (`info["truncated"]`; default 200, above TWX's longest gold paths even
  with its own game defaults; agents set their own, smaller budgets).
- A step after `done` does not reach TWX: it returns an error observation with done=True.
- `expert_plan()` is TWX's gold path, generated at reset (`generateGoldPath=True`) and cached then,
  because `getGoldActionSequence()` is not deterministic for twc and coin. At reset the gold path is
  replayed once (milliseconds) and steps TWX answers as errors are dropped (cookingworld's gold path
  opens cupboards that are already open), so expert trajectories hold no spurious failures, and a
  move undone by a later one with only doors opened in between is dropped first (`drop_back_and_forth`:
  coin's random detours);
  `expert_solves` records whether it reached success (TWX's gold path fails on a few seeds whose
  worlds hold two objects of one name: 55 of the 1,000 peckingorder dev seeds, e.g. peckingorder-dev-22
  with two cucumbers; every other seed of every game and fold is solved with the defaults above).

JVM. One adapter = one JVM (started lazily, ~0.3 s), reused across episodes. If it dies, `step`
raises `envs.base.EnvCrashed` (mark the episode errored) and the next `reset` starts a new one.
"""

from __future__ import annotations

import re
from typing import Any

from simplan.envs.base import FOLDS, Action, EnvCrashed, Observation, StepResult, Task, parse_command
from simplan.envs.failures import compile_patterns, matches
from simplan.envs.jvm import JvmEnvLifecycle, JvmHandle
from simplan.envs.subgoals import Fact

GAMES: tuple[str, ...] = (
    "cookingworld",
    "twc",
    "coin",
    "mapreader",
    "arithmetic",
    "sorting",
    "simonsays",
    "peckingorder",
)
DEFAULT_GAME_PARAMS: dict[str, str] = {
    "cookingworld": "numLocations=3,numIngredients=2,numDistractorItems=5,includeDoors=0,limitInventorySize=0",
    "coin": "numLocations=5,numDistractorItems=5,includeDoors=1,limitInventorySize=0",
    "twc": "numLocations=2,numItemsToPutAway=3,includeDoors=0,limitInventorySize=0",
    "mapreader": "",
    "arithmetic": "",
    "sorting": "",
    "simonsays": "",
    "peckingorder": "",
}
# TWX answers to commands that did nothing (collected from the jar's strings and random play). The adapter's
# `error_patterns`: the judge and the error pivot read failures in predicted texts with the same patterns the
# adapter flags real ones with (the defaults miss "That is already open.").
ERROR_PATTERNS: tuple[str, ...] = (
    r"^\s*(unknown action|i'm not sure what you mean|that is already (open|closed)|you can't|"
    r"you are unable to|.*you can't pick up another item)",
)
_ERROR_RES = compile_patterns(ERROR_PATTERNS)
# game -> fold -> seeds. Reading 3 x 1,000 seeds through py4j costs ~1 s per game, and TWX's seed lists
# do not depend on gameParams, so every adapter in the process shares them.
_SEED_CACHE: dict[str, dict[str, list[int]]] = {}
AFTER_DONE_TEXT = "The episode is over; call reset() to start a new one."
MAX_ACTION_CHARS = 200


def _make_twx() -> Any:
    from textworld_express import TextWorldExpressEnv as _TWX

    # The adapter enforces its own step budget; TWX's own limit is set out of the way.
    return _TWX(envStepLimit=10**9)


_OPPOSITE = {"north": "south", "south": "north", "east": "west", "west": "east"}
_PUT = re.compile(r"put (.+?) (?:in|on) (.+)")  # "put blue cap in shoe cabinet": the thing, where it went


def drop_back_and_forth(gold: list[str], through_doors: bool = True) -> list[str]:
    """The gold path without detours: a move whose way back follows with nothing but doors opened
    in between ("move south", "open door to west", "move north").

    TWX's coin gold paths carry such detours at random: two collections of the same 12 train seeds
    agreed on 4 coin paths, on 11 once plain pairs were dropped. Over 3 resets each of the first 60
    train and 60 dev coin seeds, 14 and 13 still gave more than one path that way, none with detours
    through doors dropped too (and the fallbacks below). A move changes nothing but the room and
    the doors opened in the other room are left behind, so the detour is a no-op unless the path
    comes back to use such a door: the caller replays the result and falls back to
    `through_doors=False` (only moves undone by the very next move), then to TWX's own path.
    """
    plan: list[str] = []
    for command in gold:
        if command.startswith("move "):
            back = len(plan) - 1
            while through_doors and back >= 0 and plan[back].startswith("open door"):
                back -= 1
            last = plan[back] if back >= 0 else ""
            if last.startswith("move ") and _OPPOSITE.get(last[5:]) == command[5:]:
                del plan[back:]
                continue
        plan.append(command)
    return plan


def _replay_gold(twx: Any, gold: list[str], info: dict[str, Any]) -> tuple[list[str], bool]:
    """Play TWX's gold path once: drop the steps TWX answers as errors (e.g. "open kitchen cupboard"
    on an open cupboard: no effect on the world), and report whether it reaches success. The caller
    resets the game afterwards."""
    plan: list[str] = []
    valid = set(info.get("validActions", []))
    for command in gold:
        _, _, _, info = twx.step(command)
        if command in valid and not is_error_response(str(info["observation"])):
            plan.append(command)
        if info.get("tasksuccess") or float(info["score"]) >= 1.0:
            return plan, True
        if info.get("taskfailure"):
            break
        valid = set(info.get("validActions", []))
    return plan, False


READ_NOTE = "You read the {thing}:\n{text}"


def goal_with_reading(task: str, read: dict[str, str]) -> str:
    """TWX's task description followed by the latest text of each thing read in this episode.

    The text a `read` command returns defines the task (cookingworld's recipe, mapreader's map,
    arithmetic's problem, peckingorder's current instruction), but a prompt shows only a few recent
    steps: 4 steps after `read cookbook` the recipe is gone and "cook ... in stove" or "... in oven"
    is a guess. Keeping it in the goal keeps it in every prompt, in training and in the planner alike.
    Blank lines and indentation are dropped (tokens, not meaning).
    """
    notes = []
    for thing, text in read.items():
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        notes.append(READ_NOTE.format(thing=thing, text="\n".join(lines)))
    return "\n\n".join([task, *notes])


# What TWX's answers say about where the agent is, the ways out of a room and what it carries (`twx_facts`).
_HERE = re.compile(r"^You are in the ([^.\n]+)\.")
_EXIT = re.compile(
    r"(?:Through an open [^,.\n]+?, to|To) the (North|South|East|West) you see (?:the ([^.\n]+)|(a closed [^.\n]+))\."
)
_TAKEN = re.compile(r"^You take the ([^.\n]+)\.")
_GONE = re.compile(r"^You (?:put|eat) the ([^.\n]+?)(?: (?:in|on) the [^.\n]+)?\.")
_MEAL = "Adding the meal to your inventory."
_LISTED = re.compile(r"^Inventory:\s*\n")
_ARTICLE = re.compile(r"^(?:a|an|some|the) ")


def twx_facts(observation: str) -> list[Fact]:
    """What one TWX answer tells for the belief state (envs/subgoals.py): `location` (the room the agent is
    in, from "You are in the kitchen."), `exits` of that room by direction ("east: the pantry", through an open
    door or none; "west: a closed wood door") and `inventory` (an item taken, put or eaten, the meal prepared,
    or the whole list after `inventory`). The snapshot of a window (data/episode.py, PromptSettings.snapshot)
    shows these facts of the steps before it."""
    text = observation.strip()
    if here := _HERE.match(text):
        room = here.group(1).strip()
        exits = {}
        for m in _EXIT.finditer(text):
            direction, place, closed = m.groups()
            exits[direction.lower()] = f"the {place.strip()}" if place else closed.strip()
        return [Fact("location", "", {"room": room}), Fact("exits", room, exits)]
    if taken := _TAKEN.match(text):
        return [Fact("inventory", taken.group(1).strip())]
    if gone := _GONE.match(text):
        return [Fact("inventory", gone.group(1).strip(), drop=True)]
    if text == _MEAL:
        return [Fact("inventory", "meal")]
    if _LISTED.match(text):
        items = [line.strip() for line in text.splitlines()[1:] if line.strip()]
        held = [_ARTICLE.sub("", item) for item in items if not item.startswith("Your inventory is")]
        return [Fact("inventory", None, drop=True)] + [Fact("inventory", item) for item in held]
    return []


def is_error_response(text: str) -> bool:
    """True when TWX's answer says the command was not understood or had no effect."""
    return matches(text, _ERROR_RES)


class TextWorldExpressEnv(JvmEnvLifecycle):
    """simplan adapter over TextWorld-Express (see the module docstring)."""

    name = "twx"
    description = "TextWorld-Express: 8 fast text games (cooking, coin, twc, map reading, arithmetic, ...)"
    families: tuple[str, ...] = GAMES
    error_patterns: tuple[str, ...] = ERROR_PATTERNS

    def __init__(
        self,
        game_params: dict[str, str] | None = None,
        max_steps: int = 200,
        gold_path: bool = True,
    ) -> None:
        unknown = sorted(set(game_params or {}) - set(GAMES))
        if unknown:
            raise ValueError(f"game_params: unknown game(s) {unknown}; games are {', '.join(GAMES)}")
        if max_steps < 1:
            raise ValueError(f"max_steps: must be >= 1, got {max_steps}")
        self.game_params: dict[str, str] = {**DEFAULT_GAME_PARAMS, **(game_params or {})}
        self.max_steps = max_steps
        self.gold_path = gold_path
        self._jvm: JvmHandle[Any] = JvmHandle(_make_twx, "TextWorld-Express")
        self._loaded: tuple[str, str] | None = None  # (game, gameParams) loaded in the JVM
        self._seeds: dict[str, dict[str, list[int]]] = {}
        self._task: Task | None = None
        self._task_description = ""
        self._read: dict[str, str] = {}  # thing -> what reading it said last (see `goal_with_reading`)
        self._valid: list[str] = []
        self._plan: list[Action] | None = None
        self._plan_error = ""
        self.expert_solves: bool | None = None  # did the gold path reach success when replayed at reset
        self._steps = 0
        self._score = 0.0
        self._done = False
        self._won = False

    @property
    def _goal(self) -> str:
        return goal_with_reading(self._task_description, self._read)

    # -- task listing ------------------------------------------------------------------------
    def fold_seeds(self, game: str, fold: str) -> list[int]:
        """TWX's seed list for a game's fold (asked once from the JVM, then cached)."""
        if game not in GAMES:
            raise ValueError(f"game {game!r}: expected one of {', '.join(GAMES)}")
        if fold not in FOLDS:
            raise ValueError(f"fold {fold!r}: expected one of {', '.join(FOLDS)}")
        if game not in self._seeds and game in _SEED_CACHE:
            self._seeds[game] = _SEED_CACHE[game]
        if game not in self._seeds:

            def read(twx: Any) -> dict[str, list[int]]:
                # The seed lists are the game's, whatever its parameters (hence one cache per game): listed under
                # the defaults, so a bad parameter is reported by reset, naming the task, not raw from tasks()
                # when the cache is cold.
                self._load(twx, game, DEFAULT_GAME_PARAMS[game])
                return {
                    "train": [int(s) for s in twx.getValidSeedsTrain()],
                    "dev": [int(s) for s in twx.getValidSeedsDev()],
                    "test": [int(s) for s in twx.getValidSeedsTest()],
                }

            self._seeds[game] = _SEED_CACHE[game] = self._jvm.call(read, f"listing {game} seeds")
        return list(self._seeds[game][fold])

    def tasks(self, fold: str, families: list[str] | None = None, limit: int | None = None) -> list[Task]:
        """Tasks of a fold, interleaved across games (game 0 seed 0, game 1 seed 0, ...) so that a
        small `limit` still covers every game; `limit` caps the total."""
        games = list(GAMES) if families is None else [g for g in GAMES if g in families]
        unknown = sorted(set(families or []) - set(GAMES))
        if unknown:
            raise ValueError(f"families: unknown game(s) {unknown}; games are {', '.join(GAMES)}")
        per_game = {g: self.fold_seeds(g, fold) for g in games}
        out: list[Task] = []
        for i in range(max((len(s) for s in per_game.values()), default=0)):
            for g in games:
                if i < len(per_game[g]):
                    out.append(self._task_for(g, fold, i, per_game[g][i]))
                    if limit is not None and len(out) >= limit:
                        return out
        return out

    def _task_for(self, game: str, fold: str, index: int, seed: int) -> Task:
        return Task(
            env=self.name,
            task_id=f"{game}-{fold}-{index}",
            fold=fold,
            family=game,
            params={"game": game, "seed": seed, "game_params": self.game_params[game]},
        )

    # -- episode -----------------------------------------------------------------------------
    def _load(self, twx: Any, game: str, params: str) -> None:
        if self._loaded != (game, params):
            self._loaded = None
            twx.load(game, params)  # raises ValueError naming a bad parameter
            self._loaded = (game, params)

    def reset(self, task: Task) -> Observation:
        game = task.params.get("game", task.family)
        if game not in GAMES:
            raise ValueError(f"task {task.task_id}: game {game!r} is not one of {', '.join(GAMES)}")
        if "seed" not in task.params:
            raise ValueError(f"task {task.task_id}: params has no 'seed'; list tasks with TextWorldExpressEnv.tasks()")
        seed = int(task.params["seed"])
        params = str(task.params.get("game_params", self.game_params[game]))
        fold = task.fold if task.fold in FOLDS else "train"
        self._task = None  # until the new episode is fully set up
        if not self._jvm.started:
            self._loaded = None

        def start(twx: Any) -> tuple[dict[str, Any], list[str], bool | None]:
            self._load(twx, game, params)
            _, info = twx.reset(seed=seed, gameFold=fold, generateGoldPath=self.gold_path)
            if not self.gold_path:
                return info, [], None
            gold = [str(a) for a in twx.getGoldActionSequence()]
            if not gold or gold[0].startswith("ERROR"):
                return info, gold, None
            # Most cleaned first; TWX's own path where the cleaned ones fail (a detour's door used later).
            paths = [drop_back_and_forth(gold), drop_back_and_forth(gold, through_doors=False), gold]
            for path in dict.fromkeys(tuple(p) for p in paths):
                plan, solves = _replay_gold(twx, list(path), info)
                _, info = twx.reset(seed=seed, gameFold=fold, generateGoldPath=False)
                if solves:
                    break
            return info, plan, solves

        try:
            info, gold, solves = self._jvm.call(start, f"reset of {task.task_id}")
        except ValueError as e:
            raise ValueError(f"task {task.task_id}: TWX rejected gameParams {params!r}: {e}") from None
        except EnvCrashed:
            # A JVM that died between episodes: start a fresh one and try once more.
            self._loaded = None
            info, gold, solves = self._jvm.call(start, f"reset of {task.task_id} (after a JVM restart)")
        self._task = task
        self._task_description = str(info.get("taskDescription", "")).strip()
        self._read = {}
        self._valid = sorted(str(a) for a in info.get("validActions", []))
        self._steps, self._score, self._done, self._won = 0, 0.0, False, False
        self._plan, self._plan_error = None, ""
        self.expert_solves = solves
        if not self.gold_path:
            self._plan_error = "the adapter was built with gold_path=False"
        elif not gold or str(gold[0]).startswith("ERROR"):
            self._plan_error = f"TWX could not generate a gold path: {gold[0] if gold else 'empty'}"
        else:
            self._plan = [Action.command(str(a)) for a in gold]
        return Observation(text=str(info["observation"]), goal=self._goal, valid_actions=list(self._valid))

    def _canonical(self, command: str) -> tuple[str, bool]:
        """(command to send, is it a valid action now); matches valid actions case-insensitively."""
        lowered = {a.lower(): a for a in self._valid}
        hit = lowered.get(command.lower())
        return (hit, True) if hit is not None else (command, False)

    def step(self, action: Action) -> StepResult:
        if self._task is None:
            raise RuntimeError("TextWorldExpressEnv.step called before reset (or after a failed reset)")
        if self._done:
            return StepResult(
                observation=Observation(text=AFTER_DONE_TEXT, goal=self._goal, valid_actions=[], error=True),
                score=self._score,
                done=True,
                won=self._won,
                info={"after_done": True, "tasksuccess": self._won},
            )
        if action.kind != "command":
            text = f"TextWorld-Express takes text commands, not a {action.kind} action."
            return self._result(text, error=True, score=self._score, info={"tasksuccess": False, "taskfailure": False})
        command, is_valid = self._canonical(" ".join(action.text.split()))
        if not command:
            return self._result("Empty command.", error=True, score=self._score, info={"tasksuccess": False})
        task_id = self._task.task_id
        _, _, _, info = self._jvm.call(lambda twx: twx.step(command), f"step {command!r} of {task_id}")
        self._valid = sorted(str(a) for a in info.get("validActions", []))
        text = str(info["observation"])
        error = not is_valid or is_error_response(text)
        if not error and command.startswith("read "):
            self._read.pop(command[5:], None)  # latest reading last
            self._read[command[5:]] = text
        return self._result(text, error=error, score=float(info["score"]), info=info)

    def _result(self, text: str, error: bool, score: float, info: dict[str, Any]) -> StepResult:
        self._steps += 1
        before = self._score
        self._score = score
        success = bool(info.get("tasksuccess")) or score >= 1.0
        failure = bool(info.get("taskfailure"))
        truncated = not (success or failure) and self._steps >= self.max_steps
        self._done = success or failure or truncated
        self._won = success
        out_info = {
            "tasksuccess": success,
            "taskfailure": failure,
            "truncated": truncated,
            "steps": self._steps,
            "score_raw": info.get("scoreRaw"),
        }
        return StepResult(
            observation=Observation(text=text, goal=self._goal, valid_actions=list(self._valid), error=error),
            reward=score - before,
            score=score,
            done=self._done,
            won=success,
            info=out_info,
        )

    def valid_actions(self) -> list[str]:
        return list(self._valid)

    def expert_plan(self) -> list[Action]:
        if self._task is None:
            raise RuntimeError("TextWorldExpressEnv.expert_plan called before reset")
        if self._plan is None:
            raise RuntimeError(f"task {self._task.task_id}: no expert plan ({self._plan_error})")
        return list(self._plan)

    def inverse(self, action: Action) -> Action | None:
        """The command that undoes `action` from the state it led to: the move back, closing what was opened (and
        opening what was closed), taking back what was put in or on something. None for the rest (what taking,
        eating or cooking changed is not known from the command alone). `simplan envs check twx` plays each
        inverse on the expert's paths and checks that it restores the valid actions and the score."""
        if action.kind != "command":
            return None
        text = " ".join(action.text.split())
        verb, _, rest = text.partition(" ")
        if verb == "move" and rest in _OPPOSITE:
            return Action.command(f"move {_OPPOSITE[rest]}")
        if verb in ("open", "close") and rest:
            return Action.command(f"{'close' if verb == 'open' else 'open'} {rest}")
        if put := _PUT.fullmatch(text):
            return Action.command(f"take {put.group(1)}")
        return None

    def facts(self, action: Action | None, observation: str | None, error: bool) -> list[Fact]:
        """The belief-state facts of an answer (`twx_facts`): nothing from a failed command or for a command's
        intent (`observation` None: TWX commands are not checked against sub-goals)."""
        if observation is None or error:
            return []
        return twx_facts(observation)

    def parse_action(self, text: str) -> Action:
        """One line of text = one command (whitespace collapsed, case kept: TWX names are case-sensitive)."""
        return parse_command(text, MAX_ACTION_CHARS)

    # -- lifecycle (JvmEnvLifecycle: jvm, context manager, __del__) ----------------------------
    def close(self) -> None:
        super().close()
        self._loaded = None
