"""Prompt tokens per decision, imagined step and real step (issue 16 (c)): hand-made traces against hand-computed
values, the report's table and metrics.json, and a scripted toy run whose engine requests give the expected sums;
the split of prefilled tokens into context and scored candidates, exact on a scripted run and on the hf engine's
prefix cache (a tiny random model), and unknown ('-') in traces written before candidates were counted."""

from __future__ import annotations

import json

import pytest

from simplan.envs.toy import ToyEnv
from simplan.evaluation.metrics import aggregate, load_run, prompt_account, records_from_traces
from simplan.evaluation.report import write_report
from simplan.inference.engines.base import GenerationRequest, ScoreRequest
from simplan.inference.engines.scripted import ScriptedEngine, ToyOracle, last_user_content
from simplan.inference.planning.config import PromptConfig
from simplan.inference.planning.planner import Planner, PlannerConfig
from simplan.inference.planning.router import BudgetConfig
from simplan.inference.planning.trace import (
    ActEvent,
    CandidateRecord,
    EndEvent,
    EpisodeTrace,
    ImagineEvent,
    append_trace,
    read_traces,
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
    # written without candidate counts: context prefilled and candidate tokens are unknown, not zero
    assert "| 140.0 / 80.0 | - | 112.0 / 64.0 | - | - | - | - | 42.9% |" in row
    row = next(line for line in md.splitlines() if line.startswith("| run | simplan | 3 | 2 (1 imagined) | 3 |"))
    assert "| - | - | 183.3 / 73.3 | - | - | - | - | 60.0% |" in row
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
    cfg = PlannerConfig(arm="reactive", raise_errors=True, prompts=PromptConfig(max_history=50))
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
    # each decision's prompt splits into its scored candidates and its context (the scripted engine counts words)
    imagines = result.trace.of_type("imagine")
    assert len(imagines) == decisions > 1  # one scored decision per real step
    for e, req in zip(imagines, engine.requests(), strict=True):
        candidates = sum(max(1, len(c.split())) for c in req.candidates)
        assert e.candidate_tokens == e.decision_candidate_tokens == candidates > 0
        context = e.prompt_tokens - e.cached_prompt_tokens - e.candidate_tokens
        assert context == max(1, len(last_user_content(req.messages, req.prompt).split()))  # nothing reused
    total = sum(e.candidate_tokens for e in imagines)
    assert m.candidate_tokens_per_decision == pytest.approx(total / m.decisions)
    assert m.candidate_tokens_per_real_step == pytest.approx(total / m.real_steps)
    assert m.context_prefilled_per_decision == pytest.approx(m.prefilled_per_decision - total / m.decisions)


def test_simplan_toy_run_splits_decisions_from_imagination() -> None:
    env = ToyEnv()
    task = env.tasks("dev")[3]
    oracle = ToyOracle(task)
    engine = ScriptedEngine(oracle.decide, oracle.simulate, oracle.score)
    cfg = PlannerConfig(arm="simplan", adaptive=False, raise_errors=True, prompts=PromptConfig(max_history=50))
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
    # rollouts generate, so imagined steps score no candidates: their prefill is all context
    total = sum(max(1, len(c.split())) for r in scored for c in r.candidates)
    assert m.imagined_steps > 0 and m.candidate_tokens_per_imagined_step == 0.0
    assert m.context_prefilled_per_imagined_step == pytest.approx(m.prefilled_per_imagined_step)
    assert m.candidate_tokens_per_decision == pytest.approx(total / m.decisions)


def test_recorded_split_of_an_imagining_decision() -> None:
    e = imagined(500, 300, [["o2", "o3"], ["o2"]])
    e.decision_prompt_tokens, e.decision_cached_prompt_tokens = 200, 50
    (m,) = aggregate(records_from_traces([episode("toy/a/simplan/0", "simplan", [e, decided(50, 30)], 3)]))
    assert (m.decisions, m.imagined_steps, m.unsplit_decisions) == (2, 3, 0)
    assert m.prompt_per_decision == pytest.approx((200 + 50) / 2)
    assert m.prefilled_per_decision == pytest.approx((150 + 20) / 2)
    assert m.prompt_per_imagined_step == pytest.approx(300 / 3)
    assert m.prefilled_per_imagined_step == pytest.approx((300 - 250) / 3)


# ------------------------------------------------------------------------- context prefilled vs scored candidates
def counted(e: ImagineEvent, candidates: int, decision_candidates: int | None = None) -> ImagineEvent:
    """`e` as the planner now writes it: with its decision's split and its scored candidates' tokens."""
    if e.decision_prompt_tokens is None:
        e.decision_prompt_tokens, e.decision_cached_prompt_tokens = e.prompt_tokens, e.cached_prompt_tokens
    e.candidate_tokens = candidates
    e.decision_candidate_tokens = candidates if decision_candidates is None else decision_candidates
    return e


def test_context_and_candidate_tokens_match_hand_computed_values() -> None:
    e = imagined(500, 300, [["o2", "o3"], ["o2"]])
    e.decision_prompt_tokens, e.decision_cached_prompt_tokens = 200, 50
    traces = [
        # reactive: prompt 100 + 120 (cached 40 + 90), candidates 30 + 30; 3 real steps
        episode("toy/a/reactive/0", "reactive", [counted(decided(100, 40), 30), counted(decided(120, 90), 30)], 3),
        # simplan: decision 200 (50 cached, 40 candidates), rollouts 300 (250 cached, 10 candidates); then 50/30/20
        episode("toy/a/simplan/0", "simplan", [counted(e, 50, 40), counted(decided(50, 30), 20)], 3),
    ]
    arms = {m.arm: m for m in aggregate(records_from_traces(traces))}
    r = arms["reactive"]
    assert r.uncounted_candidates == 0
    assert r.candidate_tokens_per_decision == pytest.approx(60 / 2)
    assert r.context_prefilled_per_decision == pytest.approx((220 - 130 - 60) / 2)  # 15
    assert r.context_prefilled_per_decision + r.candidate_tokens_per_decision == pytest.approx(
        r.prefilled_per_decision
    )
    assert r.candidate_tokens_per_real_step == pytest.approx(60 / 3)
    assert r.context_prefilled_per_real_step == pytest.approx(30 / 3)
    assert r.candidate_tokens_per_imagined_step is None and r.context_prefilled_per_imagined_step is None
    s = arms["simplan"]
    assert s.candidate_tokens_per_decision == pytest.approx((40 + 20) / 2)
    assert s.context_prefilled_per_decision == pytest.approx((200 - 50 - 40 + 50 - 30 - 20) / 2)  # 55
    assert s.candidate_tokens_per_imagined_step == pytest.approx(10 / 3)
    assert s.context_prefilled_per_imagined_step == pytest.approx((300 - 250 - 10) / 3)
    assert s.context_prefilled_per_real_step == pytest.approx((550 - 330 - 70) / 3)
    acc = prompt_account(traces[1])
    assert (acc.decision_candidates, acc.imagined_candidates, acc.uncounted_candidates) == (60, 10, 0)


def test_one_event_without_candidate_counts_leaves_them_unknown() -> None:
    t = episode("toy/a/reactive/0", "reactive", [counted(decided(100, 40), 30), decided(120, 90)], 2)
    (m,) = aggregate(records_from_traces([t]))
    assert m.uncounted_candidates == 1 and m.prefilled_per_decision == pytest.approx(45.0)
    for unit in ("decision", "imagined_step", "real_step"):
        assert getattr(m, f"candidate_tokens_per_{unit}") is None
        assert getattr(m, f"context_prefilled_per_{unit}") is None


def test_trace_written_before_the_candidate_fields_loads_and_reports_dashes(tmp_path) -> None:
    run = tmp_path / "run"
    append_trace(run / "traces.jsonl", episode("toy/a/reactive/0", "reactive", [counted(decided(100, 40), 30)], 1))
    lines = [json.loads(line) for line in (run / "traces.jsonl").read_text().splitlines()]
    for d in lines:  # as an older planner wrote it: no such keys at all
        for key in ("candidate_tokens", "decision_candidate_tokens"):
            d.pop(key, None)
    (run / "traces.jsonl").write_text("".join(json.dumps(d) + "\n" for d in lines))
    (m,) = aggregate(load_run(run))
    (e,) = [e for t in read_traces(run / "traces.jsonl") for e in t.of_type("imagine")]
    assert e.candidate_tokens is None and e.decision_candidate_tokens is None
    assert m.prefilled_per_decision == pytest.approx(60.0) and m.candidate_tokens_per_decision is None
    md = write_report([run], tmp_path / "report")["md"].read_text()
    row = next(line for line in md.splitlines() if line.startswith("| run | reactive | 1 | 1 | 0 |"))
    assert "| 100.0 / 60.0 | - | 100.0 / 60.0 | - | - | - | - | 40.0% |" in row


def test_hf_prefix_cache_prefills_only_the_new_turn(monkeypatch) -> None:
    """A reactive episode on the hf engine (tiny random model, conversation prompts): every decision's prompt
    = context prefilled + scored candidates + cached, and from the 2nd decision on the context prefilled is the
    new turn only (the previous prompt is a prefix of the new one and comes from the session's prefix cache)."""
    from simplan.envs.registry import make_env
    from simplan.inference.engines import make_engine
    from simplan.inference.engines.common import encode, prompt_ids
    from simplan.models.tiny import tiny_model

    engine = make_engine("hf", str(tiny_model("llama", final_norm=1.0)), dtype="float32", threads=1)
    seen: list[ScoreRequest] = []
    score = engine.score

    def spy(requests: list[ScoreRequest]):
        seen.extend(requests)
        return score(requests)

    monkeypatch.setattr(engine, "score", spy)
    env = make_env("toy")
    try:
        task = env.tasks("dev", limit=1)[0]
        cfg = PlannerConfig(
            arm="reactive",
            decider_adapter="",
            raise_errors=True,
            prompts=PromptConfig(format="conversation"),
            budgets=BudgetConfig(max_steps=3),
        )
        result = Planner(engine, env, cfg).run(task, episode_id="split/reactive")
    finally:
        env.close()
        engine.close()
    imagines = result.trace.of_type("imagine")
    assert len(imagines) == len(seen) >= 2
    tok = engine.tokenizer
    prompts = [prompt_ids(tok, r) for r in seen]
    for k, (e, req) in enumerate(zip(imagines, seen)):
        candidates = sum(len(encode(tok, c)) + 1 for c in req.candidates)  # + EOS
        assert e.candidate_tokens == e.decision_candidate_tokens == candidates
        assert e.prompt_tokens == e.decision_prompt_tokens == len(prompts[k]) + candidates
        context = e.prompt_tokens - e.cached_prompt_tokens - e.candidate_tokens
        if k == 0:
            assert (e.cached_prompt_tokens, context) == (0, len(prompts[0]))
        else:
            old = prompts[k - 1]
            assert prompts[k][: len(old)] == old  # the conversation only grows
            assert e.cached_prompt_tokens == len(old) and context == len(prompts[k]) - len(old) > 0
    (m,) = aggregate(records_from_traces([result.trace]))
    contexts = [e.prompt_tokens - e.cached_prompt_tokens - e.candidate_tokens for e in imagines]
    assert m.context_prefilled_per_decision == pytest.approx(sum(contexts) / m.decisions)
    assert m.context_prefilled_per_real_step == pytest.approx(sum(contexts) / m.real_steps)
