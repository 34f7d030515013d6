"""ScienceWorld (scienceworld==1.2.3) as a simplan environment: 30 science task types, its own splits.

    env = make_env("scienceworld")                      # or ScienceWorldEnv(max_valid_actions=60)
    task = env.tasks("dev", families=["boil"], limit=1)[0]          # "boil-14"
    obs = env.reset(task)                               # obs.goal, obs.text, obs.valid_actions
    result = env.step(env.parse_action("open door to kitchen"))
    plan = env.expert_plan()                            # ScienceWorld's gold action sequence
    env.close()                                         # shuts the JVM down
    simplan envs check scienceworld --sample 1          # the generic adapter check (minutes)

Tasks. `Task.family` is the task name (boil, melt, find-animal, ... 30 in all); `task_id` is
"{task_name}-{variation}", `params` = {"task_name", "variation", "simplifications"}. Folds are
ScienceWorld's own variation splits (`get_variations_train/dev/test`), asked from the JVM per task
type (which loads that task type: 0.1-1.5 s each) and cached; `tasks()` interleaves task types so a
small `limit` covers all of them. `simplifications` (constructor) is ScienceWorld's string, e.g.
"easy" or "teleportAction,openDoors"; default none. Loading a task with its gold path takes 0.1-25 s.

Valid actions. `info["valid"]` holds every valid action-object combination: ~400-9,000 strings
(most are "connect X to Y" for every pair of objects), far more than a prompt can hold, and still
not a superset of what the simulator accepts (the gold path often uses other object names). So
`Observation.valid_actions` is a filtered, capped list:
1. "reset task" is dropped (it would restart the episode), and so is "connect/disconnect ..." unless
   the task is electrical (power-component*, test-conductivity*);
2. actions are ordered by verb (free actions: look around, inventory, task, wait, wait1; then go,
   open, close, pick up, put down, activate, deactivate, read, focus on, use, move, pour, mix, dunk,
   eat, flush, look at, look in, connect, disconnect), keeping ScienceWorld's order within a verb;
3. the first `max_valid_actions` (default 100; None keeps all) are kept.
`info["num_valid"]` gives the size of ScienceWorld's full list; `all_valid_actions()` returns it.
When ScienceWorld asks which object was meant ("Ambiguous request: Please enter the number ..."),
the valid actions are the option numbers ("0", "1", ...), as in its gold paths. Observations say
`valid_actions_complete=False` except for those option lists: the planner then does not treat an
action missing from the list as impossible.

Errors. `Observation.error` is True when ScienceWorld's answer says the input was not understood or
did nothing ("No known action matches that input.", "I'm not sure ...", "... can't ...", "... isn't
open", ...). An ambiguity question is not an error. Nothing is checked against the valid list,
because ScienceWorld accepts actions that list does not show. The same patterns are the adapter's
`error_patterns`, so the planner's judge reads predicted texts as the adapter reads real ones.

Score and success. `StepResult.score` is ScienceWorld's score / 100 (-1 when the task failed, e.g.
focusing on the wrong object); `won` when ScienceWorld reports the task completed with score 100;
`done` when it reports completion (success or failure) or after `max_steps` steps
(`info["truncated"]`). A step after `done` does not reach ScienceWorld: it returns an error
observation with done=True. `max_steps` defaults to 400 because gold paths reach ~180 steps
(inclined-plane-friction, mendelian-genetics); agents set their own, smaller budgets.
`expert_plan()` is `get_gold_action_sequence()` (generated at reset) without its self-referential
no-op steps ("pour metal pot into metal pot", which ScienceWorld refuses).

JVM. One adapter = one JVM (started lazily, ~1 s), reused across episodes. If it dies, `step` raises
`envs.base.EnvCrashed` (mark the episode errored) and the next `reset` starts a new one. `tasks()`
loads task types in the JVM and so ends the current episode: list tasks before playing.
"""

from __future__ import annotations

import re
from typing import Any

from simplan.envs.base import FOLDS, Action, EnvCrashed, Observation, StepResult, Task, parse_command
from simplan.envs.failures import compile_patterns, matches
from simplan.envs.jvm import JvmEnvLifecycle, JvmHandle

