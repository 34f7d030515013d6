"""bench/bench_judge_rerank.py on hand-made fit-judge rows whose picks are known.

.venv/bin/python -m pytest -q tests/test_bench_judge_rerank.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from simplan.evaluation.judge_fit import Row
from simplan.inference.planning.outcomes import OutcomeJudge


@pytest.fixture
def bench(bench_script):
    return bench_script("bench_judge_rerank")


def probs(lost: float, progress: float) -> dict[str, float]:
    return {"error": 0.0, "no_change": 1.0 - lost - progress, "progress": progress, "won": 0.0, "lost": lost}


ROWS = [
    # state 0: the decider's top action loses and is predicted to; the second makes progress
    Row("g", 0, "a", "lost", False, logprob=-0.1, probs=probs(0.9, 0.0)),
    Row("g", 0, "b", "progress", True, logprob=-1.0, probs=probs(0.0, 0.8)),
    Row("g", 0, "c", "no_change", False, logprob=-3.0, probs=probs(0.1, 0.1)),
    # state 1: the top action is the expert's and safe; the third is predicted to progress but loses
    Row("g", 1, "x", "no_change", True, logprob=-0.2, probs=probs(0.0, 0.1)),
    Row("g", 1, "y", "no_change", False, logprob=-2.0, probs=probs(0.0, 0.1)),
    Row("g", 1, "z", "lost", False, logprob=-4.0, probs=probs(0.2, 0.7)),
]


def test_each_rule_picks_what_its_definition_says(bench) -> None:
    judge = OutcomeJudge(veto=0.5, weights={"logprob": 0.1, "p_progress": 5.0})
    chosen = {rule: [r.action for r in rows] for rule, rows in bench.picks(ROWS, judge).items()}
    assert chosen == {
        "decider's first choice": ["a", "x"],
        "fitted judge (veto 0.500)": ["b", "x"],  # the veto fires in state 0 only
        "value, best of top 2": ["b", "x"],
        "value, best of top 3": ["b", "z"],
        "value, best of all": ["b", "z"],  # no veto: the value's progress overrides a safe expert action
    }


def test_the_table_counts_outcomes_and_expert_agreement(bench, tmp_path: Path, monkeypatch) -> None:
    fit = tmp_path / "fit"
    fit.mkdir()
    (fit / "rows.jsonl").write_text("".join(json.dumps(r.__dict__) + "\n" for r in ROWS))
    judge = {"veto": 1.0, "weights": {"logprob": 1.0}, "bias": 0.0, "fitted": {}}
    (fit / "metrics.json").write_text(json.dumps({"judge": judge}))
    monkeypatch.setattr(sys, "argv", ["bench_judge_rerank.py", "--fits", str(fit), "--out", str(tmp_path / "out")])
    bench.main()
    lines = json.loads((tmp_path / "out" / "rerank.json").read_text())[str(fit)]
    first = lines[0]
    assert (first["rule"], first["bad"], first["good"], first["expert"], first["expert_states"]) == (
        "decider's first choice",
        1,
        0,
        1,
        2,
    )
    assert [x["states"] for x in lines] == [2] * 5
    assert (
        "| decider's first choice | 2 | 1 (50.0%) | 0 (0.0%) | 1/2 |" in (tmp_path / "out" / "rerank.md").read_text()
    )
