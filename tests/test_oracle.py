"""The env oracle (inference/planning/oracle.py): its predictions are exactly what the real env returns (toy, TWX,
BFCL, ScienceWorld), it replays only what it must, and a planner with `simulator: env` commits plans that reality
meets.

    .venv/bin/pytest -q -m "not slow" tests/test_oracle.py     # ScienceWorld (a ~10 s JVM load per reset) is slow
"""

from __future__ import annotations

import dataclasses
import importlib.util
import time

import pytest

from simplan.envs.base import Action, Env, Observation, StepResult, Task
from simplan.envs.limits import LimitedEnv
from simplan.envs.registry import make_env
from simplan.envs.toy import ToyEnv
from simplan.evaluation.faults import FaultConfig, FaultyEnv
from simplan.evaluation.runner import EvalConfig
from simplan.inference.engines.scripted import ScriptedEngine, ToyOracle, prompt_actions, toy_expert_action
from simplan.inference.planning.config import ImaginationConfig, PromptConfig
from simplan.inference.planning.imagination import Rollout
from simplan.inference.planning.judge import Judge, JudgeMemory, JudgeWeights, Outcome
from simplan.inference.planning.oracle import EnvOracle, OracleTimeout, executed_actions, same_env_factory
from simplan.inference.planning.planner import Planner, PlannerConfig
from simplan.inference.planning.trace import EpisodeTrace

TOY_TASKS = ToyEnv().tasks("dev")[2:5]


