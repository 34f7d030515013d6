"""Hard limits: a wall-clock limit per env step, capped observations, and the episode's time budget.

Run: .venv/bin/pytest -q tests/test_limits.py
"""

from __future__ import annotations

import math
import os
import threading
import time

import pytest

from simplan.envs import registry
from simplan.envs.base import Action, EnvCrashed
from simplan.envs.limits import (
    EnvStuck,
    LimitedEnv,
    StepLimits,
    StepTimeout,
    WorkerDied,
    WorkerError,
    WorkerProcess,
    cap_text,
)
from simplan.envs.registry import make_env
from simplan.envs.toy import ToyEnv
from simplan.inference.engines.scripted import ScriptedEngine, ToyOracle
from simplan.inference.planning.config import PromptConfig
from simplan.inference.planning.planner import Planner, PlannerConfig
from simplan.inference.planning.router import BudgetConfig
from simplan.inference.planning.trace_events import END_STATUSES

SLACK = 1.0  # seconds a limited call may overrun its limit on a loaded 2-core machine (thread/process start)


class GatedToy(ToyEnv):
    """The toy env whose steps wait for `gate` (class-level, so a rebuilt adapter shares it) when `hold` is set."""

    gate = threading.Event()
    hold = threading.Event()

    def step(self, action: Action):
        if self.hold.is_set():
            self.gate.wait(timeout=30)  # released by the test; the timeout only guards a broken test
        return super().step(action)


class SlowFirstStepToy(ToyEnv):
    """The toy env whose first step of each episode sleeps `delay` seconds, then takes effect."""

    delay = 0.45

    def reset(self, task):
        self._slow = True
        return super().reset(task)

    def step(self, action: Action):
        if self._slow:
            self._slow = False
            time.sleep(self.delay)
        return super().step(action)


class SleepyToy(ToyEnv):
    """Every step takes `delay` seconds."""

    delay = 0.2

    def step(self, action: Action):
        time.sleep(self.delay)
        return super().step(action)


@pytest.fixture
def gated(monkeypatch):
    monkeypatch.setitem(registry._REGISTERED, "gated-toy", GatedToy)
    GatedToy.gate.clear()
    GatedToy.hold.clear()
    yield GatedToy
    GatedToy.hold.clear()
    GatedToy.gate.set()  # let any step still waiting finish


def toy_task(seed: int = 101):
    # corridor-101: 5 rooms, the key in room 4, so the expert starts with three "go east"
    return next(t for t in ToyEnv().tasks("dev") if t.params["seed"] == seed)


# -- observations ------------------------------------------------------------------------------------
def test_cap_text_cuts_with_a_note_of_how_much():
    text = "x" * 1_000_000
    capped = cap_text(text, 40_000)
    assert capped.startswith("x" * 40_000) and not capped.startswith("x" * 40_001)
    assert "960,000 more characters cut" in capped and "40,000 characters" in capped
    assert cap_text("short", 40_000) == "short" and cap_text(text, 0) is text


def test_limits_are_validated_naming_the_field():
    with pytest.raises(ValueError, match="step_timeout"):
        StepLimits(step_timeout=-1)
    with pytest.raises(ValueError, match="step_timeout"):
        StepLimits(step_timeout=float("nan"))
    with pytest.raises(ValueError, match="max_observation_chars"):
        StepLimits(max_observation_chars=-5)


def test_make_env_wraps_every_env_with_the_limits():
    env = make_env("toy", step_timeout=7, max_observation_chars=10)
    assert isinstance(env, LimitedEnv) and isinstance(env.unwrapped, ToyEnv)
    assert env.step_timeout == 7 and env.name == "toy"
    obs = env.reset(toy_task())  # "You are in room 1 of 5."
    assert obs.text == "You are in\n[... 13 more characters cut: observations are capped at 10 characters]"
    assert env.step(Action.command("go east")).observation.text.startswith("You are in\n[... 13 more")
    assert make_env("toy").step_timeout == 30.0  # the default


