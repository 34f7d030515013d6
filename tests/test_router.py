"""Trusting the simulator where it is right: per-prediction confidence, per-verb accuracy, the selective router.

    .venv/bin/pytest -q tests/test_router.py

The router runs a scripted toy oracle (inference/engines/scripted.py) whose simulator calls are counted; the
confidence test on the hf backend uses a tiny random model (models/tiny.py).
"""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from simplan.data.format import CONVERSATION_SIMULATOR_SYSTEM, PromptState, simulator_messages
from simplan.envs.toy import ToyEnv
from simplan.evaluation.metrics import episode_record, group_metrics
from simplan.evaluation.offline import EvalModelConfig, simulator_verb_accuracy, write_verb_accuracy
from simplan.inference.engines.base import Completion, GenerationRequest, GenerationResult
from simplan.inference.engines.scripted import ScriptedEngine, ToyOracle
from simplan.inference.planning.config import PromptConfig
from simplan.inference.planning.judge import Judge, JudgeMemory, JudgeWeights, trust
from simplan.inference.planning.planner import Planner, PlannerConfig
from simplan.inference.planning.router import Budgets, Router, RouterConfig
from simplan.inference.planning.sim_accuracy import (
    ACCURACY_FILE,
    SimulatorAccuracy,
    accuracy_from_traces,
    action_verb,
    simulator_prompt_action,
)
from simplan.inference.planning.trace import ActEvent, EpisodeTrace, summarize

ENV = ToyEnv()
TASK = ENV.tasks("dev")[3]  # corridor-103: the expert goes east, takes the key, goes east, opens the door
TOY_VERBS = ("go", "take", "open")


def table_file(tmp_path, accuracy: dict[str, float], n: int = 20):
    """A simulator_accuracy.json with `n` rows per verb and the given accuracies."""
    path = tmp_path / ACCURACY_FILE
    path.write_text(json.dumps({v: {"n": n, "exact": round(a * n)} for v, a in accuracy.items()}))
    return path


def run_toy(tmp_path, accuracy: dict[str, float], confidence: float = 5.0, **kw):
    """One toy episode with the scripted oracle (`confidence`: the decider's logprob gap, 5 = confident)."""
    oracle = ToyOracle(TASK, confidence=confidence)
    engine = ScriptedEngine(oracle.decide, oracle.simulate, oracle.score)
    kw.setdefault("simulator_accuracy", str(table_file(tmp_path, accuracy)))
    base = {"arm": "simplan", "k": 2, "horizon": 2, "router": "selective", "max_history": 50, "raise_errors": True}
    cfg = PlannerConfig.from_dict({**base, **kw})  # flat keys, as configs written before the sections
    result = Planner(engine, ToyEnv(), cfg).run(TASK)
    return engine, result


# -- the selective router --------------------------------------------------------------------------
def test_router_acts_reactively_where_the_simulator_is_unreliable_and_the_decider_sure(tmp_path):
    engine, result = run_toy(tmp_path, {v: 0.1 for v in TOY_VERBS})
    assert engine.requests("simulate") == []  # not one simulator call
    imagines = result.trace.of_type("imagine")
    assert imagines and all(e.route == "react" and e.horizon == 0 and e.skipped_simulation for e in imagines)
    assert {e.route_verb for e in imagines} <= set(TOY_VERBS) and all(e.route_accuracy == 0.1 for e in imagines)
    assert all("unreliable" in e.reason and "acting reactively" in e.reason for e in imagines)
    s = result.summary
    assert s.success and s.routed_reactive == s.reactive_decisions == len(imagines) and s.simulated_decisions == 0
    assert s.reactive_tokens == sum(e.prompt_tokens + e.completion_tokens for e in imagines) > 0
    group = group_metrics("simplan", "", [episode_record(result.trace)] * 2)  # a report's per-arm sums
    assert (group.routed_reactive, group.reactive_tokens, group.simulated_decisions) == (
        2 * s.routed_reactive,
        2 * s.reactive_tokens,
        0,
    )


