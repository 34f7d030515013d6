"""BFCL multi-turn tool calling (bfcl-eval==2026.3.23) as a simplan environment.

    env = make_env("bfcl")                      # or BFCLEnv(compact_tools=True)
    task = env.tasks("train", families=["multi_turn_miss_func"], limit=1)[0]
    obs = env.reset(task)                       # obs.text = "User: ...", obs.tools = JSON schemas
    result = env.step(env.parse_action("cd(folder='document')"))
    result = env.step(env.parse_action("finish()"))   # ends the user turn; next obs is the next request
    simplan envs check bfcl                     # the generic adapter check

Tasks, folds and tools (envs/bfcl_tasks.py). The four multi-turn categories (`Task.family`), 200 tasks
each, from the data files bundled in the bfcl-eval wheel; a task's fold follows its base id, so the
variants of one base task never cross folds; `Observation.tools` holds the JSON schemas of the functions
the task offers at the current turn (miss_func releases withheld ones at later turns). Calling a
withheld or unknown function is an error observation; nothing is executed.

Episode. Each user turn starts with an observation "User: <message>" (goal = the current request).
Actions are tool calls (`Action.tool_call(name, args)`), executed against bfcl's own backend
instances (GorillaFileSystem, TravelAPI, ...) through bfcl's `execute_multi_turn_func_call`; the
observation is the call's return value as compact JSON (strings verbatim). `Action(kind="finish")`
(or an `answer`, a text reply to the user, as in bfcl where a text reply ends the turn) ends the
turn; after the last turn the episode is done. A turn longer than `max_steps_per_turn` actions
(default 50) force-terminates the episode as failed, as bfcl does past its 20 model responses per
turn (a bfcl response may hold several parallel calls, a simplan step holds one; the longest
ground-truth turn has 34 calls).
`Observation.error` is True when the backend returns an error (`{"error": ...}` or bfcl's
"Error during execution: ..."), and for an unknown/withheld tool, a non-literal or malformed
argument, or a non-tool action (none of these is executed).

Limits. Tool calls run in a worker process (`envs.limits.WorkerProcess`), one per episode, that holds
bfcl's backend instances: a call that runs past `step_timeout` seconds (default 10; bfcl's MathAPI
computes `power(base=3, exponent=1000000000)` for minutes holding the GIL, which no thread can stop) is
killed with the process and becomes a failed action ("did not finish within N s ... it had no effect",
`info["timed_out"]`); the episode goes on. Before the next step a fresh worker replays the episode's
executed calls (and the ground truth's finished turns) to rebuild the backend state, and checks that
every replayed call returns what it returned the first time (bfcl's backends are deterministic: all
799 expert replays agree run to run); a replay that differs or runs over its own limit raises
`EnvCrashed` (the episode is marked errored). A backend that dies mid-call (e.g. out of memory) is
handled as a timeout. A finish step's turn check and final verdict share the step's limit; when they
are stopped, the turn counts as failed (`error_type` "simplan:check_stopped"). Arguments known to hang
or flood the MathAPI (a precision above `MAX_PRECISION` digits, an integer power above
`MAX_POWER_BITS` bits, envs/bfcl_worker.py) are refused before the call with an error observation
(`check_bounds`).

Safety. Model text is parsed with `envs.actions.parse_tool_call` (ast, literal arguments only, only
the task's currently available functions). bfcl executes calls with `eval()`, so the string it
receives is rebuilt from the structured Action with `repr()` of each literal value and parsed back
to check that it round-trips to the same call before it is passed on; raw model text never
reaches bfcl. bfcl caches backend instances in module globals keyed by model name + task id; they live
only in the episode's worker process, which reset/close kill, so nothing an episode did (including
the MathAPI's process-wide mpmath precision) carries into the next.

Success and score. After each turn whose ground truth is non-empty, bfcl's own `state_checker`
(backend states equal the ground truth's) and `response_checker` (every ground-truth result of the
turn appears among the model's results so far) judge the turn, plus bfcl's rule that such a turn
needs at least one call; turns with an empty ground truth (the model should not or cannot act) are
not checked, as in bfcl. `score` = fraction of checked turns that passed (so far, out of all
checked turns). At the end, `won` / `info["tasksuccess"]` is the verdict of bfcl-eval's
`multi_turn_checker` run on the whole episode's calls against the ground truth.
"""

