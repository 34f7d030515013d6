"""Check that an environment adapter keeps the `envs.base.Env` contract (in the spirit of gymnasium's check_env).

    from simplan.envs.check import check_env
    report = check_env(make_env("twx"), fold_sample=3)
    print(report.table()); assert report.ok
    simplan envs check twx --sample 3 --families coin,twc        # the same from the command line

Checks (each a named `CheckResult`, failures carry a message saying what and where; each is a `check_*(ctx)`
function below, run in this order by `check_env`, later ones reading what earlier ones found in the
`CheckContext`):
- protocol: the object implements `Env` and has a name;
- tasks: every fold lists `Task`s of this env and fold, in a stable order; train is not empty;
- folds disjoint: no task id in two folds;
- reset/step types: `reset` returns an `Observation`, `step` a `StepResult` with numeric score and
  bool done/won, and the same task resets to the same observation;
- parse_action: rejects empty and multi-line output, and parses back the rendering of the
  expert's first action (`data.format.render_action`) to the same action;
- invalid action: an unknown command (text envs) or unknown tool (tool envs) gives an error
  observation (`Observation.error`), not an exception, and does not end the episode;
- expert: on `fold_sample` train tasks per family (evenly spread over the family's train list),
  each expert the adapter offers reaches `won` (100% required): the fixed `expert_plan()` (unless a
  policy is offered and the plan is empty) and the reacting policy `expert_action(observation)`
  (asked at each real state, at most `max_policy_steps` times); expert steps flagged as errors are
  reported; an expert command missing from a valid-action list that claims to be complete
  (`Observation.valid_actions_complete`) fails the check;
- step after done: a step after the episode ended returns `done=True` (or raises a RuntimeError
  that says so), never anything else;
- optional attributes (`envs.base.EnvDefaults`): where the adapter sets them, `description` is a str,
  `families` a list or tuple of str that holds every listed task's family, the pattern lists
  (`error_patterns`, `progress_patterns`, `transient_patterns`, `replan_patterns`, `accept_patterns`)
  regexes that compile, `step_timeout` None or seconds >= 0, `accepts`, `expert_action`, `subgoals` and `facts`
  None or callable;
- sub-goals: where the adapter declares `subgoals` and `facts` (both or neither), the expert on the expert
  check's sample never takes a call the first unmet sub-goal rejects, and meets every sub-goal when it wins;
- inverses: where the adapter declares `inverse`, on the expert check's sample each expert step that has an inverse
  is undone by it and taken again: the inverse must restore the valid actions and the score of the state before
  the step (what the planner's backtracking relies on);
- ask tool: where the adapter declares `ask_tool`, it is one of the tools each sampled task offers, and a question
  (each required argument a string) is answered without an error and without ending the episode.
"""

from __future__ import annotations

import functools
import re
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field

from tqdm import tqdm

from simplan.envs.base import (
    EXTRAS,
    FOLDS,
    GRADES,
    PATTERN_EXTRAS,
    Action,
    ActionParseError,
    Env,
    EnvCrashed,
    EnvDefaults,
    Observation,
    StepResult,
    Task,
    env_extra,
    expert_policy,
    inverse_restores,
    missing_from_complete_list,
    path_grade,
)
from simplan.envs.subgoals import Belief, env_facts, first_unmet_rejects, unmet

INVALID_COMMAND = "xyzzy frobnicate"
INVALID_TOOL = "xyzzy_frobnicate"
MAX_POLICY_STEPS = 200  # a policy that has not ended its episode by then is looping


@dataclass
class CheckResult:
    name: str
    passed: bool
    message: str = ""
    seconds: float = 0.0


@dataclass
class CheckReport:
    env: str
    results: list[CheckResult] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return bool(self.results) and all(r.passed for r in self.results)

    @property
    def failed(self) -> list[CheckResult]:
        return [r for r in self.results if not r.passed]

    def table(self) -> str:
        """A plain-text table: check, PASS/FAIL, seconds, message."""
        width = max([len(r.name) for r in self.results] + [5])
        lines = [f"{'check':<{width}}  result  seconds  message", "-" * (width + 40)]
        for r in self.results:
            status = "PASS" if r.passed else "FAIL"
            lines.append(f"{r.name:<{width}}  {status:<6}  {r.seconds:7.1f}  {r.message}")
        verdict = "all checks passed" if self.ok else f"{len(self.failed)} of {len(self.results)} checks failed"
        lines.append(f"{self.env}: {verdict}")
        return "\n".join(lines)