def test_router_simulates_where_the_simulator_is_reliable(tmp_path):
    engine, result = run_toy(tmp_path, {v: 0.9 for v in TOY_VERBS})
    assert engine.requests("simulate")
    imagines = result.trace.of_type("imagine")
    assert all(e.route == "simulate" and e.horizon > 0 for e in imagines)
    s = result.summary
    assert s.success and s.simulated_decisions == len(imagines) and s.routed_reactive == 0 and s.simulated_tokens > 0


def test_router_mixes_routes_by_verb(tmp_path):
    engine, result = run_toy(tmp_path, {"go": 0.1, "take": 0.9, "open": 0.9})
    routes = {e.route_verb: e.route for e in result.trace.of_type("imagine")}
    assert routes["go"] == "react" and routes["take"] == "simulate"
    assert engine.requests("simulate") and result.summary.success


def test_router_simulates_an_unsure_decision_even_with_an_unreliable_simulator(tmp_path):
    # confidence 0: every valid action equally likely, margin 0 < confident_margin
    engine, result = run_toy(tmp_path, {v: 0.1 for v in TOY_VERBS}, confidence=0.0, max_steps=3)
    first = result.trace.of_type("imagine")[0]
    assert first.margin == 0.0 and first.route == "simulate" and engine.requests("simulate")


def test_router_rule_both_needs_a_reliable_simulator_and_an_unsure_decider(tmp_path):
    engine, result = run_toy(tmp_path, {v: 0.9 for v in TOY_VERBS}, router_rule="both")
    assert engine.requests("simulate") == []  # reliable, but the decider is sure
    assert all(e.route == "react" for e in result.trace.of_type("imagine"))


def test_router_always_keeps_todays_behaviour(tmp_path):
    oracle = ToyOracle(TASK)
    engine = ScriptedEngine(oracle.decide, oracle.simulate, oracle.score)
    cfg = PlannerConfig(
        arm="simplan", k=2, horizon=2, adaptive=False, raise_errors=True, prompts=PromptConfig(max_history=50)
    )
    result = Planner(engine, ToyEnv(), cfg).run(TASK)
    assert engine.requests("simulate") and all(e.route == "" for e in result.trace.of_type("imagine"))


def test_router_reads_the_table_from_the_simulator_adapter_folder(tmp_path):
    table_file(tmp_path, {v: 0.1 for v in TOY_VERBS})
    oracle = ToyOracle(TASK)
    engine = ScriptedEngine(oracle.decide, oracle.simulate, oracle.score)
    engine.adapter_dirs = {"simulator": str(tmp_path)}
    cfg = PlannerConfig(
        arm="simplan",
        k=2,
        horizon=2,
        raise_errors=True,
        router=RouterConfig(mode="selective"),
        prompts=PromptConfig(max_history=50),
    )
    Planner(engine, ToyEnv(), cfg).run(TASK)
    assert engine.requests("simulate") == []


def test_router_without_a_table_fails_naming_the_field_and_the_command(tmp_path):
    oracle = ToyOracle(TASK)
    engine = ScriptedEngine(oracle.decide, oracle.simulate, oracle.score)
    cfg = PlannerConfig(arm="simplan", router=RouterConfig(mode="selective"), prompts=PromptConfig(max_history=50))
    with pytest.raises(ValueError, match="simulator_accuracy.*--write_adapter_accuracy"):
        Planner(engine, ToyEnv(), cfg)
    cfg = PlannerConfig(
        arm="simplan", router=RouterConfig(mode="selective", simulator_accuracy=str(tmp_path / "none.json"))
    )
    with pytest.raises(ValueError, match="none.json does not exist"):
        Planner(engine, ToyEnv(), cfg)
    Planner(
        engine, ToyEnv(), PlannerConfig(arm="reactive", router=RouterConfig(mode="selective"))
    )  # never simulates: no table needed


def test_router_arm_presets():
    always, router = PlannerConfig(arm="simplan-always"), PlannerConfig(arm="simplan-router")
    assert (always.router.mode, always.adaptive, always.horizon) == ("always", False, 3)
    assert (router.router.mode, router.adaptive, router.horizon, router.pivots) == ("selective", False, 3, True)
    assert (
        PlannerConfig(arm="simplan-router", router=RouterConfig(rule="both")).router.rule == "both"
    )  # presets keep flags