from __future__ import annotations

import ast
import inspect
import time
import uuid
from typing import Any

from simplan.envs.actions import parse_tool_call
from simplan.envs.base import FOLDS, Action, ActionParseError, EnvCrashed, Observation, StepResult, Task
from simplan.envs.bfcl_tasks import (
    CATEGORIES,
    BFCLEntry,
    backend_class,
    category_of,
    fold_of,
    function_docs,
    load_category,
    missing_package_error,
    tool_schema,
    unplayable_reason,
)
from simplan.envs.bfcl_worker import (
    _w_check_turn,
    _w_execute,
    _w_final_verdict,
    _w_open,
    argument_problem,
    call_string,
    is_error_result,
    render_result,
)
from simplan.envs.limits import StepTimeout, WorkerDied, WorkerProcess

try:
    from bfcl_eval.constants.default_prompts import DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC
except ImportError as e:  # pragma: no cover - exercised only without the package
    raise missing_package_error(e) from e

MAX_STEPS_PER_TURN = 50  # one call per step; the longest ground-truth turn has 34 calls
STEP_TIMEOUT = 10.0  # seconds; bfcl's backends are in-memory Python: every expert call takes milliseconds
# Starting a worker (a fresh interpreter imports bfcl and loads the scenario: ~0.1 s on an idle machine);
# a replay gets this plus twice the time its calls took the first time.
SETUP_TIMEOUT = 60.0

USER_TEXT = "User: {message}"
END_TEXT = "The user has no further requests; the conversation is over."
UNKNOWN_TOOL_TEXT = "Error: {name!r} is not an available tool. Available tools: {tools}."
BAD_CALL_TEXT = "Error: {reason}. Write name(arg=value, ...) with Python literal values."
NOT_A_TOOL_TEXT = "Error: this environment takes tool calls name(arg=value, ...) or finish(), got a {kind} action."
OUT_OF_BOUNDS_TEXT = "Error: {reason}; the call was not executed."
CALL_STOPPED_TEXT = (
    "Error: {call} did not finish within {seconds:g} s (the step time limit) and was stopped; it had no effect. "
    "Use smaller arguments or another tool."
)
CALL_CRASHED_TEXT = "Error: {call} crashed the tool backend and was undone; it had no effect."


def _stopped_check(what: str, error: Exception) -> dict[str, Any]:
    return {"valid": False, "error_type": "simplan:check_stopped", "error_message": f"{what} was stopped: {error}"}


