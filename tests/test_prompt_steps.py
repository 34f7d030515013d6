"""Prompt tokens per decision, imagined step and real step (issue 16 (c)): hand-made traces against hand-computed
values, the report's table and metrics.json, and a scripted toy run whose engine requests give the expected sums."""

from __future__ import annotations

import json

import pytest

from simplan.envs.toy import ToyEnv
from simplan.inference.engine import GenerationRequest, ScoreRequest
from simplan.inference.metrics import aggregate, load_run, prompt_account, records_from_traces
from simplan.inference.planner import Planner, PlannerConfig
from simplan.inference.report import write_report
from simplan.inference.scripted import ScriptedEngine, ToyOracle, last_user_content
from simplan.inference.trace import (
    ActEvent,
    CandidateRecord,
    EndEvent,
    EpisodeTrace,
    ImagineEvent,
    append_trace,
)


def episode(eid: str, arm: str, imagines: list[ImagineEvent], steps: int) -> EpisodeTrace:
    """A finished episode: its imagine events, `steps` real actions, an end event with the imagine events' sums."""
    t = EpisodeTrace.start(eid, "toy", {"task_id": eid.split("/")[1], "family": "x", "fold": "dev"}, arm)
    for e in imagines:
        t.add(e)
    for i in range(1, steps + 1):
        t.add(ActEvent(action="look", observation=f"o{i}"), step=i)
    t.add(
        EndEvent(
            status="failed",
            steps=steps,
            prompt_tokens=sum(e.prompt_tokens for e in imagines),
            cached_prompt_tokens=sum(e.cached_prompt_tokens for e in imagines),
        )
    )
    return t


def decided(prompt: int, cached: int) -> ImagineEvent:
    """A decision that imagined nothing (horizon 0): all its tokens are the decider's at the real state."""
    cands = [CandidateRecord(actions=["look"])]
    return ImagineEvent(candidates=cands, prompt_tokens=prompt, cached_prompt_tokens=cached)


def imagined(prompt: int, cached: int, predicted: list[list[str]]) -> ImagineEvent:
    cands = [CandidateRecord(index=i, actions=["look"] * len(p), predicted=p) for i, p in enumerate(predicted)]
    return ImagineEvent(candidates=cands, horizon=2, prompt_tokens=prompt, cached_prompt_tokens=cached)


def hand_traces() -> list[EpisodeTrace]:
    return [
        # reactive: 4 decisions (560 prompt, 240 cached), 5 real steps (the last one a retry without a call)
        episode("toy/a/reactive/0", "reactive", [decided(100, 40), decided(120, 90), decided(140, 110)], 3),
        episode("toy/b/reactive/0", "reactive", [decided(200, 0)], 2),
        # simplan: one decision imagined 3 steps (2 + 1 predictions), one skipped simulation; 3 real steps
        episode("toy/a/simplan/0", "simplan", [imagined(500, 300, [["o2", "o3"], ["o2"]]), decided(50, 30)], 3),
    ]


def test_prompt_tokens_per_step_match_hand_computed_values() -> None:
    arms = {m.arm: m for m in aggregate(records_from_traces(hand_traces()))}
    r = arms["reactive"]
    assert (r.real_steps, r.decisions, r.imagined_steps, r.unsplit_decisions) == (5, 4, 0, 0)
    assert r.prompt_per_decision == pytest.approx(560 / 4)  # 140
    assert r.prefilled_per_decision == pytest.approx((560 - 240) / 4)  # 80
    assert r.prompt_per_imagined_step is None and r.prefilled_per_imagined_step is None  # nothing imagined
    assert r.prompt_per_real_step == pytest.approx(560 / 5)
    assert r.prefilled_per_real_step == pytest.approx(320 / 5)
    assert r.prompt_cache_share == pytest.approx(240 / 560)
    s = arms["simplan"]
    assert (s.real_steps, s.decisions, s.imagined_steps, s.unsplit_decisions) == (3, 2, 3, 1)
    # the imagining decision's tokens are one sum with its rollouts': no split is guessed
    assert s.prompt_per_decision is None and s.prompt_per_imagined_step is None
    assert s.prompt_per_real_step == pytest.approx(550 / 3)
    assert s.prefilled_per_real_step == pytest.approx(220 / 3)
    assert s.prompt_cache_share == pytest.approx(330 / 550)


def test_prompt_account_of_one_episode() -> None:
    acc = prompt_account(hand_traces()[2])
    assert (acc.decisions, acc.decision_prompt, acc.decision_cached) == (2, 50, 30)
    assert (acc.imagined_steps, acc.unsplit_decisions) == (3, 1)