def test_router_unit_rules_and_config_checks():
    table = SimulatorAccuracy.from_dict(
        {"go": {"n": 20, "exact": 18}, "put": {"n": 20, "exact": 4}, "x": {"n": 2, "exact": 0}}
    )
    budgets = Budgets(max_steps=50, max_replans=3, token_budget=0, horizon=3, k=3)
    router = Router(PlannerConfig(arm="simplan", router=RouterConfig(mode="selective", accuracy=0.5)), table)
    assert router.route(budgets, 0.9, 50, "", "go").horizon == 3  # reliable
    assert router.route(budgets, 0.9, 2, "", "go").horizon == 2  # capped by the steps left
    react = router.route(budgets, 0.9, 50, "", "put")
    assert (react.horizon, react.route, react.accuracy) == (0, "react", 0.2)
    assert router.route(budgets, 0.1, 50, "", "put").route == "simulate"  # unsure decider
    assert router.route(budgets, None, 50, "", "put").route == "simulate"  # unknown margin counts as unsure
    # "x" has 2 rows (< router_min_rows 10): the overall accuracy 22/42 = 0.52 >= 0.5 decides
    assert router.route(budgets, 0.9, 50, "", "x").accuracy == pytest.approx(22 / 42)
    assert router.route(budgets, 0.9, 50, "budget spent", "go").horizon == 0  # degraded wins
    bad_values = [
        ("router.mode", "sometimes"),
        ("router.rule", "any"),
        ("router.accuracy", 1.5),
        ("judge.confidence", -0.1),
    ]
    for key, value in bad_values:
        with pytest.raises(ValueError, match=key.replace(".", r"\.")):
            PlannerConfig.from_dict({"arm": "simplan", key: value})


# -- per-verb accuracy -----------------------------------------------------------------------------
def test_action_verb():
    assert action_verb("Go East") == "go" and action_verb("  take key from table") == "take"
    assert action_verb("get_weather(city='Paris')") == "get_weather" and action_verb("finish()") == "finish"
    assert action_verb("") == ""


def test_per_verb_accuracy_from_hand_made_predictions():
    pairs = [("go east", True), ("go west", True), ("go north", False), ("put apple in fridge", False)]
    pairs += [("put egg in pot", True), ("get_weather(city='Paris')", True), ("get_weather(city='Rome')", False)]
    table = SimulatorAccuracy.from_pairs(pairs)
    assert table.to_dict() == {
        "get_weather": {"n": 2, "exact": 1, "accuracy": 0.5},
        "go": {"n": 3, "exact": 2, "accuracy": 0.666667},
        "put": {"n": 2, "exact": 1, "accuracy": 0.5},
    }
    assert (table.overall.n, table.overall.exact) == (7, 4)
    assert table.accuracy("go", min_rows=3) == (pytest.approx(2 / 3), "go: 2/3 exact")
    assert table.accuracy("go", min_rows=4)[0] == pytest.approx(4 / 7)  # too few rows: overall


def test_offline_per_verb_accuracy_reads_the_action_from_both_prompt_layouts(tmp_path):
    step = simulator_messages(PromptState(goal="escape", observation="A hall.\n\nAction: odd text"), "go east")
    conversation = [
        {"role": "system", "content": CONVERSATION_SIMULATOR_SYSTEM + "\n\nGoal: escape"},
        {"role": "user", "content": "look"},
        {"role": "assistant", "content": "A hall."},
        {"role": "user", "content": "take key"},
    ]
    assert simulator_prompt_action(step) == "go east" and simulator_prompt_action(conversation) == "take key"
    rows = [
        {"prompt": step, "completion": "You go east."},
        {"prompt": step, "completion": "You go  east."},
        {"prompt": conversation, "completion": "Taken."},
    ]
    preds = ["You go east.", "You go west.", "Taken. "]  # exact: whitespace-normalised, as eval-model's `exact`
    assert simulator_verb_accuracy(preds, rows).to_dict() == {
        "go": {"n": 2, "exact": 1, "accuracy": 0.5},
        "take": {"n": 1, "exact": 1, "accuracy": 1.0},
    }
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    cfg = EvalModelConfig(
        role="simulator", dataset="d", adapter=str(adapter), out=str(tmp_path / "out"), write_adapter_accuracy=True
    )
    written = write_verb_accuracy(cfg, {"base": (["x"] * 3, None, 0.0), "adapter": (preds, None, 0.0)}, rows)
    assert written == [tmp_path / "out" / ACCURACY_FILE, adapter / ACCURACY_FILE]
    assert SimulatorAccuracy.read(adapter / ACCURACY_FILE).accuracy("go") == (0.5, "go: 1/2 exact")
    with pytest.raises(ValueError, match="write_adapter_accuracy"):
        EvalModelConfig(role="decider", dataset="d", adapter=str(adapter), write_adapter_accuracy=True)