# ---------------------------------------------------------------------------------------------
# The environment
# ---------------------------------------------------------------------------------------------
class BFCLEnv:
    """BFCL multi-turn categories; see the module docstring for folds, episodes and scoring."""

    name = "bfcl"

    def __init__(
        self,
        max_steps_per_turn: int = MAX_STEPS_PER_TURN,
        compact_tools: bool = False,
        step_timeout: float = STEP_TIMEOUT,
        check_bounds: bool = True,
    ) -> None:
        if max_steps_per_turn < 1:
            raise ValueError(f"max_steps_per_turn: must be >= 1, got {max_steps_per_turn}")
        if not step_timeout >= 0:  # also rejects NaN
            raise ValueError(f"step_timeout: must be >= 0 seconds (0 = no limit), got {step_timeout!r}")
        self.max_steps_per_turn = max_steps_per_turn
        self.compact_tools = compact_tools
        self.step_timeout = float(step_timeout)  # enforced here (envs/limits.py: make_env adds no watchdog)
        self.check_bounds = check_bounds
        self._entry: BFCLEntry | None = None
        self._model_name = ""
        self._worker = WorkerProcess("bfcl")
        self._rebuild_needed = False
        self._deadline = 0.0

    # -- task listing ------------------------------------------------------------------------
    def tasks(self, fold: str, families: list[str] | None = None, limit: int | None = None) -> list[Task]:
        if fold not in FOLDS:
            raise ValueError(f"fold {fold!r}: expected one of {FOLDS}")
        unknown = sorted(set(families or []) - set(CATEGORIES))
        if unknown:
            raise ValueError(f"families {unknown}: not BFCL categories; choose from {list(CATEGORIES)}")
        chosen = [c for c in CATEGORIES if not families or c in families]
        entries = [
            e
            for c in chosen
            for e in load_category(c).values()
            if fold_of(e.base_id) == fold and unplayable_reason(e) is None
        ]
        entries.sort(key=lambda e: (e.base_id, CATEGORIES.index(e.category)))
        tasks = [
            Task(
                env=self.name,
                task_id=e.id,
                fold=fold,
                family=e.category,
                params={"base_id": e.base_id, "turns": len(e.question), "classes": list(e.involved_classes)},
            )
            for e in entries
        ]
        return tasks if limit is None else tasks[:limit]

    # -- episode -----------------------------------------------------------------------------
    def reset(self, task: Task) -> Observation:
        category = category_of(task.task_id)
        entries = load_category(category)
        if task.task_id not in entries:
            raise ValueError(f"task {task.task_id!r}: no such bfcl entry ({len(entries)} in {category})")
        self._release()
        entry = entries[task.task_id]
        self._entry = entry
        self._long_context = "long_context" in category
        self._model_name = f"simplan_{uuid.uuid4().hex}"
        self._docs = {d["name"]: d for c in entry.involved_classes for d in function_docs(c)}
        withheld = {f for names in entry.missed.values() for f in names} | set(entry.excluded)
        self._available = [n for n in self._docs if n not in withheld]
        self._turn = 0
        self._steps_in_turn = 0
        self._turn_calls: list[list[str]] = [[]]
        self._all_results: list[str] = []
        self._checks: list[dict[str, Any]] = []
        self._n_checked = sum(1 for gt in entry.ground_truth if gt)
        self._call_seconds: list[float] = []  # how long each executed call took (bounds a replay)
        self._done = False
        self._goal = ""
        self._rebuild_needed = False
        self._open_backend([])
        return self._turn_observation()

    # -- the worker process ------------------------------------------------------------------
    def _open_backend(self, expected: list[str]) -> None:
        """A fresh worker with the episode's instances after the calls so far; `expected`: their results."""
        assert self._entry is not None
        calls = [c for turn in self._turn_calls for c in turn]
        limit = SETUP_TIMEOUT + 2 * sum(self._call_seconds)
        what = f"bfcl {self._entry.id}: rebuilding the backend state ({len(calls)} calls)"
        try:
            results = self._worker.call(
                _w_open, self._entry, self._long_context, self._model_name, calls, self._turn, timeout=limit
            )
        except (StepTimeout, WorkerDied) as e:
            raise EnvCrashed(f"{what} failed: {e}; the episode is lost (mark it errored)") from e
        for i, (got, want) in enumerate(zip(results, expected)):
            if got != want:
                raise EnvCrashed(
                    f"{what}: replayed call {calls[i]!r} returned {got[:200]!r}, not {want[:200]!r} as before; "
                    "the state cannot be trusted, the episode is lost (mark it errored)"
                )
        self._rebuild_needed = False

    def _in_worker(self, fn: Any, *args: Any) -> Any:
        """`fn(*args)` in the worker within what is left of this step's time limit."""
        left = max(self._deadline - time.monotonic(), 0.01) if self.step_timeout else 0.0
        return self._worker.call(fn, *args, timeout=left)

    def _turn_observation(self) -> Observation:
        assert self._entry is not None
        messages = [m["content"] for m in self._entry.question[self._turn] if m.get("role") == "user"]
        if self._turn in self._entry.missed:
            self._available += [n for n in self._entry.missed[self._turn] if n not in self._available]
        if messages:
            message = "\n".join(messages)
            self._goal = message
        else:  # a miss_func holdout turn: bfcl sends this fixed message; the request stays the same
            message = DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC
            self._goal = f"{self._goal}\n{message}".strip()
        return Observation(text=USER_TEXT.format(message=message), goal=self._goal, tools=self.tool_schemas())

    def tool_schemas(self) -> list[dict[str, Any]]:
        """JSON schemas of the tools available now."""
        return [tool_schema(self._docs[n], self.compact_tools) for n in self._available]

    def available_tools(self) -> list[str]:
        """Names of the functions the task offers at the current turn."""
        return list(self._available)

    def _observe(self, text: str, error: bool) -> Observation:
        return Observation(text=text, goal=self._goal, tools=self.tool_schemas(), error=error)

    def _score(self) -> float:
        passed = sum(1 for c in self._checks if c["valid"])
        return passed / self._n_checked if self._n_checked else 0.0

    def step(self, action: Action) -> StepResult:
        if self._entry is None:
            raise RuntimeError("BFCLEnv.step called before reset")
        if self._done:
            raise RuntimeError(f"BFCLEnv.step: episode {self._entry.id} is over; call reset")
        if self._rebuild_needed:  # the previous step was stopped: its worker is gone
            self._open_backend(self._all_results)
        self._deadline = time.monotonic() + self.step_timeout
        before = self._score()
        self._steps_in_turn += 1
        info: dict[str, Any] = {"turn": self._turn, "turns": len(self._entry.question), "call": None}
        if action.kind in ("finish", "answer"):
            observation = self._end_turn(info)
        elif self._steps_in_turn > self.max_steps_per_turn:
            observation = self._force_terminate(info)
        elif action.kind != "tool_call":
            observation = self._observe(NOT_A_TOOL_TEXT.format(kind=action.kind), error=True)
        else:
            observation = self._call(action, info)
        score = self._score()
        won = bool(self._done and info.get("tasksuccess"))
        info["tasksuccess"] = won
        return StepResult(observation, reward=score - before, score=score, done=self._done, won=won, info=info)

    def _call(self, action: Action, info: dict[str, Any]) -> Observation:
        if action.name not in self._available:
            tools = ", ".join(self._available)
            return self._observe(UNKNOWN_TOOL_TEXT.format(name=action.name, tools=tools), error=True)
        call = call_string(action)
        # Only a call that round-trips through the ast parser (literal values, plain keyword names)
        # reaches bfcl, whose executor eval()s the string.
        try:
            parsed = parse_tool_call(call, allowed=self._available)
        except ActionParseError as e:
            return self._observe(BAD_CALL_TEXT.format(reason=str(e)), error=True)
        if parsed.name != action.name or parsed.arguments != action.arguments:
            reason = f"{action.name}: arguments must be Python literals with plain names, got {call!r}"
            return self._observe(BAD_CALL_TEXT.format(reason=reason), error=True)
        if self.check_bounds and (problem := argument_problem(action)):
            return self._observe(OUT_OF_BOUNDS_TEXT.format(reason=problem), error=True)
        t0 = time.monotonic()
        try:
            result = self._in_worker(_w_execute, call)
        except StepTimeout:
            self._rebuild_needed = True
            info["timed_out"] = self.step_timeout
            return self._observe(CALL_STOPPED_TEXT.format(call=call, seconds=self.step_timeout), error=True)
        except WorkerDied as e:
            self._rebuild_needed = True
            info["worker_died"] = str(e)
            return self._observe(CALL_CRASHED_TEXT.format(call=call), error=True)
        self._call_seconds.append(time.monotonic() - t0)
        self._turn_calls[self._turn].append(call)
        self._all_results.append(result)
        info["call"] = call
        return self._observe(render_result(result), error=is_error_result(result))

    def _end_turn(self, info: dict[str, Any]) -> Observation:
        assert self._entry is not None
        turn = self._turn
        try:
            check = self._in_worker(_w_check_turn, turn, self._all_results, bool(self._turn_calls[turn]))
        except (StepTimeout, WorkerDied) as e:
            self._rebuild_needed = True  # the rebuild replays this turn's ground truth too
            check = _stopped_check("the turn check", e) if self._entry.ground_truth[turn] else None
        if check is not None:
            self._checks.append({"turn": turn, **check})
            info["turn_check"] = self._checks[-1]
        self._turn += 1
        self._steps_in_turn = 0
        if self._turn < len(self._entry.question):
            self._turn_calls.append([])
            before = set(self._available)
            observation = self._turn_observation()
            added = [n for n in self._available if n not in before]
            if added:
                info["tools_added"] = added
            return observation
        verdict = self._final_verdict()
        info["checker"] = verdict
        info["tasksuccess"] = bool(verdict["valid"])
        self._done = True
        return self._observe(END_TEXT, error=False)

    def _final_verdict(self) -> dict[str, Any]:
        """bfcl-eval's multi_turn_checker over the whole episode, in the worker."""
        try:
            return self._in_worker(_w_final_verdict, self._turn_calls)
        except (StepTimeout, WorkerDied) as e:
            return _stopped_check("bfcl's final checker", e)

    def _force_terminate(self, info: dict[str, Any]) -> Observation:
        self._done = True
        info["truncated"] = True
        info["checker"] = {
            "valid": False,
            "error_type": "multi_turn:force_terminated",
            "error_message": f"more than {self.max_steps_per_turn} steps in turn {self._turn}",
        }
        return self._observe(f"Error: more than {self.max_steps_per_turn} steps in one turn; episode ended.", True)

    # -- expert ------------------------------------------------------------------------------
    def expert_plan(self) -> list[Action]:
        """Ground-truth calls of every turn, each turn followed by finish()."""
        if self._entry is None:
            raise RuntimeError("BFCLEnv.expert_plan called before reset")
        plan: list[Action] = []
        allowed = list(self._docs)
        for calls in self._entry.ground_truth:
            plan += [parse_tool_call(self._keyword_call(c), allowed=allowed) for c in calls]
            plan.append(Action(kind="finish"))
        return plan

    def _keyword_call(self, call: str) -> str:
        """Rewrite positional arguments of a ground-truth call (e.g. `sort('a.txt')`) as keywords."""
        tree = ast.parse(call.strip(), mode="eval")
        node = tree.body
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name) or not node.args:
            return call
        method = self._method(node.func.id)
        names = [p for p in inspect.signature(method).parameters if p != "self"]  # an unbound function
        if len(node.args) > len(names):
            raise ValueError(f"{self._entry.id if self._entry else '?'}: ground truth {call!r} has too many arguments")
        keywords = [ast.keyword(arg=n, value=v) for n, v in zip(names, node.args)] + node.keywords
        return ast.unparse(ast.Call(func=node.func, args=[], keywords=keywords))

    def _method(self, name: str) -> Any:
        assert self._entry is not None
        for class_name in self._entry.involved_classes:
            method = getattr(backend_class(class_name), name, None)
            if callable(method) and not name.startswith("_"):
                return method
        raise ValueError(f"no backend method {name!r} in {self._entry.involved_classes}")

    # -- parsing -----------------------------------------------------------------------------
    def parse_action(self, text: str) -> Action:
        """`name(arg=literal, ...)` with a function available now, or `finish()`."""
        if self._entry is None:
            raise RuntimeError("BFCLEnv.parse_action called before reset: the allowed tools depend on the task")
        return parse_tool_call(text, allowed=self._available)

    # -- clean-up ----------------------------------------------------------------------------
    def _release(self) -> None:
        self._worker.kill()  # the episode's instances die with it
        self._model_name = ""

    def close(self) -> None:
        self._release()
        self._entry = None


__all__ = ["BFCLEnv"]
