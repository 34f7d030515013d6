"""Evaluation: episodes of all arms batch into fewer engine calls; a resumed run never double counts."""

from __future__ import annotations

import json

import pytest

from simplan.inference.batching import BatchingEngine
from simplan.inference.engine import GenerationRequest, ScoreRequest
from simplan.inference.evaluate import RESULTS, TRACES, EvalConfig, evaluate
from simplan.inference.metrics import aggregate, load_run
from simplan.inference.scripted import ScriptedEngine
from simplan.inference.trace import read_traces

PREFERENCE = ("open door", "take key", "go east")


def _rank(action: str) -> int:
    return PREFERENCE.index(action) if action in PREFERENCE else len(PREFERENCE)


def greedy_engine(latency: float = 0.0) -> ScriptedEngine:
    """Solves every toy task: take the key when it is here, open the door when it is here, else go east."""

    def decide(req: GenerationRequest, text: str) -> str:
        return min(req.choices or ["go east"], key=_rank)

    def score(req: ScoreRequest, text: str) -> list[float]:
        return [-float(_rank(c)) for c in req.candidates]

    def simulate(req: GenerationRequest, text: str) -> str:
        return "You are in a room."

    return ScriptedEngine(decide=decide, simulate=simulate, score=score, latency=latency)


def _cfg(tmp_path, **kw) -> EvalConfig:
    base = dict(suite="toy-dev", episodes=4, out=str(tmp_path / "run"), progress=False, planner={"max_history": 50})
    base.update(kw)
    return EvalConfig(**base)


def test_concurrent_episodes_batch_engine_calls(tmp_path) -> None:
    engine = greedy_engine(latency=0.002)
    outcome = evaluate(_cfg(tmp_path), engine, concurrency=6)
    assert outcome.planned == 12 and outcome.ran == 12 and outcome.errored == 0
    records = load_run(outcome.out)
    episode_calls = sum(r.summary.model_calls for r in records)
    assert outcome.batch["episode_calls"] == episode_calls
    assert len(engine.calls) == outcome.batch["underlying_calls"]
    assert len(engine.calls) < episode_calls  # merged across episodes
    assert outcome.batch["max_calls_per_batch"] > 1
    by_arm = {m.arm: m for m in aggregate(records)}
    assert set(by_arm) == {"reactive", "plan", "simplan"}
    assert by_arm["reactive"].success_rate == 1.0  # the greedy policy solves the toy corridor


def test_resume_never_double_counts(tmp_path) -> None:
    cfg = _cfg(tmp_path, limit=5)
    first = evaluate(cfg, greedy_engine(), concurrency=3)
    assert first.ran == 5
    out = first.out
    # Simulate a crash: a torn last line in both logs and a trace cut short (no end event).
    with open(out / TRACES, "a") as f:
        f.write(json.dumps({"type": "start", "episode_id": "toy-dev/toy/corridor-103/plan/0", "t": 0, "step": 0}))
        f.write("\n")
        f.write('{"type": "act", "episode_id": "toy-dev/toy/corr')
    with open(out / RESULTS, "a") as f:
        f.write('{"episode_id": "toy-de')
    second = evaluate(_cfg(tmp_path), greedy_engine(), concurrency=3)
    assert second.skipped == 5 and second.ran == 7
    third = evaluate(_cfg(tmp_path), greedy_engine(), concurrency=3)
    assert third.ran == 0 and third.skipped == 12

    ids = [t.episode_id for t in read_traces(out / TRACES, strict=True)]
    assert len(ids) == len(set(ids)) == 12
    results = [json.loads(line) for line in (out / RESULTS).read_text().splitlines()]
    assert len(results) == len({r["episode_id"] for r in results}) == 12
    assert (out / (TRACES + ".torn")).exists() and (out / (TRACES + ".partial")).exists()
    assert sum(m.episodes for m in aggregate(load_run(out))) == 12
    assert len(json.loads((out / "run.json").read_text())["invocations"]) == 3


def test_resume_refuses_a_different_evaluation(tmp_path) -> None:
    evaluate(_cfg(tmp_path, limit=1), greedy_engine(), concurrency=1)
    with pytest.raises(ValueError, match="different evaluation"):
        evaluate(_cfg(tmp_path, planner={"max_history": 3}), greedy_engine(), concurrency=1)
    again = evaluate(_cfg(tmp_path, planner={"max_history": 3}, fresh=True, limit=1), greedy_engine(), concurrency=1)
    assert again.skipped == 0 and again.ran == 1


def test_faults_are_recorded_in_traces(tmp_path) -> None:
    cfg = _cfg(tmp_path, arms=["reactive"], faults={"transient": 0.3, "seed": 1})
    evaluate(cfg, greedy_engine(), concurrency=2)
    (m,) = aggregate(load_run(cfg.out))
    assert m.faults > 0 and m.faulted_episodes > 0 and m.recovery_rate is not None


def test_batching_engine_splits_errors_to_their_caller() -> None:
    import threading

    engine = greedy_engine()
    engine.constrained = False  # choices raise NotImplementedError
    batcher = BatchingEngine(engine, window=0.2)
    results: dict[str, object] = {}
    both_active = threading.Barrier(2)

    def call(name: str, req: GenerationRequest) -> None:
        with batcher.session():
            both_active.wait()  # both sessions are open before either submits: one merged call
            try:
                results[name] = batcher.generate([req])[0].completions[0].text
            except NotImplementedError as e:
                results[name] = e

    plain = GenerationRequest(messages=[{"role": "user", "content": "hi"}])
    constrained = GenerationRequest(messages=[{"role": "user", "content": "hi"}], choices=["go east", "look"])
    threads = [threading.Thread(target=call, args=a) for a in (("plain", plain), ("constrained", constrained))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    batcher.close()
    assert results["plain"] == "go east"
    assert isinstance(results["constrained"], NotImplementedError)
    assert batcher.stats.split_retries == 1 and batcher.stats.max_calls_per_batch == 2


def test_an_episode_setup_error_stops_the_eval(tmp_path) -> None:
    cfg = _cfg(tmp_path, planner={"decider_adapter": "missing"})
    with pytest.raises(ValueError, match="no adapter 'missing'"):
        evaluate(cfg, greedy_engine(), concurrency=3)
    assert not (tmp_path / "run" / RESULTS).exists()