# -- the thread watchdog -----------------------------------------------------------------------------
def test_toy_step_past_the_limit_is_a_failed_action_and_the_episode_goes_on(gated):
    env = make_env("gated-toy", step_timeout=0.2)
    first = env.reset(toy_task())
    gated.hold.set()
    t0 = time.perf_counter()
    result = env.step(Action.command("go east"))
    elapsed = time.perf_counter() - t0
    assert 0.2 <= elapsed < 0.2 + SLACK
    obs = result.observation
    assert obs.error and "did not finish within 0.2 s" in obs.text
    assert result.info["timed_out"] == 0.2 and not result.done and result.score == 0.0
    assert obs.valid_actions == first.valid_actions and obs.goal == first.goal  # the last known state
    # The step finishes late and takes effect: the next observation shows it.
    gated.hold.clear()
    gated.gate.set()
    result = env.step(Action.command("look"))
    assert not result.observation.error and result.observation.text.startswith("You are in room 2 of 5.")
    assert env.timeouts == 1 and env.rebuilds == 0


def test_step_still_running_after_another_limit_is_stuck_and_reset_rebuilds(gated):
    env = make_env("gated-toy", step_timeout=0.2)
    env.reset(toy_task())
    stuck_adapter = env.unwrapped
    gated.hold.set()
    assert env.step(Action.command("go east")).info["timed_out"] == 0.2
    t0 = time.perf_counter()
    with pytest.raises(EnvStuck, match="still running") as caught:
        env.step(Action.command("go east"))
    assert isinstance(caught.value, EnvCrashed)  # the planner and the collector mark the episode errored
    assert time.perf_counter() - t0 < 0.2 + SLACK
    gated.hold.clear()  # the fresh adapter's steps do not wait (the stuck one still does)
    obs = env.reset(toy_task())
    assert env.rebuilds == 1 and env.unwrapped is not stuck_adapter
    assert obs.text.startswith("You are in room 1 of 5.")
    assert env.step(Action.command("go east")).observation.text.startswith("You are in room 2 of 5.")


def test_planner_goes_on_after_a_timed_out_step(monkeypatch):
    monkeypatch.setitem(registry._REGISTERED, "slow-toy", SlowFirstStepToy)
    task = toy_task()
    oracle = ToyOracle(task)
    engine = ScriptedEngine(oracle.decide, oracle.simulate, oracle.score)
    env = make_env("slow-toy", step_timeout=0.3)
    result = Planner(
        engine, env, PlannerConfig(arm="reactive", raise_errors=True, prompts=PromptConfig(max_history=50))
    ).run(task)
    acts = result.trace.of_type("act")
    assert acts[0].error and "did not finish within 0.3 s" in acts[0].observation
    assert acts[0].env_seconds < 0.3 + SLACK
    # The late "go east" took effect (the oracle, replaying the history, agrees): the expert path goes on.
    assert result.summary.status == "success" and result.summary.steps == 6
    assert [a.action for a in acts] == ["go east"] * 3 + ["take key", "go east", "open door"]


# -- the episode's time budget -------------------------------------------------------------------------
def test_episode_time_budget_ends_the_episode():
    assert "budget_time" in END_STATUSES
    task = toy_task()
    oracle = ToyOracle(task)
    engine = ScriptedEngine(oracle.decide, oracle.simulate, oracle.score)
    cfg = PlannerConfig(
        arm="reactive",
        raise_errors=True,
        prompts=PromptConfig(max_history=50),
        budgets=BudgetConfig(max_episode_seconds=0.5),
    )
    result = Planner(engine, SleepyToy(), cfg).run(task)  # 6 steps of 0.2 s would win
    s = result.summary
    assert s.status == "budget_time" and not s.success and 1 <= s.steps < 6
    end = result.trace.of_type("end")[0]
    assert 0.5 <= end.wall_seconds < 0.5 + SleepyToy.delay + SLACK  # checked between steps
    assert result.trace.of_type("start")[0].budgets["max_seconds"] == 0.5
    no_limit = Planner(
        engine,
        SleepyToy(),
        PlannerConfig(
            arm="reactive", prompts=PromptConfig(max_history=50), budgets=BudgetConfig(max_episode_seconds=0)
        ),
    )
    assert no_limit.router.budgets(task).max_seconds == 0
    with pytest.raises(ValueError, match="max_episode_seconds"):
        PlannerConfig(budgets=BudgetConfig(max_episode_seconds=-1))