FREE_ACTIONS: tuple[str, ...] = ("look around", "inventory", "task", "wait", "wait1")
VERB_ORDER: tuple[str, ...] = (
    "go",
    "open",
    "close",
    "pick up",
    "put down",
    "activate",
    "deactivate",
    "read",
    "focus on",
    "use",
    "move",
    "pour",
    "mix",
    "dunk",
    "eat",
    "flush",
    "look at",
    "look in",
    "connect",
    "disconnect",
)
ELECTRICAL_PREFIXES: tuple[str, ...] = ("power-component", "test-conductivity")
AMBIGUOUS_PREFIX = "Ambiguous request"
_OPTION_RE = re.compile(r"^(\d+):", re.MULTILINE)
# ScienceWorld's answers to input it did not understand or that had no effect, read on the first line; an
# ambiguity question is none. The adapter's `error_patterns`: the judge and the error pivot read failures in
# predicted texts with the same patterns the adapter flags real ones with.
_FIRST_LINE = r"\A(?!ambiguous request)[^\S\n]*"
ERROR_PATTERNS: tuple[str, ...] = (
    _FIRST_LINE + r"(no known action|unknown action|i'm not sure|error)",
    _FIRST_LINE + r"[^\n]*?(\bcan't\b|\bcannot\b|isn't open|is not open|is not openable|doesn't appear to)",
)
_ERROR_RES = compile_patterns(ERROR_PATTERNS)
# Gold paths of the boil/freeze/chemistry tasks hold "pour metal pot into metal pot", which ScienceWorld
# answers "You can't move something into itself." (no effect): expert_plan() leaves such steps out.
_SELF_MOVE_RE = re.compile(r"^(?:pour|move|dunk) (.+) (?:into|to|in) \1$")
AFTER_DONE_TEXT = "The episode is over; call reset() to start a new one."
MAX_ACTION_CHARS = 200


def task_names() -> list[str]:
    """The 30 task types, from the package's task table (no JVM)."""
    from scienceworld.constants import ID2TASK
    from scienceworld.utils import infer_task

    return sorted(infer_task(name) for name in ID2TASK.values())


def _make_sw() -> Any:
    from scienceworld import ScienceWorldEnv as _SW

    # The adapter enforces its own step budget; ScienceWorld's own limit is set out of the way.
    return _SW("", envStepLimit=10**9)


def is_error_response(text: str) -> bool:
    """True when ScienceWorld's answer says the input was not understood or had no effect."""
    return matches(text, _ERROR_RES)


def _verb_rank(action: str) -> int:
    if action in FREE_ACTIONS:
        return -1
    for i, verb in enumerate(VERB_ORDER):
        if action == verb or action.startswith(verb + " "):
            return i
    return len(VERB_ORDER)


def filter_valid_actions(valid: list[str], task_name: str, limit: int | None) -> list[str]:
    """The documented valid-action policy (module docstring): drop, order by verb, cap."""
    electrical = task_name.startswith(ELECTRICAL_PREFIXES)
    kept = [
        a
        for a in dict.fromkeys(valid)
        if a != "reset task" and (electrical or not a.startswith(("connect ", "disconnect ")))
    ]
    kept.sort(key=_verb_rank)  # stable: ScienceWorld's order within a verb
    return kept if limit is None else kept[:limit]


