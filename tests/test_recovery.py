"""Tool-calling agents that recover (issue 20): failure classes and transient retries, finish by acceptance,
experts that react, faults in the env's language, and prompts that show each observation once.

The planner runs with scripted engines (no model); the shop is the example plugin examples/simplan-shop, put on
sys.path as `simplan_shop.env:ShopEnv`.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from simplan.core.io import iter_jsonl
from simplan.data.collect import CollectConfig, collect
from simplan.data.episode import ConversationRenderer, EpisodeState, PromptSettings
from simplan.envs.base import Action, StepResult, env_extra, expert_policy
from simplan.envs.check import check_env
from simplan.envs.failures import FailureRules, compile_patterns
from simplan.envs.registry import make_env
from simplan.envs.toy import ToyEnv
from simplan.evaluation.faults import TRANSIENT_TEXT, FaultConfig, FaultyEnv
from simplan.inference.engines.scripted import ScriptedEngine, last_user_content, prompt_actions, toy_expert_action
from simplan.inference.planning.judge import Judge, JudgeMemory, JudgeWeights
from simplan.inference.planning.pivots import StepRecord, TransientError
from simplan.inference.planning.planner import Planner, PlannerConfig
from simplan.inference.planning.router import BudgetConfig

SPEC = "simplan_shop.env:ShopEnv"
BUSY = "Service busy (503): try again."


# ---------------------------------------------------------------------------------------------
# Failure classes: transient failures are retried, then permanent
# ---------------------------------------------------------------------------------------------
class FlakyToy(ToyEnv):
    """The toy env whose first `fails` tries of "go east" from room 1 answer a transient 503 (nothing moves)."""

    transient_patterns = (r"\b503\b",)

    def __init__(self, fails: int) -> None:
        super().__init__()
        self.fails = fails

    def reset(self, task):
        self.left = self.fails
        return super().reset(task)

    def step(self, action: Action) -> StepResult:
        if self.left and action.text == "go east" and self.pos == 0:
            self.left -= 1
            return StepResult(self._observe(BUSY, error=True), score=self._score())
        return super().step(action)


TASK = ToyEnv().tasks("dev")[3]  # corridor-103: the key in room 2, so the expert starts with "go east"


def flaky_engine(fails: int, make=FlakyToy) -> ScriptedEngine:
    """A decider that scores the expert's action of the real state (the prompt's actions replayed) first."""

    def state(user: str) -> ToyEnv:
        env = make(fails)
        env.reset(TASK)
        for a in prompt_actions(user):
            env.step(Action.command(a))
        return env

    def score(req, user):
        best = toy_expert_action(state(user))
        return [0.0 if c == best else -5.0 for c in req.candidates]

    return ScriptedEngine(decide=lambda req, user: toy_expert_action(state(user)), score=score)


def flaky_run(fails: int, make=FlakyToy, **kw):
    base = {"arm": "simplan", "k": 1, "horizon": 0, "adaptive": False, "max_history": 50, "raise_errors": True}
    cfg = PlannerConfig.from_dict({**base, **kw})
    engine = flaky_engine(fails, make)
    return Planner(engine, make(fails), cfg).run(TASK), engine


class SoldOutToy(FlakyToy):
    """The first "take key" finds the key gone (a failure that changes the plan); the next one works."""

    replan_patterns = (r"\bsold out\b",)

    def step(self, action: Action) -> StepResult:
        if self.left and action.text == "take key" and self.pos == self.key_room:
            self.left -= 1
            return StepResult(self._observe("The key is sold out.", error=True), score=self._score())
        return ToyEnv.step(self, action)


def test_a_failure_that_changes_the_plan_is_noted_and_replanned_but_not_banned():
    result, _ = flaky_run(fails=1, make=SoldOutToy)
    (replan,) = result.trace.of_type("replan")
    assert "error_observation" in replan.reason and replan.failure_note == "take key -> The key is sold out."
    assert replan.banned == []  # so "take key" stays on offer in that state, and works the second time
    assert [a.action for a in result.trace.of_type("act")].count("take key") == 2 and result.summary.success


def test_transient_failure_is_retried_without_model_call_note_or_ban():
    result, engine = flaky_run(fails=2, max_transient_retries=2)
    trace = result.trace
    acts = trace.of_type("act")
    assert [a.action for a in acts[:3]] == ["go east"] * 3
    assert [a.observation for a in acts[:2]] == [BUSY, BUSY] and not acts[2].error
    assert acts[0].model_calls == 1 and acts[1].model_calls == acts[2].model_calls == 0  # retried as it was
    retries = [p for p in trace.of_type("pivot") if p.rule == "transient_error"]
    assert [(p.fired, p.evidence["attempt"]) for p in retries] == [(True, 1), (True, 2)]
    assert not [p for p in trace.of_type("pivot") if p.rule == "error_observation"]
    assert not trace.of_type("replan")  # no replan, so no ban and no failure note
    prompts = [last_user_content(r.messages) for _, reqs in engine.calls for r in reqs]
    assert prompts and not any("Failed before" in p for p in prompts)
    assert result.summary.success


def test_transient_failure_past_the_retry_limit_is_permanent():
    result, _ = flaky_run(fails=3, max_transient_retries=2, max_steps=4)
    trace = result.trace
    acts = trace.of_type("act")
    assert [a.observation for a in acts[:3]] == [BUSY] * 3
    assert [p.evidence["attempt"] for p in trace.of_type("pivot") if p.rule == "transient_error"] == [1, 2]
    (replan, *_) = trace.of_type("replan")
    assert "error_observation" in replan.reason and replan.banned == ["go east"]
    assert replan.failure_note == f"go east -> {BUSY}"


def test_no_retries_makes_the_first_transient_failure_permanent():
    result, _ = flaky_run(fails=1, max_transient_retries=0, max_steps=2)
    assert not [p for p in result.trace.of_type("pivot") if p.rule == "transient_error"]
    assert result.trace.of_type("replan")[0].banned == ["go east"]


def test_transient_rule_counts_attempts_of_the_same_action_in_a_row():
    import re

    rule = TransientError(FailureRules(transient=(re.compile(r"\b503\b"),)), max_retries=2)

    def rec(key: str, obs: str, error: bool = True) -> StepRecord:
        return StepRecord(key, obs, 0.0, error)

    history = [rec("a", "503"), rec("b", "503"), rec("b", "503")]
    assert rule.attempts(history) == 2
    assert rule.attempts([*history, rec("b", "ok", error=False)]) == 0
    assert rule.attempts([rec("b", "You can't do that."), rec("b", "503")]) == 1  # a permanent failure breaks the run
    with pytest.raises(ValueError, match="max_retries"):
        TransientError(max_retries=-1)


def test_judge_failure_classes_and_no_penalty_for_retrying_a_transient_failure():
    judge = Judge(JudgeWeights(), FailureRules.for_env(None, transient=[r"\b503\b"], replan=[r"sold out"]))
    assert judge.failure_class('{"error": "503 service unavailable"}') == "transient"
    assert judge.failure_class('{"error": "kettle-steel sold out"}') == "replan"
    assert judge.failure_class("You can't do that.") == "permanent"
    assert judge.failure_class("You take the key.") is None
    assert judge.failure_class("gone", flagged=True) == "permanent"
    memory = JudgeMemory(failed_actions={"a", "b"}, failure_classes={"a": "transient", "b": "permanent"})
    assert judge.score(["a"], ["ok"], memory)[0]["failed"] == 0.0
    assert judge.score(["b"], ["ok"], memory)[0]["failed"] == -1.0


# ---------------------------------------------------------------------------------------------
# Finish by acceptance
# ---------------------------------------------------------------------------------------------
def test_premature_finish_loses_to_a_useful_action_in_the_judge():
    judge = Judge(
        JudgeWeights(), FailureRules(tuple(compile_patterns([r'"error"']))), accept_patterns=[r'"shipped": true']
    )
    memory = JudgeMemory()
    finish, finish_total = judge.score(["finish"], ['{"finished": true, "shipped": false}'], memory, probability=0.9)
    search, search_total = judge.score(['search({"query": "kettle"})'], ['{"items": ["kettle-steel"]}'], memory, 0.1)
    assert finish["premature"] == -2.0 and search["premature"] == 0.0
    assert search_total > finish_total
    # The env's verdict on the real state decides a finish from it, whatever was predicted (or not).
    assert judge.score(["finish"], [], memory, 0.9, finish_verdict=False)[0]["premature"] == -2.0
    assert judge.score(["finish"], ['{"shipped": false}'], memory, 0.9, finish_verdict=True)[0]["premature"] == 0.0
    # A finish after the goal is met is not premature; without a verdict a finish is not judged.
    assert judge.score(["finish"], ['{"finished": true, "shipped": true}'], memory)[0]["premature"] == 0.0
    assert Judge(JudgeWeights()).score(["finish"], ["Done."], memory)[0]["premature"] == 0.0


def test_planner_prefers_a_useful_call_to_a_premature_finish(shop_on_path):
    """The decider favours finish() 2:1, the env says the goal is not met: the planner searches instead."""
    env = make_env(SPEC)
    task = env.tasks("train")[0]

    def simulate(req, user):
        return '{"finished": true, "shipped": false}' if "finish()" in user else '{"items": ["x-1"]}'

    engine = ScriptedEngine(
        decide=lambda req, user: ["finish()", "finish()", "search(query='kettle')"][: req.n], simulate=simulate
    )
    cfg = PlannerConfig(
        arm="simplan", k=3, horizon=1, adaptive=False, raise_errors=True, budgets=BudgetConfig(max_steps=1)
    )
    trace = Planner(engine, env, cfg).run(task).trace
    (imagine,) = trace.of_type("imagine")
    by_first = {c.actions[0]: c for c in imagine.candidates}
    assert by_first["finish()"].parts["premature"] == -2.0 and by_first["search(query='kettle')"].chosen
    assert trace.of_type("act")[0].action == "search(query='kettle')"


def test_a_finish_the_model_insists_on_is_not_a_success(shop_on_path):
    env = make_env(SPEC)
    engine = ScriptedEngine(decide=lambda req, user: "finish()")
    cfg = PlannerConfig(arm="reactive", raise_errors=True, budgets=BudgetConfig(max_steps=3))
    summary = Planner(engine, env, cfg).run(env.tasks("train")[0]).summary
    assert summary.status == "failed" and not summary.success  # the env's verdict, not the model's word


# ---------------------------------------------------------------------------------------------
# Experts that react
# ---------------------------------------------------------------------------------------------
def _shop_task(env, **want):
    from simplan_shop.env import scenario

    return next(t for t in env.tasks("train") if all(scenario(t.params["seed"])[k] == v for k, v in want.items()))


def test_shop_expert_retries_after_a_503_and_orders_another_variant_after_a_sell_out(shop_on_path):
    from simplan_shop.env import ShopEnv

    env = ShopEnv()
    task = _shop_task(env, flaky="order", sellout=True)
    obs = env.reset(task)
    calls, last = [], None
    while (action := env.expert_action(obs)) is not None:
        last = env.step(action)
        calls.append((action.key(), last.observation.text))
        obs = last.observation
    keys = [k for k, _ in calls]
    first_order = next(i for i, k in enumerate(keys) if k.startswith("order("))
    assert "503" in calls[first_order][1] and keys[first_order + 1] == keys[first_order]  # the same call again
    assert "sold out" in calls[first_order + 1][1]
    assert keys[first_order + 2].startswith("check_stock(") and keys[first_order + 2] != keys[1]  # the next variant
    assert last is not None and last.won and env.accepts()


def policy_only_shop():
    """The shop with its reacting expert only: an empty fixed plan, so collection must use the policy."""
    from simplan_shop.env import ShopEnv

    class PolicyOnlyShop(ShopEnv):
        def expert_plan(self) -> list[Action]:
            return []

    return PolicyOnlyShop()


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for _, line in iter_jsonl(path)]


def test_policy_expert_drives_collect_noisy_runs_and_branches(shop_on_path, tmp_path, monkeypatch):
    from simplan.envs import registry

    monkeypatch.setitem(registry._REGISTERED, "shop-policy", policy_only_shop)
    out = tmp_path / "shop.jsonl"
    cfg = CollectConfig(
        env="shop-policy",
        policies=["expert", "noisy_expert"],
        limit=4,
        branches=1,
        noise_rate=0.5,
        attempts=2,
        out=str(out),
        progress=False,
    )
    report = collect(cfg)
    records = _records(out)
    assert not report.statuses.get("errored") and not report.problems
    main = [r for r in records if r["meta"].get("kind") == "episode"]
    assert main and all(r["meta"]["expert"] == "policy" and r["status"] == "ok" for r in main)
    expert = [r for r in main if r["policy"] == "expert"]
    noisy = [r for r in main if r["policy"] == "noisy_expert"]
    assert len(expert) == 12 and all(r["success"] for r in expert)
    assert any("503" in s["next_observation"] for r in expert for s in r["steps"])  # the retries are in the data
    assert noisy and all(r["success"] for r in noisy)  # the policy recovers from every kept mistake
    assert all(any(s["source"] == "noise" for s in r["steps"]) for r in noisy)
    branches = [r for r in records if r["meta"].get("kind") == "branch" and r["id"].endswith("/branch0")]
    assert len(branches) == 12 and all(r["steps"][-1]["source"] == "random" for r in branches)
    assert all(s["source"] == "expert" for r in branches for s in r["steps"][:-1])


class ToyWalker(ToyEnv):
    """The toy env with a reacting expert only: after a step west it walks back east from wherever it is."""

    def expert_action(self, observation):
        return None if self.door_open else Action.command(toy_expert_action(self))

    def expert_plan(self) -> list[Action]:
        return []


def test_a_policy_expert_answers_a_mistake_that_changed_the_state(tmp_path, monkeypatch):
    from simplan.envs import registry

    monkeypatch.setitem(registry._REGISTERED, "toy-walker", ToyWalker)
    out = tmp_path / "toy.jsonl"
    cfg = CollectConfig(env="toy-walker", policies=["noisy_expert"], limit=10, noise_rate=0.5, out=str(out))
    collect(dataclasses.replace(cfg, progress=False))
    noisy = [r for r in _records(out) if r["meta"]["kind"] == "episode"]
    assert len(noisy) == 10 and all(r["success"] and r["meta"]["expert"] == "policy" for r in noisy)
    changed = [r for r in noisy if r["meta"]["mistakes"].get("kept_changed")]
    assert changed  # a step west kept in the record, not split off, and answered by the expert
    for r in changed:
        steps = r["steps"]
        west = next(i for i, s in enumerate(steps) if s["source"] == "noise" and s["action"]["text"] == "go west")
        assert steps[west + 1]["source"] == "recovery" and steps[west + 1]["action"]["text"] == "go east"


def test_envs_check_checks_both_experts_and_fails_a_policy_that_gives_up(shop_on_path):
    from simplan_shop.env import ShopEnv

    report = check_env(make_env(SPEC), fold_sample=2, progress=False)
    assert report.ok, report.table()
    assert "expert: plan and policy" in next(r.message for r in report.results if r.name.startswith("expert"))
    only = check_env(policy_only_shop(), fold_sample=1, progress=False)
    assert only.ok, only.table()
    assert "expert: policy" in next(r.message for r in only.results if r.name.startswith("expert"))

    class GivesUp(ShopEnv):
        def expert_action(self, observation):
            return None if self._done else Action(kind="finish")

    bad = check_env(GivesUp(), fold_sample=1, progress=False)
    (failed,) = [r for r in bad.failed if r.name.startswith("expert")]
    assert "policy" in failed.message


def test_fixed_plan_envs_keep_their_plan():
    env = make_env("toy")
    assert expert_policy(env) is None and env_extra(env, "accepts") is None
    report = check_env(env, fold_sample=1, progress=False)
    assert report.ok and "expert: plan" in next(r.message for r in report.results if r.name.startswith("expert"))


# ---------------------------------------------------------------------------------------------
# Faults in the env's language; each observation shown once
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["transient", "tool_error"])
def test_injected_faults_in_a_tool_env_are_json_errors_and_read_as_transient(shop_on_path, kind):
    env = FaultyEnv(make_env(SPEC), FaultConfig(**{kind: 1.0}))
    env.reset(env.tasks("train")[0])
    result = env.step(Action.tool_call("search", {"query": "kettle"}))
    assert result.info["fault"] == kind and result.observation.error
    error = json.loads(result.observation.text)["error"]
    assert isinstance(error, str) and error
    judge = Judge(JudgeWeights(), FailureRules.for_env(env))
    assert judge.failure_class(result.observation.text, flagged=True) == "transient"


def test_perturbed_json_stays_json_and_text_envs_keep_prose(shop_on_path):
    env = FaultyEnv(make_env(SPEC), FaultConfig(perturb=1.0))
    env.reset(env.tasks("train")[0])
    for _ in range(3):
        assert isinstance(json.loads(env.step(Action.tool_call("search", {"query": "kettle"})).observation.text), dict)
    toy = FaultyEnv(ToyEnv(), FaultConfig(transient=1.0))
    toy.reset(TASK)
    text = toy.step(Action.command("go east")).observation.text
    assert text == TRANSIENT_TEXT
    assert Judge(JudgeWeights(), FailureRules.for_env(toy)).failure_class(text, True) == "transient"


def test_no_prompt_shows_the_same_observation_twice():
    """The conversation format (the default) shows each observation once. The per-step format
    (`build --format step`) keeps its layout byte for byte, so adapters trained on it still match."""
    env = ToyEnv()
    obs = env.reset(TASK)
    state = EpisodeState.start(obs.goal, obs.text, valid_actions=obs.valid_actions)
    for text in ("go east", "xyzzy", "take key"):
        r = env.step(Action.command(text))
        state.step(text, r.observation.text, r.observation.error, r.observation.valid_actions)
        renderer = ConversationRenderer(PromptSettings(budget=4096))
        for messages in (renderer.decider_messages(state), renderer.simulator_messages(state, "look")):
            shown = [m["content"] for m in messages]
            assert sum(r.observation.text in c for c in shown) == 1, shown