def test_online_per_verb_accuracy_from_traces():
    trace = EpisodeTrace.start(episode_id="e", env="toy", task={}, arm="simplan")
    for action, expectation, observation in [
        ("go east", "Room 2.", "room 2."),  # exact after core.text.normalize (lower-cased), as trace.summarize
        ("go east", "Room 3.", "Room 4."),
        ("take key", None, "Taken."),  # not imagined: not counted
        ("open door", "It opens.", "It opens."),
    ]:
        trace.add(ActEvent(action=action, expectation=expectation, observation=observation))
    table = accuracy_from_traces([trace])
    assert {v: (c.n, c.exact) for v, c in table.verbs.items()} == {"go": (2, 1), "open": (1, 1)}
    assert table.overall.exact == summarize(trace).sim_exact


def test_reading_a_bad_table_names_the_file_and_entry(tmp_path):
    path = tmp_path / ACCURACY_FILE
    path.write_text(json.dumps({"go": {"n": 2, "exact": 3}}))
    with pytest.raises(ValueError, match=f"{ACCURACY_FILE}: entry 'go'"):
        SimulatorAccuracy.read(path)


# -- confidence ------------------------------------------------------------------------------------
def test_judge_prefers_a_confident_prediction_when_the_weight_is_on():
    judge = Judge(JudgeWeights(confidence=0.5))
    keys, predicted = ["take key"], ["You take the key."]  # a progress outcome
    sure = judge.score(keys, predicted, JudgeMemory(), confidence=[-0.01])[1]
    unsure = judge.score(keys, predicted, JudgeMemory(), confidence=[-3.0])[1]
    assert sure > unsure
    # hand-computed: progress 1.0 * (1 - 0.5 * (1 - e^-3)) + length -0.05
    assert unsure == pytest.approx(1.0 * (1 - 0.5 * (1 - math.exp(-3.0))) - 0.05, abs=1e-6)
    # an unsure predicted error is penalised less: it blends toward 0 too
    failing = ["You can't do that."]
    assert (
        judge.score(keys, failing, JudgeMemory(), confidence=[-3.0])[1]
        > judge.score(keys, failing, JudgeMemory(), confidence=[-0.01])[1]
    )
    # weight 0 (the default) and unknown confidence: today's scores
    off = Judge(JudgeWeights())
    plain = off.score(keys, predicted, JudgeMemory())
    assert off.score(keys, predicted, JudgeMemory(), confidence=[-3.0]) == plain
    assert judge.score(keys, predicted, JudgeMemory(), confidence=[None]) == plain
    assert trust(None, 1.0) == 1.0 and trust(0.0, 1.0) == 1.0 and trust(-math.inf, 0.3) == pytest.approx(0.7)


class NoLogprobEngine(ScriptedEngine):
    """A backend that cannot give logprobs (every completion's logprob None)."""

    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        results = super().generate(requests)
        for r in results:
            r.completions = [Completion(c.text, c.num_tokens, c.finish_reason) for c in r.completions]
        return results