class ScienceWorldEnv(JvmEnvLifecycle):
    """simplan adapter over ScienceWorld (see the module docstring)."""

    name = "scienceworld"
    description = "ScienceWorld: 30 elementary-science task types in a simulated house (thermometers, circuits, ...)"
    error_patterns: tuple[str, ...] = ERROR_PATTERNS

    def __init__(
        self,
        simplifications: str = "",
        max_steps: int = 400,
        max_valid_actions: int | None = 100,
        gold_path: bool = True,
    ) -> None:
        if max_steps < 1:
            raise ValueError(f"max_steps: must be >= 1, got {max_steps}")
        if max_valid_actions is not None and max_valid_actions < 1:
            raise ValueError(f"max_valid_actions: must be >= 1 or None, got {max_valid_actions}")
        self.simplifications = simplifications
        self.max_steps = max_steps
        self.max_valid_actions = max_valid_actions
        self.gold_path = gold_path
        self._jvm: JvmHandle[Any] = JvmHandle(_make_sw, "ScienceWorld")
        self._splits: dict[str, dict[str, list[int]]] = {}
        self._task: Task | None = None
        self._goal = ""
        self._valid_all: list[str] = []
        self._valid: list[str] = []
        self._valid_complete = False
        self._plan: list[Action] | None = None
        self._plan_error = ""
        self._steps = 0
        self._score = 0.0
        self._done = False
        self._won = False

    @property
    def families(self) -> tuple[str, ...]:
        return tuple(task_names())

    # -- task listing ------------------------------------------------------------------------
    def variations(self, task_name: str, fold: str) -> list[int]:
        """ScienceWorld's variation split of a task type for a fold (asked from the JVM once)."""
        if task_name not in task_names():
            raise ValueError(f"task type {task_name!r}: expected one of {', '.join(task_names())}")
        if fold not in FOLDS:
            raise ValueError(f"fold {fold!r}: expected one of {', '.join(FOLDS)}")
        if task_name not in self._splits:
            self._task = None  # loading another task type ends the current episode

            def read(sw: Any) -> dict[str, list[int]]:
                sw.load(task_name, 0, "", generateGoldPath=False)
                return {
                    "train": [int(v) for v in sw.get_variations_train()],
                    "dev": [int(v) for v in sw.get_variations_dev()],
                    "test": [int(v) for v in sw.get_variations_test()],
                }

            self._splits[task_name] = self._jvm.call(read, f"listing {task_name} variations")
        return self._splits[task_name][fold]

    def tasks(self, fold: str, families: list[str] | None = None, limit: int | None = None) -> list[Task]:
        """Tasks of a fold, interleaved across task types so a small `limit` (on the total) covers all."""
        names = task_names()
        unknown = sorted(set(families or []) - set(names))
        if unknown:
            raise ValueError(f"families: unknown task type(s) {unknown}; task types are {', '.join(names)}")
        chosen = names if families is None else [n for n in names if n in families]
        per_task = {n: self.variations(n, fold) for n in chosen}
        out: list[Task] = []
        for i in range(max((len(v) for v in per_task.values()), default=0)):
            for n in chosen:
                if i < len(per_task[n]):
                    out.append(self._task_for(n, fold, per_task[n][i]))
                    if limit is not None and len(out) >= limit:
                        return out
        return out

    def _task_for(self, task_name: str, fold: str, variation: int) -> Task:
        return Task(
            env=self.name,
            task_id=f"{task_name}-{variation}",
            fold=fold,
            family=task_name,
            params={"task_name": task_name, "variation": variation, "simplifications": self.simplifications},
        )

    # -- episode -----------------------------------------------------------------------------
    def reset(self, task: Task) -> Observation:
        task_name = str(task.params.get("task_name", task.family))
        if task_name not in task_names():
            raise ValueError(f"task {task.task_id}: task type {task_name!r} is not a ScienceWorld task")
        if "variation" not in task.params:
            raise ValueError(
                f"task {task.task_id}: params has no 'variation'; list tasks with ScienceWorldEnv.tasks()"
            )
        variation = int(task.params["variation"])
        simplifications = str(task.params.get("simplifications", self.simplifications))
        self._task = None

        def start(sw: Any) -> tuple[str, dict[str, Any], list[str]]:
            sw.load(task_name, variation, simplifications, generateGoldPath=self.gold_path)
            obs, info = sw.reset()
            gold = [str(a) for a in sw.get_gold_action_sequence()] if self.gold_path else []
            return obs, info, gold

        try:
            obs, info, gold = self._jvm.call(start, f"reset of {task.task_id}")
        except EnvCrashed:
            # A JVM that died between episodes: start a fresh one and try once more.
            obs, info, gold = self._jvm.call(start, f"reset of {task.task_id} (after a JVM restart)")
        self._task = task
        self._goal = _clean_goal(str(info.get("taskDesc", "")))
        self._steps, self._score, self._done, self._won = 0, 0.0, False, False
        self._plan, self._plan_error = None, ""
        if not self.gold_path:
            self._plan_error = "the adapter was built with gold_path=False"
        elif not gold or gold[0].startswith("ERROR"):
            self._plan_error = f"ScienceWorld could not generate a gold path: {gold[0] if gold else 'empty'}"
        else:
            self._plan = [Action.command(a) for a in gold if not _SELF_MOVE_RE.match(a)]
        self._set_valid(obs, info)
        return self._observation(obs)

    def _observation(self, text: str, error: bool = False) -> Observation:
        """What the agent sees now: `text` with the episode's goal and current valid actions."""
        return Observation(
            text=text,
            goal=self._goal,
            valid_actions=list(self._valid),
            valid_actions_complete=self._valid_complete,
            error=error,
        )

    def _set_valid(self, text: str, info: dict[str, Any]) -> None:
        self._valid_all = [str(a) for a in info.get("valid", [])]
        if text.startswith(AMBIGUOUS_PREFIX):
            self._valid = _OPTION_RE.findall(text)
            self._valid_complete = True  # the question's numbered options are all there is
        else:
            task_name = self._task.family if self._task else ""
            self._valid = filter_valid_actions(self._valid_all, task_name, self.max_valid_actions)
            self._valid_complete = False  # ScienceWorld accepts actions its list does not show

    def step(self, action: Action) -> StepResult:
        if self._task is None:
            raise RuntimeError("ScienceWorldEnv.step called before reset (or after tasks() or a failed reset)")
        if self._done:
            return StepResult(
                observation=Observation(text=AFTER_DONE_TEXT, goal=self._goal, valid_actions=[], error=True),
                score=self._score,
                done=True,
                won=self._won,
                info={"after_done": True, "tasksuccess": self._won},
            )
        if action.kind != "command" or not action.text.strip():
            what = "an empty command" if action.kind == "command" else f"a {action.kind} action"
            return self._result(f"ScienceWorld takes text commands, not {what}.", True, self._score, False, {})
        command = " ".join(action.text.split())
        task_id = self._task.task_id

        def act(sw: Any) -> tuple[str, dict[str, Any], bool]:
            obs, _, _, info = sw.step(command)
            return obs, info, bool(sw.server.getCompleted())

        obs, info, completed = self._jvm.call(act, f"step {command!r} of {task_id}")
        self._set_valid(obs, info)
        score = float(info["score"]) / 100.0
        return self._result(obs, is_error_response(obs), score, completed, info)

    def _result(self, text: str, error: bool, score: float, completed: bool, info: dict[str, Any]) -> StepResult:
        self._steps += 1
        before = self._score
        self._score = score
        success = completed and score >= 1.0
        failure = score < 0 or (completed and not success)
        truncated = not (success or failure) and self._steps >= self.max_steps
        self._done = success or failure or truncated
        self._won = success
        out_info = {
            "tasksuccess": success,
            "taskfailure": failure,
            "truncated": truncated,
            "steps": self._steps,
            "moves": info.get("moves"),
            "num_valid": len(self._valid_all),
            "ambiguous": text.startswith(AMBIGUOUS_PREFIX),
        }
        return StepResult(
            observation=self._observation(text, error),
            reward=score - before,
            score=score,
            done=self._done,
            won=success,
            info=out_info,
        )

    def all_valid_actions(self) -> list[str]:
        """ScienceWorld's full, unfiltered valid action list for the current state."""
        return list(self._valid_all)

    def expert_plan(self) -> list[Action]:
        if self._task is None:
            raise RuntimeError("ScienceWorldEnv.expert_plan called before reset")
        if self._plan is None:
            raise RuntimeError(f"task {self._task.task_id}: no expert plan ({self._plan_error})")
        return list(self._plan)

    def parse_action(self, text: str) -> Action:
        """One line of text = one command (whitespace collapsed)."""
        return parse_command(text, MAX_ACTION_CHARS)


def _clean_goal(task_desc: str) -> str:
    text = task_desc.strip()
    for prefix in ("Task Description:", "Task description:"):
        if text.startswith(prefix):
            text = text[len(prefix) :].strip()
    return text