# -- the stall budget --------------------------------------------------------------------------------
class Script:
    """A decider that scores the next action of a fixed script best (the last one again once it is spent)."""

    def __init__(self, actions: list[str]) -> None:
        self.actions, self.calls = actions, 0

    def score(self, req, text):  # noqa: ANN001, ANN201 - ScriptedEngine's scorer
        want = self.actions[min(self.calls, len(self.actions) - 1)]
        self.calls += 1
        return [0.0 if c == want else -10.0 for c in req.candidates]


def stall_run(actions: list[str], **budgets):
    script = Script(actions)
    engine = ScriptedEngine(lambda req, text: "", lambda req, text: "", script.score)
    cfg = PlannerConfig(arm="reactive", raise_errors=True, budgets=BudgetConfig(**budgets))
    return Planner(engine, ToyEnv(), cfg).run(toy_task())


def test_steps_without_progress_end_the_episode_saying_why_and_the_best_it_reached():
    from simplan.evaluation.losses import classify_loss
    from simplan.inference.planning.trace import format_event

    assert BudgetConfig().stall_steps == 8  # the fitted default (bench/RESULTS.md "Ending a stalled episode")
    # Room 2 is new (progress at step 1); going back and forth after it shows nothing new: steps 2-4 stall.
    result = stall_run(["go east", "go west"] * 10, max_steps=20, stall_steps=3)
    s, (end,) = result.summary, result.trace.of_type("end")
    assert s.status == "budget_stall" and not s.success and s.steps == 4
    assert end.reason == (
        "3 steps without progress (no score above the best, no new observation, no sub-goal met); "
        "best score 0 at step 0"
    )
    assert classify_loss(result.trace).label == "loop"
    line, *known = format_event(end).splitlines()  # what `simplan traces` prints: the end, then what it knew
    assert line.endswith(f"({end.reason})") and known == ["  known: location: 1"]
    # A score above the best is progress, and so is an observation the episode had not seen.
    walk = ["go east"] * 3 + ["take key"] + ["inventory"] * 10  # "You carry: a key." is new once
    result = stall_run(walk, max_steps=20, stall_steps=3)
    (end,) = result.trace.of_type("end")
    assert result.summary.status == "budget_stall" and result.summary.steps == 8
    assert (end.best_score, end.best_step) == (0.5, 4) and end.reason.endswith("best score 0.5 at step 4")
    # 0 never ends an episode for stalling; the step budget does, and says so.
    result = stall_run(["go east", "go west"] * 10, max_steps=6, stall_steps=0)
    (end,) = result.trace.of_type("end")
    assert (
        result.summary.status == "budget_steps"
        and end.reason == "the step budget (6) is spent; best score 0 at step 0"
    )
    # A task family may set its own.
    family = {toy_task().family: {"stall_steps": 2}}
    assert stall_run(["go east", "go west"] * 10, max_steps=20, stall_steps=3, family=family).summary.steps == 3
    with pytest.raises(ValueError, match="stall_steps"):
        BudgetConfig(stall_steps=-1)
    # A won episode has no reason: no budget ended it.
    won = stall_run(["go east"] * 3 + ["take key", "go east", "open door"], stall_steps=3)
    assert won.summary.success and won.trace.of_type("end")[0].reason is None


# -- the worker process ------------------------------------------------------------------------------
def test_worker_process_stops_a_call_past_its_limit_and_restarts():
    worker = WorkerProcess("test")
    try:
        first = worker.call(os.getpid, timeout=30)
        assert first != os.getpid() and worker.call(math.sqrt, 16.0, timeout=30) == 4.0
        t0 = time.perf_counter()
        with pytest.raises(StepTimeout, match="did not finish within 0.3 s"):
            worker.call(time.sleep, 60, timeout=0.3)
        assert time.perf_counter() - t0 < 0.3 + SLACK and not worker.alive
        assert worker.call(os.getpid, timeout=30) not in (first, os.getpid()) and worker.starts == 2
        with pytest.raises(WorkerError, match="ValueError: math domain error"):
            worker.call(math.sqrt, -1.0, timeout=30)
        assert worker.alive  # an exception in the function keeps the worker
        with pytest.raises(WorkerDied, match="exit code 3"):
            worker.call(os._exit, 3, timeout=30)
    finally:
        worker.close()


