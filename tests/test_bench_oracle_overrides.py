"""bench/oracle_overrides.py on hand-made traces whose override causes are known.

.venv/bin/python -m pytest -q tests/test_bench_oracle_overrides.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from simplan.inference.planning.trace import EpisodeTrace, append_trace
from simplan.inference.planning.trace_events import CandidateRecord, EndEvent, ImagineEvent


@pytest.fixture
def bench(bench_script):
    return bench_script("oracle_overrides")


def decision(top: dict[str, float], chosen: dict[str, float] | None) -> ImagineEvent:
    """A simulated decision: the decider's first choice with `top` parts, taken when `chosen` is None, else
    overridden by a second candidate with `chosen` parts."""
    cands = [CandidateRecord(index=0, actions=["a"], parts=top, chosen=chosen is None)]
    if chosen is not None:
        cands.append(CandidateRecord(index=1, actions=["b"], parts=chosen, chosen=True))
    else:
        cands.append(CandidateRecord(index=1, actions=["b"], parts={}))
    return ImagineEvent(candidates=cands, horizon=1)


def episode(task: str, game: str, arm: str, won: bool, decisions: list[ImagineEvent]) -> EpisodeTrace:
    t = EpisodeTrace.start(f"s/twx/{task}/{arm}/0", "twx", {"task_id": task, "family": game, "fold": "dev"}, arm)
    for d in decisions:
        t.add(d)
    t.add(EndEvent(status="success" if won else "failed", success=won))
    return t


def test_causes_follow_the_parts_in_order(bench) -> None:
    assert bench.cause({"lost": -10.0, "error": -2.0}, {"won": 10.0}) == "lost"  # a loss avoided comes first
    assert bench.cause({"won": 0.0}, {"won": 9.0}) == "won"
    assert bench.cause({"error": -2.0}, {"progress": 1.0}) == "error"
    assert bench.cause({"progress": 0.0}, {"progress": 0.9}) == "progress"
    assert bench.cause({"repeat": -0.5}, {"repeat": 0.0}) == "repeat"
    assert bench.cause({"likelihood": 0.5}, {"likelihood": 0.1}) == "other"


def test_overrides_per_game_and_in_the_discordant_tasks(bench, tmp_path: Path) -> None:
    path = tmp_path / "traces.jsonl"
    lost, won = {"lost": -10.0}, {"won": 10.0}
    traces = [
        episode("arithmetic-0", "arithmetic", "simplan-oracle", True, [decision(lost, {}), decision({}, None)]),
        episode("arithmetic-0", "arithmetic", "reactive", False, []),
        episode("coin-0", "coin", "simplan-oracle", False, [decision({}, won)]),
        episode("coin-0", "coin", "reactive", True, []),
        episode("coin-1", "coin", "simplan-oracle", True, [decision({}, None)]),
        episode("coin-1", "coin", "reactive", True, []),
    ]
    for t in traces:
        append_trace(path, t)
    result = bench.analyse(path, "simplan-oracle", "reactive")
    assert (result["episodes"], result["won"], result["baseline_won"], result["simulated_decisions"]) == (3, 2, 2, 4)
    assert result["overrides"] == {"lost": 1, "won": 1}
    assert result["per_game"] == {"arithmetic": {"decisions": 2, "lost": 1}, "coin": {"decisions": 2, "won": 1}}
    assert result["won_only_by_arm"] == {"s/twx/arithmetic-0/0": {"lost": 1}}
    assert result["won_only_by_baseline"] == {"s/twx/coin-0/0": {"won": 1}}
    text = bench.markdown(result)
    assert "| arithmetic | 2 | 1 | 0 | 0 | 0 | 0 | 0 |" in text and "- s/twx/arithmetic-0/0: lost 1" in text


def test_the_command_writes_both_files(bench, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = tmp_path / "run"
    run.mkdir()
    append_trace(run / "traces.jsonl", episode("coin-0", "coin", "simplan-oracle", True, [decision({}, None)]))
    monkeypatch.setattr(sys, "argv", ["oracle_overrides.py", "--runs", str(run), "--out", str(tmp_path / "o")])
    bench.main()
    assert json.loads((tmp_path / "o" / "overrides.json").read_text())["episodes"] == 1
    assert (tmp_path / "o" / "overrides.md").read_text().startswith("# Why simplan-oracle overrode the decider")