def _has(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def _other_action(obs: Observation, action: Action, env: Env) -> Action:
    """An action other than `action`: another listed valid action, else ending the turn (tool envs)."""
    for text in obs.valid_actions or []:
        other = env.parse_action(text)
        if other.key() != action.key():
            return other
    return Action(kind="finish") if action.kind != "finish" else Action.tool_call("no_such_tool", {"x": 1})


def _walk(env: Env, task: Task, actions: list[Action]) -> StepResult | None:
    env.reset(task)
    result = None
    for a in actions:
        result = env.step(a)
    return result


def _seen(obs: Observation) -> Observation:
    """`obs` as compared: ScienceWorld's valid actions are a capped hint (`valid_actions_complete=False`) whose
    subset differs between two real runs of one task (its list arrives in no fixed order), so only complete
    lists are compared."""
    return obs if obs.valid_actions_complete else dataclasses.replace(obs, valid_actions=None)


def assert_oracle_matches_reality(
    real: Env, twin: Env, oracle: EnvOracle, task: Task, path: list[Action] | None = None, steps: int = 5
) -> None:
    """Walk `path` (default: the expert's first `steps` actions) on the `real` env; before each real step, the
    oracle's prediction of that step, of another action, and of the real action after the other one must
    equal what a real env returns (an independent `twin` replays the imagined branches)."""
    obs = real.reset(task)
    path = list(path if path is not None else real.expert_plan()[:steps])
    assert path, task.task_id
    for i, action in enumerate(path):
        other = _other_action(obs, action, real)
        assert other.key() != action.key()
        imagined_other = oracle.predict(task, path[:i], [other])
        imagined_two = oracle.predict(task, path[:i], [other, action])
        imagined = oracle.predict(task, path[:i], [action])
        assert _seen(_walk(twin, task, [*path[:i], other]).observation) == _seen(imagined_other), (i, other)
        assert _seen(twin.step(action).observation) == _seen(imagined_two), (task.task_id, i, "two deep")
        result = real.step(action)
        assert _seen(imagined) == _seen(result.observation), (task.task_id, i, action)
        obs = result.observation
        if result.done:
            break
    assert oracle.stats.errors == 0 and oracle.stats.timeouts == 0


@pytest.fixture(scope="module")
def pairs():
    """A real env, its twin and an oracle of copies of it per env name, made on first use and shared by the
    module (JVMs and BFCL's workers start slowly; the oracle's cache is keyed by task, so sharing it is safe)."""
    made: dict[str, tuple[Env, Env, EnvOracle]] = {}

    def get(name: str) -> tuple[Env, Env, EnvOracle]:
        if name not in made:
            real = make_env(name)
            made[name] = (real, make_env(name), EnvOracle(same_env_factory(real), copies=2))
        return made[name]

    yield get
    for real, twin, oracle in made.values():
        oracle.close()
        real.close()
        twin.close()


# -- toy --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("task", TOY_TASKS, ids=lambda t: t.task_id)
def test_toy_predictions_are_the_real_steps(task, pairs):
    env = ToyEnv()
    env.reset(task)
    plan = env.expert_plan()
    # A failing action inside the path: the oracle must replay failures too.
    path = [plan[0], Action.command("open door"), *plan[1:]]
    assert_oracle_matches_reality(*pairs("toy"), task, path)


def test_replays_only_what_is_new_and_answers_repeats_from_the_cache():
    task = TOY_TASKS[0]
    made: list[ToyEnv] = []

    def make() -> ToyEnv:
        made.append(ToyEnv())
        return made[-1]

    oracle = EnvOracle(make, copies=2)
    east, look, inv = Action.command("go east"), Action.command("look"), Action.command("inventory")
    oracle.predict(task, [], [east])
    oracle.predict(task, [], [look])  # a second candidate: the second copy
    assert (oracle.stats.resets, oracle.stats.steps, len(made)) == (2, 2, 2)
    oracle.predict(task, [], [east, inv])  # the next depth of the first candidate goes on from its copy
    oracle.predict(task, [], [look, east])
    assert (oracle.stats.resets, oracle.stats.steps) == (2, 4)
    oracle.predict(task, [east], [inv])  # a real step that followed the first candidate: still no reset
    assert (oracle.stats.resets, oracle.stats.steps) == (2, 4)  # ... and that very question was asked above
    assert oracle.stats.hits == 1
    oracle.predict(task, [east, east], [look])  # diverges from both copies: the older one is reset
    assert (oracle.stats.resets, oracle.stats.steps, len(made)) == (3, 7, 2)
    oracle.close()
    assert all(env._task is None for env in made)  # closed


class SlowToy(ToyEnv):
    def step(self, action: Action) -> StepResult:
        time.sleep(0.05)
        return super().step(action)


def test_a_replay_past_the_time_limit_raises_and_the_next_call_goes_on_from_there():
    task = TOY_TASKS[0]
    oracle = EnvOracle(SlowToy, time_limit=0.12)
    path = [Action.command("look")] * 6
    with pytest.raises(OracleTimeout, match="took over 0.12 s"):
        oracle.predict(task, path[:-1], path[-1:])
    stepped = oracle.stats.steps
    assert 1 <= stepped < 6 and oracle.stats.timeouts == 1
    predicted = None
    for _ in range(6):  # each call goes on from where the last one stopped: never from the reset again
        try:
            predicted = oracle.predict(task, path[:-1], path[-1:])
            break
        except OracleTimeout:
            continue
    assert oracle.stats.steps == 6 and oracle.stats.resets == 1
    assert predicted == _walk(ToyEnv(), task, path).observation
    oracle.close()


def test_executed_actions_skip_steps_a_fault_kept_from_running():
    a, b, c = Action.command("a"), Action.command("b"), Action.command("c")
    assert executed_actions([a, b, c], [None, "transient", "perturb"]) == [a, c]
    assert executed_actions([a, b], [None, "tool_error"]) == [a]
    with pytest.raises(ValueError, match="2 actions but 1"):
        executed_actions([a, b], [None])


def test_copies_have_the_adapters_settings_and_limits_but_no_faults():
    real = FaultyEnv(make_env("toy", max_rooms=9, step_timeout=7), FaultConfig(transient=1.0))
    copy = same_env_factory(real)()
    assert isinstance(copy, LimitedEnv) and copy.unwrapped.max_rooms == 9 and copy.step_timeout == 7
    task = Task("toy", "corridor-13", "dev", "corridor", {"seed": 13})
    copy.reset(task)
    assert copy.step(Action.command("go east")).observation.text.startswith("You are in room 2")
    assert isinstance(same_env_factory(ToyEnv(max_rooms=6))(), ToyEnv)  # a bare adapter gets a bare copy


# -- the planner with simulator: env --------------------------------------------------------------
def _engine(wrong_simulator: bool = False) -> ScriptedEngine:
    """A scripted decider that proposes the expert's action and two others (K=3 sees mistakes); its
    simulator (used only by simulator: model) gets the step after one real action wrong."""
    oracle = ToyOracle(TOY_TASKS[1], confidence=1.0)

    def simulate(req, text):
        if wrong_simulator and len(prompt_actions(text)) == 1:
            return "You are in a strange dark room."
        return oracle.simulate(req, text)

    return ScriptedEngine(oracle.decide, simulate, oracle.score)


def _run(engine: ScriptedEngine, simulator: str, env: Env | None = None):
    cfg = PlannerConfig(
        arm="simplan",
        k=3,
        horizon=3,
        adaptive=False,
        raise_errors=True,
        simulator=simulator,
        prompts=PromptConfig(max_history=50),
    )
    planner = Planner(engine, env or ToyEnv(), cfg)
    try:
        return planner.run(TOY_TASKS[1]).trace
    finally:
        planner.close()


def _fired(trace: EpisodeTrace, rule: str) -> list:
    return [e for e in trace.of_type("pivot") if e.fired and e.rule == rule]


def test_planner_with_the_env_oracle_commits_plans_reality_meets():
    engine = _engine(wrong_simulator=True)
    trace = _run(engine, "env")
    assert trace.of_type("end")[0].success
    assert not engine.requests("simulate")  # no model was asked to simulate
    imagines = trace.of_type("imagine")
    assert imagines and all(e.simulator == "env" for e in imagines)
    assert any(e.horizon > 0 and len(c.predicted) >= 2 for e in imagines for c in e.candidates)
    assert not _fired(trace, "expectation_mismatch")
    checked = [e for e in trace.of_type("act") if e.expectation is not None]
    assert len(checked) >= 3 and all(e.expectation == e.observation and e.match == 1.0 for e in checked)
    assert any(len(c.plan) > 1 for c in trace.of_type("commit"))  # multi-step plans were committed
    # The same engine as the simulator: its wrong prediction makes reality disagree and the plan pivot.
    model_engine = _engine(wrong_simulator=True)
    model_trace = _run(model_engine, "model")
    assert model_engine.requests("simulate") and _fired(model_trace, "expectation_mismatch")
    assert all(e.simulator == "model" for e in model_trace.of_type("imagine"))


def test_planner_oracle_skips_actions_a_transient_fault_did_not_run():
    env = FaultyEnv(ToyEnv(), FaultConfig(transient=0.3, seed=1))
    trace = _run(_engine(), "env", env=env)
    acts = trace.of_type("act")
    assert any(e.fault == "transient" for e in acts)
    # Every expectation of an action that ran unfaulted is exactly what happened.
    clean = [e for e in acts if e.expectation is not None and e.fault is None]
    assert clean and all(e.expectation == e.observation for e in clean)


def test_a_failing_oracle_drops_its_rollouts_and_the_episode_goes_on():
    def broken() -> Env:
        raise RuntimeError("no JVM here")

    cfg = PlannerConfig(
        arm="simplan", k=2, horizon=2, adaptive=False, simulator="env", prompts=PromptConfig(max_history=50)
    )
    planner = Planner(_engine(), ToyEnv(), cfg, oracle=EnvOracle(broken))
    trace = planner.run(TOY_TASKS[1]).trace
    planner.close()
    assert trace.of_type("end")[0].success  # acted on the decider's first actions alone
    failures = trace.of_type("parse_failure")
    assert failures and all(f.role == "simulator" and "could not make an env copy" in f.reason for f in failures)
    assert all(e.expectation is None for e in trace.of_type("act"))


def test_oracle_arm_preset_and_eval_accept_it():
    cfg = PlannerConfig(arm="simplan-oracle")
    assert (cfg.simulator, cfg.k, cfg.horizon, cfg.pivots) == ("env", 3, 3, True)
    assert PlannerConfig(arm="simplan").simulator == "model"
    assert PlannerConfig(arm="simplan-oracle", simulator="model").simulator == "model"
    with pytest.raises(ValueError, match="PlannerConfig.simulator"):
        PlannerConfig(simulator="dream")
    eval_cfg = EvalConfig(arms=["reactive", "simplan", "simplan-oracle", "plan"])
    assert "simplan-oracle" in eval_cfg.arms and "simplan-oracle" not in EvalConfig().arms


def test_oracle_planner_needs_no_simulator_adapter():
    oracle = ToyOracle(TOY_TASKS[1])
    engine = ScriptedEngine(oracle.decide, None, oracle.score, adapters=["decider"])
    trace = _run(engine, "env")
    assert trace.of_type("end")[0].success


# -- real environments ------------------------------------------------------------------------------
@pytest.mark.skipif(not _has("textworld_express"), reason="textworld_express is not installed")
@pytest.mark.parametrize("game", ["coin", "twc", "cookingworld", "sorting"])
def test_twx_predictions_are_the_real_steps(game, pairs):
    real, twin, oracle = pairs("twx")
    task = real.tasks("dev", families=[game], limit=2)[1]
    assert_oracle_matches_reality(real, twin, oracle, task)


@pytest.mark.skipif(not _has("bfcl_eval"), reason="bfcl_eval is not installed")
def test_bfcl_predictions_are_the_real_steps(pairs):
    real, twin, oracle = pairs("bfcl")
    task = real.tasks("dev", families=["multi_turn_base"], limit=1)[0]
    assert_oracle_matches_reality(real, twin, oracle, task, steps=3)


@pytest.mark.slow  # each ScienceWorld reset loads the task in the JVM (seconds), and the test makes a dozen
@pytest.mark.skipif(not _has("scienceworld"), reason="scienceworld is not installed")
def test_scienceworld_predictions_are_the_real_steps(pairs):
    real, twin, oracle = pairs("scienceworld")
    task = real.tasks("dev", families=["power-component"], limit=1)[0]
    assert_oracle_matches_reality(real, twin, oracle, task, steps=3)


# -- the env's verdict: an imagined step that ends the episode ---------------------------------------
OVER = "The episode is over; call reset() to start a new one."


class TrapToy(ToyEnv):
    """The toy with a trap in every room: "pull lever" reads like progress but ends the episode unwon (like a
    TWX cooking game lost by cooking the cheese the wrong way); any step after the end is "the episode is over"."""

    def reset(self, task: Task) -> Observation:
        self.over = False
        return super().reset(task)

    def valid_actions(self) -> list[str]:
        return sorted([*super().valid_actions(), "pull lever"])

    def step(self, action: Action) -> StepResult:
        if self.over:
            return StepResult(Observation(OVER), score=self._last_score, done=True)
        if action.kind == "command" and action.text == "pull lever":
            self.over = True
            text = "You pull the lever. Well done, your score goes up!"  # progress words, yet the game is lost
            return StepResult(self._observe(text, False), score=self._last_score, done=True)
        return super().step(action)


def test_the_oracle_returns_the_envs_verdict_of_a_losing_and_a_winning_step():
    task = TOY_TASKS[0]
    oracle = EnvOracle(TrapToy)
    lever = Action.command("pull lever")
    lost = Outcome.of(oracle.predict_step(task, [], [lever]))
    assert lost == Outcome(done=True, won=False, reward=0.0, score=0.0) and lost.lost
    assert lost.label() == "lost score=0 reward=+0"
    assert oracle.predict_step(task, [], [lever, Action.command("look")]).observation.text == OVER
    plan = _expert(task)
    won = Outcome.of(oracle.predict_step(task, plan[:-1], plan[-1:]))
    assert won.done and won.won and not won.lost and won.score == 1.0 and won.reward == 0.5
    assert won.label() == "won score=1 reward=+0.5"
    on = Outcome.of(oracle.predict_step(task, [], plan[:1]))
    assert not on.done and on.label().startswith("on ")
    assert oracle.predict(task, plan[:-1], plan[-1:]) == oracle.predict_step(task, plan[:-1], plan[-1:]).observation
    oracle.close()


def _expert(task: Task) -> list[Action]:
    env = ToyEnv()
    env.reset(task)
    return env.expert_plan()


PROGRESS = "You take the key."  # the default progress patterns match it
PLAIN = "You are in room 2 of 4."


def test_the_judge_ranks_a_lost_rollout_below_no_progress_and_a_won_one_above_all():
    judge, memory = Judge(JudgeWeights()), JudgeMemory()
    on = Outcome()
    lost_parts, lost = judge.score(["pull lever"], [PROGRESS], memory, 1.0, outcomes=[Outcome(done=True)])
    _, idle = judge.score(["look"], [PLAIN], memory, 0.0, outcomes=[on])
    _, progress = judge.score(["take key", "go east"], [PROGRESS, PROGRESS], memory, 1.0, outcomes=[on, on])
    won_parts, won = judge.score(["open door"], [PLAIN], memory, 0.0, outcomes=[Outcome(done=True, won=True)])
    assert lost < idle < progress < won
    assert lost_parts["lost"] == -10.0 and lost_parts["progress"] == 1.0 and lost_parts["won"] == 0.0
    assert won_parts["won"] == 10.0 and won_parts["lost"] == 0.0
    # Nothing after the ended episode counts: the "episode is over" follow-up adds no step, repeat or progress.
    follow_parts, follow = judge.score(
        ["pull lever", "take key"], [PROGRESS, PROGRESS], memory, 1.0, outcomes=[Outcome(done=True), Outcome(True)]
    )
    assert (follow_parts, follow) == (lost_parts, lost)
    # A follow-up that loses is cut, not held against the first action (as a failing follow-up is); a win one
    # step deep is discounted; a positive reward counts as progress where the text names none.
    deep, _ = judge.score(["look", "pull lever"], [PLAIN, PLAIN], memory, outcomes=[on, Outcome(done=True)])
    assert deep["lost"] == 0.0 and deep["progress"] == 0.0 and deep["length"] == -0.05
    late_win, _ = judge.score(["look", "open door"], [PLAIN, PLAIN], memory, outcomes=[on, Outcome(True, True)])
    assert late_win["won"] == 9.0 and late_win["length"] == -0.1
    rewarded, _ = judge.score(["go east"], [PLAIN], memory, outcomes=[Outcome(reward=0.5, score=0.5)])
    assert rewarded["progress"] == 1.0


def test_texts_only_rollouts_score_exactly_as_before():
    judge, memory = Judge(JudgeWeights()), JudgeMemory()
    args = (["take key", "look"], [PROGRESS, PLAIN], memory, 0.5)
    before = judge.score(*args)
    parts, total = before
    # Hand-computed: progress 1 at depth 0, length 2 x -0.05, likelihood 0.5 x 0.5.
    assert parts == {
        "error": 0.0,
        "progress": 1.0,
        "repeat": 0.0,
        "failed": 0.0,
        "premature": 0.0,
        "length": -0.1,
        "likelihood": 0.25,
    }
    assert total == 1.15
    assert judge.score(*args, outcomes=[]) == before  # a learned simulator's rollout: no verdicts
    assert judge.score(*args, outcomes=[None, None]) == before


class TrapOracle(ToyOracle):
    """A scripted decider that likes the trap best (scores) but plans like the expert inside rollouts, and a
    texts-only simulator that predicts TrapToy's texts exactly (it cannot tell a losing step from a good one)."""

    env_class = TrapToy

    def score(self, req, text: str) -> list[float]:
        best = toy_expert_action(self._replay(prompt_actions(text))[0])
        return [0.0 if c == "pull lever" else (-1.0 if c == best else -5.0) for c in req.candidates]


def test_the_oracle_planner_avoids_a_losing_first_action_a_texts_only_judge_takes():
    task = TOY_TASKS[1]
    traces = {}
    for simulator in ("model", "env"):
        oracle = TrapOracle(task)
        engine = ScriptedEngine(oracle.decide, oracle.simulate, oracle.score)
        cfg = PlannerConfig(
            arm="simplan",
            k=3,
            horizon=2,
            adaptive=False,
            raise_errors=True,
            simulator=simulator,
            prompts=PromptConfig(max_history=50),
        )
        planner = Planner(engine, TrapToy(), cfg)
        try:
            traces[simulator] = planner.run(task).trace
        finally:
            planner.close()
    model, env = traces["model"], traces["env"]
    # The texts read like progress: the texts-only judge pulls the lever at once and loses.
    assert [e.action for e in model.of_type("act")] == ["pull lever"]
    assert not model.of_type("end")[0].success
    assert all(c.outcomes is None and "lost" not in c.parts for e in model.of_type("imagine") for c in e.candidates)
    # The env's verdict: the lever loses, so it is never taken and the episode is won.
    assert env.of_type("end")[0].success
    assert "pull lever" not in [e.action for e in env.of_type("act")]
    levers = [c for e in env.of_type("imagine") for c in e.candidates if c.actions[0] == "pull lever"]
    assert levers and all(not c.chosen and c.parts["lost"] == -10.0 for c in levers)
    assert all(len(c.outcomes) == 1 and c.outcomes[0].startswith("lost score=") for c in levers)
    assert all(len(c.actions) == 1 for c in levers)  # the rollout stopped at the end of the episode
    # The trace round-trips the verdicts; an older trace without them loads with None.
    records = env.to_dicts()
    outcomes = [c.outcomes for e in env.of_type("imagine") for c in e.candidates]
    assert [c.outcomes for e in EpisodeTrace.from_dicts(records).of_type("imagine") for c in e.candidates] == outcomes
    for r in records:
        for c in r.get("candidates", []):
            del c["outcomes"]
    old = EpisodeTrace.from_dicts(records)
    assert all(c.outcomes is None for e in old.of_type("imagine") for c in e.candidates)


def test_a_plan_is_committed_up_to_a_step_the_env_says_loses():
    oracle = TrapOracle(TOY_TASKS[1])
    planner = Planner(ScriptedEngine(oracle.decide, oracle.simulate, oracle.score), TrapToy(), PlannerConfig())
    east, lever = Action.command("go east"), Action.command("pull lever")
    plan = Rollout([east, lever], [PLAIN, PROGRESS], outcomes=[Outcome(), Outcome(done=True)])
    assert [q.action for q in planner.imagination.commit(plan, 5.0, "plan")] == [east]
    plan.outcomes = []  # a texts-only rollout: both queued, as before
    assert [q.action for q in planner.imagination.commit(plan, 5.0, "plan")] == [east, lever]
    planner.close()


LEVERS = ("pull lever a", "pull lever b", "pull lever c")


class LeverToy(TrapToy):
    """TrapToy with three losing levers, which the decider below ranks above every good action."""

    def valid_actions(self) -> list[str]:
        return sorted([*ToyEnv.valid_actions(self), *LEVERS])

    def step(self, action: Action) -> StepResult:
        if action.kind == "command" and action.text in LEVERS:
            action = Action.command("pull lever")
        return super().step(action)


class LeverOracle(TrapOracle):
    env_class = LeverToy

    def score(self, req, text: str) -> list[float]:
        best = toy_expert_action(self._replay(prompt_actions(text))[0])
        return [0.0 if c in LEVERS else (-1.0 if c == best else -5.0) for c in req.candidates]


@pytest.mark.parametrize("widen_lost", [0, 2])
def test_when_every_candidate_loses_the_planner_imagines_the_next_ranked_actions(widen_lost):
    task = TOY_TASKS[1]
    oracle = LeverOracle(task)
    engine = ScriptedEngine(oracle.decide, oracle.simulate, oracle.score)
    cfg = PlannerConfig(
        arm="simplan",
        k=3,
        horizon=1,
        adaptive=False,
        raise_errors=True,
        simulator="env",
        imagination=ImaginationConfig(widen_lost=widen_lost),
    )
    planner = Planner(engine, LeverToy(), cfg)
    try:
        trace = planner.run(task).trace
    finally:
        planner.close()
    first = trace.of_type("imagine")[0]
    acts = [e.action for e in trace.of_type("act")]
    if widen_lost == 0:  # the three levers are all it imagines: it pulls the best-liked one and loses
        assert [c.actions[0] for c in first.candidates] == list(LEVERS)
        assert acts == ["pull lever a"] and not trace.of_type("end")[0].success
        return
    # One more round of K: the expert's action (ranked 4th) is imagined, not lost, and taken; the episode is won.
    assert [c.actions[0] for c in first.candidates][:3] == list(LEVERS) and len(first.candidates) == 6
    assert "every candidate predicted lost: imagined 3 more" in first.reason
    assert not any(a in LEVERS for a in acts) and trace.of_type("end")[0].success
    assert sum("imagined 3 more" in e.reason for e in trace.of_type("imagine")) == len(trace.of_type("imagine"))