class _CheckFailed(Exception):
    pass


def _require(cond: bool, message: str) -> None:
    if not cond:
        raise _CheckFailed(message)


def _run(report: CheckReport, name: str, fn: Callable[[], str]) -> bool:
    """Run one check; an assertion failure or any exception becomes a FAIL with a message."""
    t0 = time.perf_counter()
    try:
        message, passed = fn(), True
    except _CheckFailed as e:
        message, passed = str(e), False
    except Exception as e:  # an adapter raising where it should not is exactly what we report
        where = traceback.extract_tb(e.__traceback__)[-1]
        message = f"{type(e).__name__}: {e} (at {where.filename}:{where.lineno})"
        passed = False
    report.results.append(CheckResult(name, passed, message, time.perf_counter() - t0))
    return passed


def _check_observation(obs: object, where: str) -> Observation:
    _require(isinstance(obs, Observation), f"{where} returned {type(obs).__name__}, expected Observation")
    assert isinstance(obs, Observation)
    _require(isinstance(obs.text, str), f"{where}: Observation.text is {type(obs.text).__name__}, expected str")
    _require(isinstance(obs.goal, str), f"{where}: Observation.goal is {type(obs.goal).__name__}, expected str")
    va = obs.valid_actions
    _require(
        va is None or (isinstance(va, list) and all(isinstance(a, str) for a in va)),
        f"{where}: Observation.valid_actions must be None or a list of str",
    )
    _require(obs.tools is None or isinstance(obs.tools, list), f"{where}: Observation.tools must be None or a list")
    _require(isinstance(obs.error, bool), f"{where}: Observation.error is {type(obs.error).__name__}, expected bool")
    return obs


def _check_step(result: object, where: str) -> StepResult:
    _require(isinstance(result, StepResult), f"{where} returned {type(result).__name__}, expected StepResult")
    assert isinstance(result, StepResult)
    _check_observation(result.observation, where)
    for attr in ("reward", "score"):
        value = getattr(result, attr)
        _require(isinstance(value, int | float), f"{where}: StepResult.{attr} is {type(value).__name__}, not a number")
    for attr in ("done", "won"):
        value = getattr(result, attr)
        _require(isinstance(value, bool), f"{where}: StepResult.{attr} is {type(value).__name__}, expected bool")
    _require(isinstance(result.info, dict), f"{where}: StepResult.info must be a dict")
    return result


def _families(tasks: list[Task]) -> list[str]:
    return list(dict.fromkeys(t.family for t in tasks))


