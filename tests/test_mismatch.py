"""The expectation-mismatch measure: pairs read from traces with their labels, the table's numbers by hand, and
embeddings that are the same batched and one by one.

    .venv/bin/pytest -q tests/test_mismatch.py
"""

from __future__ import annotations

import numpy as np
import pytest

from simplan.evaluation.mismatch import (
    ExpectationPair,
    embedding_similarities,
    expectation_pairs,
    matched_threshold,
    mismatch_row,
    mismatch_table,
    text_similarities,
)
from simplan.inference.engines.base import EmbedRequest, MeteredEngine, cosine
from simplan.inference.engines.batching import BatchingEngine
from simplan.inference.engines.scripted import ScriptedEngine
from simplan.inference.planning.trace import ActEvent, EndEvent, EpisodeTrace, write_traces


def _trace(episode: str, acts: list[tuple[str | None, str, bool, bool]], won: bool) -> EpisodeTrace:
    trace = EpisodeTrace.start(episode, "toy", {"family": "corridor", "task_id": episode}, "simplan")
    for expectation, observation, error, done in acts:
        trace.add(ActEvent(action="go", observation=observation, expectation=expectation, error=error, done=done))
    trace.add(EndEvent(success=won))
    return trace


@pytest.fixture
def run(tmp_path):
    traces = [
        _trace("a", [("You go east.", "You go east.", False, False), (None, "You win.", False, True)], won=True),
        _trace(
            "b", [("You take the key.", "There is no key here.", True, False), ("x", "You lose.", False, True)], False
        ),
    ]
    write_traces(tmp_path / "traces.jsonl", traces)
    return tmp_path


def test_pairs_are_the_acts_with_an_expectation_labelled_by_episode_and_step(run):
    pairs = expectation_pairs([run])
    assert [(p.episode_id, p.step, p.episode_failed, p.step_failed) for p in pairs] == [
        ("a", 0, False, False),
        ("b", 0, True, True),  # the env flagged the step
        ("b", 1, True, True),  # the step ended the episode unwon
    ]
    assert expectation_pairs([run], arms=["reactive"]) == []
    assert text_similarities(pairs, "token_f1").tolist() == [1.0, pytest.approx(2 / 9), 0.0]  # "key": P 1/5, R 1/4


def test_the_table_by_hand():
    ps = [
        ExpectationPair("e", "simplan", "f", i, "a", "b", episode_failed=i >= 2, step_failed=i == 3) for i in range(4)
    ]
    sims = np.array([0.9, 0.6, 0.5, 0.1])
    row = mismatch_row(ps, sims, 0.55)  # fires on the last two, both in failing episodes, one failed step
    assert row["fires"] == 2 and row["fire_rate"] == 0.5
    assert row["fired_on_failing_episode"] == 1.0 and row["fired_on_failed_step"] == 0.5
    assert row["auroc_episode_failed"] == 1.0 and row["auroc_step_failed"] == 1.0 and row["quiet_on_failed_step"] == 0
    assert matched_threshold(sims, 0.5) == 0.6  # sims < 0.6: two of four, as often as the reference
    table = mismatch_table(ps, {"token_f1": sims, "other": sims[::-1].copy()}, {"token_f1": 0.55})
    assert table["other@matched"]["fires"] == 2 and "other" not in table
    assert table["other@matched"]["auroc_episode_failed"] == 0.0  # the reversed order ranks every pair wrong


def test_embeddings_are_the_same_batched_and_alone_and_one_for_equal_texts(run):
    from simplan.inference.engines import make_engine
    from simplan.models.tiny import tiny_model

    engine = make_engine("hf", tiny_model("llama"), None, dtype="float32", threads=1)
    texts = ["You take the key.", "The door is locked and the key is gone.", "", "ok"]
    alone = [engine.embed([EmbedRequest(t)])[0] for t in texts]
    batched = engine.embed([EmbedRequest(t) for t in texts])
    for a, b in zip(alone, batched):
        assert a.prompt_tokens == b.prompt_tokens
        assert np.allclose(a.vector, b.vector, atol=1e-5)  # right padding never reaches a text's own tokens
    assert cosine(batched[0].vector, batched[0].vector) == pytest.approx(1.0)
    assert batched[2].prompt_tokens == 0 and not any(batched[2].vector)  # no tokens: the zero vector
    sims = embedding_similarities(expectation_pairs([run]), engine)
    assert sims[0] == 1.0 and -1.0 <= sims[1] < 1.0
    batcher = BatchingEngine(engine)  # what concurrent episodes share: embeddings go through its dispatcher too
    try:
        assert [r.vector for r in batcher.embed([EmbedRequest(t) for t in texts])] == [r.vector for r in batched]
    finally:
        batcher.close()
    with pytest.raises(NotImplementedError, match="cannot embed texts"):
        MeteredEngine(ScriptedEngine(lambda req: "look")).embed([EmbedRequest("x")])