def test_planner_traces_the_simulator_confidence_and_is_none_safe():
    oracle = ToyOracle(TASK)
    cfg = PlannerConfig(
        arm="simplan", k=2, horizon=2, adaptive=False, raise_errors=True, prompts=PromptConfig(max_history=50)
    )
    engine = ScriptedEngine(oracle.decide, oracle.simulate, oracle.score)  # logprob -0.1 per word
    result = Planner(
        engine, ToyEnv(), dataclasses.replace(cfg, judge=dataclasses.replace(cfg.judge, confidence=0.5))
    ).run(TASK)
    assert all(r.logprobs for r in engine.requests("simulate"))
    confidences = [c for e in result.trace.of_type("imagine") for r in e.candidates for c in r.confidence]
    assert confidences and all(c == pytest.approx(-0.1) for c in confidences)
    blind = NoLogprobEngine(oracle.decide, oracle.simulate, oracle.score)
    result = Planner(
        blind, ToyEnv(), dataclasses.replace(cfg, judge=dataclasses.replace(cfg.judge, confidence=0.5))
    ).run(TASK)
    records = [r for e in result.trace.of_type("imagine") for r in e.candidates]
    assert result.summary.success and any(r.confidence for r in records)
    assert all(c is None for r in records for c in r.confidence)


def test_completion_mean_logprob():
    assert Completion("a b", 4, logprob=-2.0).mean_logprob == -0.5
    assert Completion("a", 1).mean_logprob is None and Completion("", 0, logprob=0.0).mean_logprob is None


def test_hf_backend_fills_the_confidence_on_a_tiny_random_model():
    pytest.importorskip("transformers")
    from simplan.inference.engines import make_engine
    from simplan.models.tiny import tiny_model

    engine = make_engine("hf", str(tiny_model("llama", final_norm=1.0)), {}, dtype="float32", threads=1)
    try:
        messages = [{"role": "user", "content": "Observation after go north?"}]
        with_lp, without = engine.generate(
            [
                GenerationRequest(messages=messages, max_tokens=6, logprobs=True),
                GenerationRequest(messages=messages, max_tokens=6),
            ]
        )
        c = with_lp.completions[0]
        assert c.num_tokens > 0 and c.logprob is not None and c.min_logprob is not None
        assert c.min_logprob <= c.mean_logprob <= 0.0 and c.mean_logprob == pytest.approx(c.logprob / c.num_tokens)
        assert without.completions[0].logprob is None and without.completions[0].mean_logprob is None
        assert without.completions[0].text == c.text  # greedy either way
    finally:
        engine.close()


def test_eval_model_writes_the_per_verb_accuracy_next_to_the_adapter(tmp_path):
    """`simplan eval-model --role simulator` end to end on saved predictions (no model): the files and by_verb."""
    from datasets import Dataset, DatasetDict

    from simplan.evaluation.offline import evaluate

    def prompt(action: str) -> list[dict[str, str]]:
        return simulator_messages(PromptState(goal="escape", observation="A hall."), action)

    gold = [("go east", "Room 2."), ("go west", "Room 1."), ("take key", "Taken."), ("open door", "You win.")]
    rows = [{"prompt": prompt(a), "completion": o, "family": "corridor", "error": False} for a, o in gold]
    DatasetDict({"dev": Dataset.from_list(rows)}).save_to_disk(str(tmp_path / "data"))
    outputs = ["Room 2.", "Room 3.", "Taken.", "Nothing."]
    predictions = tmp_path / "run" / "predictions.jsonl"
    predictions.parent.mkdir()
    predictions.write_text("".join(json.dumps({"gold": o, "adapter": p}) + "\n" for (_, o), p in zip(gold, outputs)))
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    cfg = EvalModelConfig(
        role="simulator",
        dataset=str(tmp_path / "data"),
        predictions=str(predictions),
        adapter=str(adapter),
        write_adapter_accuracy=True,
        out=str(tmp_path / "out"),
    )
    report = evaluate(cfg)
    expected = {"go": (2, 1), "open": (1, 0), "take": (1, 1)}
    for path in (tmp_path / "out" / ACCURACY_FILE, adapter / ACCURACY_FILE):
        table = SimulatorAccuracy.read(path)
        assert {v: (c.n, c.exact) for v, c in table.verbs.items()} == expected
    assert report["by_verb"]["adapter"]["go"] == {"n": 2, "exact": 1, "accuracy": 0.5}
    assert report["results"]["adapter"]["exact"] == 0.5  # the same rule as the headline exact: 2 of 4