# -- BFCL: tool calls that hang --------------------------------------------------------------------
@pytest.fixture
def bfcl_task():
    pytest.importorskip("bfcl_eval")
    from simplan.envs.bfcl import BFCLEnv

    tasks = BFCLEnv().tasks("train", families=["multi_turn_base"])
    return next(t for t in tasks if t.params["classes"] == ["GorillaFileSystem", "MathAPI"])


def test_bfcl_huge_power_is_refused_before_the_call(bfcl_task):
    from simplan.envs.bfcl_worker import argument_problem

    env = make_env("bfcl")
    try:
        env.reset(bfcl_task)
        t0 = time.perf_counter()
        result = env.step(env.parse_action("power(base=3, exponent=1000000000)"))
        assert time.perf_counter() - t0 < SLACK
        obs = result.observation
        assert obs.error and "bits" in obs.text and "not executed" in obs.text and result.info["call"] is None
        obs = env.step(env.parse_action("logarithm(value=2.0, base=10.0, precision=300000)")).observation
        assert obs.error and "precision is above the 1000 digits" in obs.text
        huge = 10**400  # too large for a float: the bounds must not convert it (nor must anything else)
        for name, args in (
            ("power", {"base": huge, "exponent": huge}),
            ("square_root", {"number": 2, "precision": huge}),
        ):
            assert env.step(Action.tool_call(name, args)).observation.error
        assert env.step(env.parse_action("power(base=3, exponent=4)")).observation.text == '{"result":81}'
    finally:
        env.close()
    assert "bits" in argument_problem(Action.tool_call("power", {"base": huge, "exponent": huge}))
    assert "bits" in argument_problem(Action.tool_call("power", {"base": -3, "exponent": 63_200}))
    assert argument_problem(Action.tool_call("power", {"base": -3, "exponent": 63_000})) is None
    assert argument_problem(Action.tool_call("power", {"base": 2.5, "exponent": 10**9})) is None  # overflows at once
    assert argument_problem(Action.tool_call("square_root", {"number": 2, "precision": 1000})) is None


def test_bfcl_call_past_the_limit_is_stopped_and_the_episode_goes_on_with_its_state(bfcl_task):
    env = make_env("bfcl", step_timeout=1.0, check_bounds=False)  # no bounds: the time limit must stop it
    try:
        assert env.step_timeout == 1.0
        env.reset(bfcl_task)
        for call in ("mkdir(dir_name='limits_test')", "cd(folder='limits_test')"):
            assert not env.step(env.parse_action(call)).observation.error
        before = env.step(env.parse_action("pwd()")).observation.text
        assert before.endswith('limits_test"}')
        t0 = time.perf_counter()
        result = env.step(env.parse_action("power(base=3, exponent=1000000000)"))
        assert time.perf_counter() - t0 < 1.0 + SLACK
        obs = result.observation
        assert obs.error and "did not finish within 1 s" in obs.text and "no effect" in obs.text
        assert result.info["timed_out"] == 1.0 and result.info["call"] is None and not result.done
        # A fresh worker replayed the episode's calls: the directory made before the timeout is still current.
        assert env.step(env.parse_action("pwd()")).observation.text == before
        assert env.step(env.parse_action("power(base=2, exponent=10)")).observation.text == '{"result":1024}'
        assert env.unwrapped._worker.starts == 2
    finally:
        env.close()


def test_bfcl_observation_is_capped(bfcl_task):
    env = make_env("bfcl", max_observation_chars=100)
    try:
        env.reset(bfcl_task)
        text = env.step(env.parse_action("square_root(number=2, precision=1000)")).observation.text
        assert "1.41421356" in text and "more characters cut" in text
        assert len(text.split("\n")[0]) == 100
    finally:
        env.close()


def test_a_worker_starts_from_a_user_script_without_a_main_guard(tmp_path) -> None:
    """spawn ran the parent's main script again in the child: a script that starts a worker at module level (as
    `make_env("bfcl")` does) started one inside the worker, which died ("bfcl worker process died")."""
    import subprocess
    import sys

    script = tmp_path / "unguarded.py"
    script.write_text(
        "import os\n"
        "from simplan.envs.limits import WorkerProcess\n"
        "worker = WorkerProcess('probe')\n"
        "print('ran in a child:', worker.call(os.getpid, timeout=60) != os.getpid())\n"
        "worker.close()\n"
    )
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "ran in a child: True"