def test_report_table_and_metrics_json(tmp_path) -> None:
    run = tmp_path / "run"
    for t in hand_traces():
        append_trace(run / "traces.jsonl", t)
    paths = write_report([run], tmp_path / "report")
    md = paths["md"].read_text()
    assert "### Prompt tokens per step" in md
    row = next(line for line in md.splitlines() if line.startswith("| run | reactive | 5 | 4 | 0 |"))
    assert "| 140.0 / 80.0 | - | 112.0 / 64.0 | 42.9% |" in row
    row = next(line for line in md.splitlines() if line.startswith("| run | simplan | 3 | 2 (1 imagined) | 3 |"))
    assert "| - | - | 183.3 / 73.3 | 60.0% |" in row
    data = json.loads(paths["json"].read_text())
    (only,) = data["runs"]
    arms = {a["arm"]: a for a in only["arms"]}
    assert arms["reactive"]["prompt_per_decision"] == pytest.approx(140.0)
    assert arms["reactive"]["prefilled_per_decision"] == pytest.approx(80.0)
    assert arms["simplan"]["unsplit_decisions"] == 1 and arms["simplan"]["prompt_per_decision"] is None
    assert only["files"][0]["path"] == str(run / "traces.jsonl")
    assert {a["arm"] for a in only["families"]} == {"reactive", "simplan"}


def metered_prompt_tokens(requests: list[GenerationRequest | ScoreRequest]) -> int:
    """What MeteredEngine counts as prompt tokens of ScriptedEngine requests (words; scored candidates included)."""

    def words(text: str) -> int:
        return max(1, len(text.split()))

    total = 0
    for r in requests:
        total += words(last_user_content(r.messages, r.prompt))
        if isinstance(r, ScoreRequest):
            total += sum(words(c) for c in r.candidates)
    return total


def test_reactive_toy_run_counts_every_decider_prompt(tmp_path) -> None:
    env = ToyEnv()
    task = env.tasks("dev")[3]
    oracle = ToyOracle(task)
    engine = ScriptedEngine(oracle.decide, oracle.simulate, oracle.score)
    cfg = PlannerConfig(arm="reactive", max_history=50, raise_errors=True)
    result = Planner(engine, env, cfg).run(task)
    assert result.summary.success
    append_trace(tmp_path / "traces.jsonl", result.trace)
    (m,) = aggregate(load_run(tmp_path))
    decisions = len(engine.requests())  # reactive: one decider call (scoring the valid actions) per real step
    assert decisions == m.decisions == m.real_steps == result.summary.steps
    assert m.imagined_steps == 0 and m.unsplit_decisions == 0
    assert m.prompt_per_decision == pytest.approx(metered_prompt_tokens(engine.requests()) / decisions)
    assert m.prefilled_per_decision == m.prompt_per_decision  # the scripted engine reuses nothing
    assert m.prompt_cache_share == 0.0


def test_simplan_toy_run_splits_decisions_from_imagination() -> None:
    env = ToyEnv()
    task = env.tasks("dev")[3]
    oracle = ToyOracle(task)
    engine = ScriptedEngine(oracle.decide, oracle.simulate, oracle.score)
    cfg = PlannerConfig(arm="simplan", adaptive=False, max_history=50, raise_errors=True)
    result = Planner(engine, env, cfg).run(task)
    (m,) = aggregate(records_from_traces([result.trace]))
    imagines = result.trace.of_type("imagine")
    assert m.decisions == len(imagines) and m.real_steps == result.summary.steps and m.unsplit_decisions == 0
    predictions = sum(len(c.predicted) for e in imagines for c in e.candidates)
    assert m.imagined_steps == predictions >= len(engine.requests("simulate")) > 0  # cache hits: no call
    # the toy lists its valid actions: decisions score them, rollouts generate (simulator and decider)
    scored = [r for kind, requests in engine.calls if kind == "score" for r in requests]
    generated = [r for kind, requests in engine.calls if kind == "generate" for r in requests]
    assert m.prompt_per_decision == pytest.approx(metered_prompt_tokens(scored) / m.decisions)
    assert m.prompt_per_imagined_step == pytest.approx(metered_prompt_tokens(generated) / m.imagined_steps)
    assert m.prefilled_per_imagined_step == m.prompt_per_imagined_step  # the scripted engine reuses nothing


def test_recorded_split_of_an_imagining_decision() -> None:
    e = imagined(500, 300, [["o2", "o3"], ["o2"]])
    e.decision_prompt_tokens, e.decision_cached_prompt_tokens = 200, 50
    (m,) = aggregate(records_from_traces([episode("toy/a/simplan/0", "simplan", [e, decided(50, 30)], 3)]))
    assert (m.decisions, m.imagined_steps, m.unsplit_decisions) == (2, 3, 0)
    assert m.prompt_per_decision == pytest.approx((200 + 50) / 2)
    assert m.prefilled_per_decision == pytest.approx((150 + 20) / 2)
    assert m.prompt_per_imagined_step == pytest.approx(300 / 3)
    assert m.prefilled_per_imagined_step == pytest.approx((300 - 250) / 3)