def _spread(items: list[Task], n: int) -> list[Task]:
    """n items evenly spread over the list (deterministic), all of them when n >= len."""
    if n >= len(items):
        return list(items)
    return [items[(i * len(items)) // n] for i in range(n)]


Watch = Callable[[Action, StepResult], None]  # called after each step the expert takes, with its result


def play(
    env: Env,
    task: Task,
    actions: list[Action],
    first: Observation | None = None,
    unlisted: list[str] | None = None,
    watch: Watch | None = None,
) -> tuple[StepResult | None, int, int]:
    """Play actions from `reset(task)` until done: (last result, steps taken, steps flagged as errors).

    With `first` (the reset observation) and a list `unlisted`, each action taken where the observation
    claims an exhaustive valid-action list (`valid_actions_complete`) but does not list it is noted there;
    `watch(action, result)` sees every step.
    """
    last: StepResult | None = None
    obs = first
    steps = errors = 0
    for action in actions:
        if unlisted is not None and obs is not None and missing_from_complete_list(env, obs, action):
            unlisted.append(f"{task.task_id} step {steps}: {action.key()!r}")
        last = env.step(action)
        if watch is not None:
            watch(action, last)
        obs = last.observation
        steps += 1
        errors += int(last.observation.error)
        if last.done:
            break
    return last, steps, errors


def play_policy(
    env: Env,
    task: Task,
    first: Observation,
    unlisted: list[str] | None = None,
    max_steps: int = MAX_POLICY_STEPS,
    watch: Watch | None = None,
) -> tuple[StepResult | None, list[Action], int]:
    """Play the env's reacting expert from `first` (the reset observation of `task`) until done, until it has
    nothing more to do, or for `max_steps`: (last result, actions taken, steps flagged as errors); `watch` as
    in `play`."""
    policy = expert_policy(env)
    _require(policy is not None, f"{type(env).__name__} has no expert_action")
    assert policy is not None
    last: StepResult | None = None
    obs, actions, errors = first, [], 0
    while len(actions) < max_steps and (action := policy(obs)) is not None:
        _require(isinstance(action, Action), f"expert_action returned {type(action).__name__}, expected Action")
        if unlisted is not None and missing_from_complete_list(env, obs, action):
            unlisted.append(f"{task.task_id} step {len(actions)}: {action.key()!r}")
        last = env.step(action)
        if watch is not None:
            watch(action, last)
        obs = last.observation
        actions.append(action)
        errors += int(obs.error)
        if last.done:
            break
    return last, actions, errors


def first_expert_action(env: Env, obs: Observation) -> Action:
    """The expert's action right after a reset that gave `obs`: the policy's, else the plan's first."""
    policy = expert_policy(env)
    action = policy(obs) if policy is not None else None
    if action is None:
        plan = env.expert_plan()
        _require(bool(plan), "the expert has no first action (expert_action gave None, expert_plan() is empty)")
        action = plan[0]
    return action


@dataclass
class CheckContext:
    """What the checks of one `check_env` run share: the env, the options, and what earlier checks found."""

    env: Env
    families: list[str] | None
    fold_sample: int
    progress: bool
    label: str  # the env's name in the report
    listed: dict[str, list[Task]] = field(default_factory=dict)  # fold -> tasks, filled by `check_tasks`
    last_won: Task | None = None  # the last train task the expert won, set by `check_expert`


def check_protocol(ctx: CheckContext) -> str:
    env = ctx.env
    _require(isinstance(env, Env), f"{type(env).__name__} does not implement envs.base.Env")
    _require(isinstance(getattr(env, "name", None), str) and bool(env.name), "env.name must be a non-empty str")
    return f"{type(env).__name__} implements Env"


def check_tasks(ctx: CheckContext) -> str:
    env, families, listed = ctx.env, ctx.families, ctx.listed
    for fold in FOLDS:
        ts = env.tasks(fold, families=families)
        _require(isinstance(ts, list), f"tasks({fold!r}) returned {type(ts).__name__}, expected list")
        for t in ts:
            _require(isinstance(t, Task), f"tasks({fold!r}) holds a {type(t).__name__}, expected Task")
            _require(t.env == env.name, f"task {t.task_id}: env={t.env!r}, expected {env.name!r}")
            _require(t.fold == fold, f"task {t.task_id}: fold={t.fold!r}, listed under {fold!r}")
        ids = [t.task_id for t in ts]
        _require(len(set(ids)) == len(ids), f"tasks({fold!r}) lists some task id twice")
        _require(
            [t.task_id for t in env.tasks(fold, families=families, limit=5)] == ids[:5],
            f"tasks({fold!r}, limit=5) is not the first 5 of tasks({fold!r}): the order is not stable",
        )
        listed[fold] = ts
    _require(bool(listed["train"]), f"no train tasks (families={families})")
    return ", ".join(f"{f}: {len(listed[f])}" for f in FOLDS) + f" tasks, {len(_families(listed['train']))} families"


def check_folds_disjoint(ctx: CheckContext) -> str:
    _require(bool(ctx.listed), "needs the task listing, which failed")
    seen: dict[str, str] = {}
    for fold in FOLDS:
        for t in ctx.listed[fold]:
            _require(t.task_id not in seen, f"task id {t.task_id} is in both {seen.get(t.task_id)} and {fold}")
            seen[t.task_id] = fold
    return f"{len(seen)} task ids, none in two folds"


def check_types(ctx: CheckContext) -> str:
    env = ctx.env
    _require(bool(ctx.listed.get("train")), "needs train tasks, which failed")
    task = ctx.listed["train"][0]
    obs = _check_observation(env.reset(task), f"reset({task.task_id})")
    plan = env.expert_plan()
    has_policy = expert_policy(env) is not None
    _require(isinstance(plan, list), f"expert_plan() returned {type(plan).__name__}, expected a list")
    _require(bool(plan) or has_policy, f"expert_plan() after reset({task.task_id}) is empty, and no expert_action")
    _require(all(isinstance(a, Action) for a in plan), "expert_plan() must return a list of Action")
    first = first_expert_action(env, obs)
    result = _check_step(env.step(first), f"step({first.key()}) on {task.task_id}")
    again = _check_observation(env.reset(task), f"second reset({task.task_id})")
    _require(again.text == obs.text, f"reset({task.task_id}) twice gave different observations")
    return f"{task.task_id}: Observation, StepResult(score={result.score:.2f}), reset is repeatable"


def check_parse_action(ctx: CheckContext) -> str:
    from simplan.envs.actions import render_action

    env = ctx.env
    _require(bool(ctx.listed.get("train")), "needs train tasks, which failed")
    task = ctx.listed["train"][0]
    first = first_expert_action(env, env.reset(task))
    rendered = render_action(first)
    for bad in ("", "   \n ", f"{rendered}\n{rendered}"):
        try:
            env.parse_action(bad)
        except ActionParseError:
            continue
        raise _CheckFailed(f"parse_action accepted {bad!r}; it must raise ActionParseError")
    parsed = env.parse_action(rendered)
    _require(parsed.key() == first.key(), f"parse_action({rendered!r}) gave {parsed.key()!r}, not {first.key()!r}")
    return f"rejects empty and multi-line output; {rendered!r} round-trips"


def check_invalid_action(ctx: CheckContext) -> str:
    env = ctx.env
    _require(bool(ctx.listed.get("train")), "needs train tasks, which failed")
    task = ctx.listed["train"][0]
    obs = env.reset(task)
    action = Action.tool_call(INVALID_TOOL, {}) if obs.tools else Action.command(INVALID_COMMAND)
    try:
        result = _check_step(env.step(action), f"step({action.key()})")
    except (_CheckFailed, EnvCrashed):
        raise
    except Exception as e:
        raise _CheckFailed(f"step({action.key()}) on {task.task_id} raised {type(e).__name__}: {e}") from None
    _require(result.observation.error, f"step({action.key()}) on {task.task_id}: Observation.error is False")
    _require(not result.done, f"step({action.key()}) on {task.task_id} ended the episode")
    return f"{action.key()} -> error observation {result.observation.text[:60]!r}"


def _train_sample(ctx: CheckContext) -> dict[str, list[Task]]:
    """The expert checks' train tasks: `fold_sample` per family, spread over each family's list."""
    _require(bool(ctx.listed.get("train")), "needs train tasks, which failed")
    by_family: dict[str, list[Task]] = {}
    for t in ctx.listed["train"]:
        by_family.setdefault(t.family, []).append(t)
    return {family: _spread(tasks, ctx.fold_sample) for family, tasks in by_family.items()}


def check_expert(ctx: CheckContext) -> str:
    env = ctx.env
    by_family = _train_sample(ctx)
    sample = [t for tasks in by_family.values() for t in tasks]
    wins: dict[str, list[int]] = {f: [0, 0] for f in by_family}
    failures: list[str] = []
    error_steps: list[str] = []
    unlisted: list[str] = []
    bar = tqdm(sample, desc=f"{ctx.label} expert", unit="ep", disable=not ctx.progress, leave=False)
    has_policy = expert_policy(env) is not None
    kinds: list[str] = []
    for task in bar:
        bar.set_postfix_str(task.task_id)
        runs: list[tuple[str, StepResult | None, str, int]] = []  # (kind, last result, steps, errors)
        first = env.reset(task)
        plan = env.expert_plan()
        if plan or not has_policy:
            last, steps, errors = play(env, task, plan, first, unlisted)
            runs.append(("plan", last, f"{steps}/{len(plan)}", errors))
        if has_policy:
            last, actions, errors = play_policy(env, task, env.reset(task), unlisted)
            runs.append(("policy", last, str(len(actions)), errors))
        kinds = [kind for kind, *_ in runs]
        wins[task.family][1] += 1
        lost = [(kind, last, steps) for kind, last, steps, _ in runs if last is None or not last.won]
        if not lost:
            wins[task.family][0] += 1
            ctx.last_won = task
        for kind, last, steps in lost:
            state = "no step" if last is None else f"score {last.score:.2f}, done={last.done}"
            failures.append(f"{task.task_id} {kind} ({steps} steps, {state})")
        if any(errors for *_, errors in runs):
            error_steps.append(f"{task.task_id}: {'+'.join(str(e) for *_, e in runs)}")
    won = sum(w for w, _ in wins.values())
    per_family = " ".join(f"{f}={w}/{n}" for f, (w, n) in wins.items()) + f"; expert: {' and '.join(kinds)}"
    note = f"; expert steps flagged as errors: {', '.join(error_steps[:5])}" if error_steps else ""
    _require(not failures, f"expert failed on {len(failures)}/{len(sample)}: {', '.join(failures[:5])}{note}")
    _require(
        not unlisted,
        f"{len(unlisted)} expert actions are missing from valid-action lists marked complete "
        f"({', '.join(unlisted[:3])}): fix the list, or set Observation.valid_actions_complete=False "
        "(the planner then stops ruling out unlisted actions)",
    )
    return f"{won}/{len(sample)} won ({per_family}){note}"


def _play_expert(env: Env, task: Task, first: Observation, watch: Watch) -> StepResult | None:
    """The env's reacting expert from `first` (the reset observation of `task`) where it has one, else its plan,
    each step seen by `watch`: the last result."""
    if expert_policy(env) is not None:
        return play_policy(env, task, first, watch=watch)[0]
    return play(env, task, env.expert_plan(), watch=watch)[0]


def _expert_against_subgoals(env: Env, task: Task, declare: Callable, facts: Callable) -> tuple[int, list[str]]:
    """Play the expert on `task` with its sub-goals watched: (sub-goals it met, what disagreed)."""
    obs = env.reset(task)
    goals = list(declare(obs.goal))
    belief = Belief()
    problems: list[str] = []
    step = 0

    def watch(action: Action, result: StepResult) -> None:
        # the call checked against the belief before its step, as the planner checks it before it runs
        nonlocal step
        rejected = first_unmet_rejects(goals, belief, facts(action, None, False))
        if rejected:
            problems.append(f"{task.task_id} step {step}: {action.key()!r} fails {rejected[0].describe()}")
        belief.add(facts(action, result.observation.text, bool(result.observation.error)))
        step += 1

    last = _play_expert(env, task, obs, watch)
    left = unmet(goals, belief)
    if last is not None and last.won and left:
        problems.append(f"{task.task_id}: won with {left[0].name!r} unmet")
    return len(goals) - len(left), problems


def _expert_facts(env: Env, sample: list[Task]) -> str:
    """Facts without sub-goals (a snapshot's only): the extractor runs on every observation of the expert's paths
    and returns Facts (envs/subgoals.py env_facts raises otherwise)."""
    counts = [0, 0]

    def watch(action: Action, result: StepResult) -> None:
        obs = result.observation
        counts[0] += len(env_facts(env, action, obs.text, bool(obs.error)))
        counts[1] += 1

    for task in sample:
        obs = env.reset(task)
        counts[0] += len(env_facts(env, None, obs.text, False))
        _play_expert(env, task, obs, watch)
    return f"no sub-goals; facts: {counts[0]} from {counts[1]} expert steps on {len(sample)} tasks (resets included)"


def check_subgoals(ctx: CheckContext) -> str:
    """The env's sub-goals agree with its expert: on the expert check's sample of train tasks, the expert never
    takes a call that the first unmet sub-goal rejects, and every sub-goal is met when it wins."""
    env = ctx.env
    declare, facts = env_extra(env, "subgoals"), env_extra(env, "facts")
    if declare is None and facts is None:
        return "none declared"
    _require(facts is not None, "sub-goals are checked on the facts of each step: declare `facts` too")
    sample = [t for tasks in _train_sample(ctx).values() for t in tasks]
    if declare is None:
        return _expert_facts(env, sample)
    met, problems = 0, []
    for task in sample:
        n, found = _expert_against_subgoals(env, task, declare, facts)
        met, problems = met + n, problems + found
    _require(not problems, f"the sub-goals disagree with the expert: {', '.join(problems[:3])}")
    return f"the expert meets {met} sub-goals on {len(sample)} tasks and contradicts none"


def _undo_each_step(env: Env, task: Task, inverse: Callable[[Action], Action | None]) -> tuple[int, list[str]]:
    """Walk the expert plan of `task`, undoing each step that has an inverse and taking it again: (steps undone,
    those the inverse did not restore)."""
    obs, score = env.reset(task), 0.0
    undone, problems = 0, []
    for i, action in enumerate(env.expert_plan()):
        result = env.step(action)
        back = inverse(action)
        if back is not None and not result.done and not result.observation.error:
            restored = env.step(back)
            undone += 1
            if restored.done or not inverse_restores(obs, score, restored):
                problems.append(f"{task.task_id} step {i} {action.key()!r} undone by {back.key()!r}")
                return undone, problems  # the walk is off the expert's path
            result = env.step(action)
        if result.done:
            break
        obs, score = result.observation, float(result.score)
    return undone, problems


def check_inverses(ctx: CheckContext) -> str:
    """The env's inverses undo what they claim to, on the expert check's sample of train tasks."""
    env = ctx.env
    inverse = env_extra(env, "inverse")
    if inverse is None:
        return "none declared"
    sample = [t for tasks in _train_sample(ctx).values() for t in tasks]
    undone, problems = 0, []
    for task in sample:
        n, found = _undo_each_step(env, task, inverse)
        undone, problems = undone + n, problems + found
    _require(not problems, f"inverses that do not restore the state: {', '.join(problems[:3])}")
    return f"{undone} expert steps on {len(sample)} tasks undone, each back to its valid actions and score"


def check_ask(ctx: CheckContext) -> str:
    """The env's ask tool is one of its tools and answers: a question, each required argument a string, is no error
    and ends no episode, on the expert check's sample of train tasks."""
    env, tool = ctx.env, env_extra(ctx.env, "ask_tool")
    if tool is None:
        return "none declared"
    _require(isinstance(tool, str) and tool, f"ask_tool must be None or a tool's name, got {tool!r}")
    sample = [t for tasks in _train_sample(ctx).values() for t in tasks]
    for task in sample:
        obs = env.reset(task)
        spec = next((t for t in obs.tools or () if t.get("name") == tool), None)
        names = ", ".join(str(t.get("name")) for t in obs.tools or ())
        _require(spec is not None, f"{task.task_id}: ask_tool {tool!r} is not among the tools ({names or 'none'})")
        required = (spec.get("parameters") or {}).get("required") or []
        result = _check_step(env.step(Action.tool_call(tool, {name: "What do you want?" for name in required})), tool)
        text = result.observation.text[:60]
        _require(not result.observation.error, f"{task.task_id}: asking failed: {text!r}")
        _require(not result.done, f"{task.task_id}: asking ended the episode")
    return f"{tool!r} answered on {len(sample)} tasks (e.g. {text!r})"


def check_grade(ctx: CheckContext) -> str:
    """The env's grade_request rule gives one of GRADES (or None) on the expert check's sample of train tasks, and
    how often it grades a request as the expert's plan needed (`path_grade`: a disagreement is shown, not failed)."""
    env, rule = ctx.env, env_extra(ctx.env, "grade_request")
    if rule is None:
        return "none declared"
    _require(callable(rule), f"grade_request must be None or callable, got {type(rule).__name__}")
    sample = [t for tasks in _train_sample(ctx).values() for t in tasks]
    agree, graded = 0, 0
    for task in sample:
        obs = env.reset(task)
        grade = rule(obs.goal, obs.text)
        _require(grade is None or grade in GRADES, f"{task.task_id}: graded {grade!r}, not one of {', '.join(GRADES)}")
        if grade is not None:
            graded += 1
            agree += grade == path_grade(env.expert_plan(), env_extra(env, "ask_tool"))
    return f"graded {graded}/{len(sample)} tasks; {agree} as the expert's plan needed"


def check_after_done(ctx: CheckContext) -> str:
    env = ctx.env
    _require(ctx.last_won is not None, "needs an episode the expert won, which the expert check did not produce")
    task = ctx.last_won
    first = env.reset(task)
    if expert_policy(env) is not None:
        last, plan, _ = play_policy(env, task, first)
    else:
        plan = env.expert_plan()
        last, _, _ = play(env, task, plan)
    _require(last is not None and last.done, f"{task.task_id}: the expert episode did not end")
    action = plan[-1]
    try:
        result = env.step(action)
    except EnvCrashed:
        raise
    except RuntimeError as e:
        return f"raises RuntimeError: {e}"
    result = _check_step(result, f"step after done on {task.task_id}")
    _require(result.done, f"step after done on {task.task_id} returned done=False")
    return f"returns done=True ({result.observation.text[:50]!r})"


def check_extras(ctx: CheckContext) -> str:
    env = ctx.env
    description, families = env_extra(env, "description"), env_extra(env, "families")
    _require(isinstance(description, str), f"description is {type(description).__name__}, expected str")
    _require(
        isinstance(families, list | tuple) and all(isinstance(f, str) for f in families),
        f"families must be a list or tuple of str, got {families!r}",
    )
    if families:
        unlisted = sorted({t.family for ts in ctx.listed.values() for t in ts} - set(families))
        _require(not unlisted, f"tasks have families {unlisted} that `families` does not list")
    for name in ("accepts", "expert_action", "subgoals", "facts", "inverse"):
        hook = env_extra(env, name)
        _require(hook is None or callable(hook), f"{name} must be None or a method, got {hook!r}")
    for name in PATTERN_EXTRAS:
        patterns = env_extra(env, name)
        _require(isinstance(patterns, list | tuple), f"{name} must be a list or tuple of regexes")
        for p in patterns:
            try:
                re.compile(p)
            except (re.error, TypeError) as e:
                raise _CheckFailed(f"{name}: {p!r} is not a regular expression ({e})") from None
    timeout = env_extra(env, "step_timeout")
    _require(
        timeout is None or (isinstance(timeout, int | float) and timeout >= 0),
        f"step_timeout must be None or seconds >= 0, got {timeout!r}",
    )
    set_here = [n for n in EXTRAS if env_extra(env, n) != getattr(EnvDefaults, n)]
    return f"set: {', '.join(set_here) or 'none (defaults)'}"


def check_env(
    env: Env,
    fold_sample: int = 3,
    families: list[str] | None = None,
    progress: bool = True,
) -> CheckReport:
    """Run every check on `env` (see the module docstring); never raises for an adapter's fault."""
    if fold_sample < 1:
        raise ValueError(f"fold_sample: must be >= 1, got {fold_sample}")
    report = CheckReport(env=getattr(env, "name", type(env).__name__))
    ctx = CheckContext(env, families, fold_sample, progress, label=report.env)
    checks: list[tuple[str, Callable[[CheckContext], str]]] = [
        ("protocol", check_protocol),
        ("tasks", check_tasks),
        ("folds disjoint", check_folds_disjoint),
        ("reset/step types", check_types),
        ("parse_action", check_parse_action),
        ("invalid action", check_invalid_action),
        (f"expert success (train, {fold_sample}/family)", check_expert),
        ("step after done", check_after_done),
        ("optional attributes", check_extras),
        ("sub-goals", check_subgoals),
        ("inverses", check_inverses),
        ("ask tool", check_ask),
        ("grade rule", check_grade),
    ]
    for name, check in checks:
        _run(report, name, functools.partial(check, ctx))
    return report
