"""bench/stall_replay.py replays the stall budget on recorded traces: it must end each episode where the planner
with that budget ends it, and count what it saves and what it costs.

    .venv/bin/pytest -q tests/test_bench_stall_replay.py
"""

from __future__ import annotations

import pytest

from simplan.envs.toy import ToyEnv
from simplan.inference.engines.scripted import ScriptedEngine
from simplan.inference.planning.planner import Planner, PlannerConfig
from simplan.inference.planning.router import BudgetConfig
from simplan.inference.planning.trace import append_trace, read_traces

EXPERT = ["go east"] * 3 + ["take key", "go east", "open door"]  # corridor-101's winning path
SCRIPTS = {
    "pacing": ["go east", "go west"] * 12,  # new once, then nothing new
    "slow": ["go east", "look", "look", "look", "go east", "look", "look", "look"] * 3,  # 3 stalled steps at a time
    "expert": EXPERT,
    "dawdler": ["go east", "look", "look", "look", "look", "go east", "go east", "take key", "go east", "open door"],
}


@pytest.fixture
def bench(bench_script):
    return bench_script("stall_replay")


def run(actions: list[str], stall_steps: int):
    calls = iter(range(1000))

    def score(req, text):  # noqa: ANN001, ANN202 - the next action of the script scores best
        want = actions[min(next(calls), len(actions) - 1)]
        return [0.0 if c == want else -10.0 for c in req.candidates]

    engine = ScriptedEngine(lambda req, text: "", lambda req, text: "", score)
    cfg = PlannerConfig(arm="reactive", raise_errors=True, budgets=BudgetConfig(max_steps=20, stall_steps=stall_steps))
    task = next(t for t in ToyEnv().tasks("dev") if t.params["seed"] == 101)
    return Planner(engine, ToyEnv(), cfg).run(task)


@pytest.mark.parametrize("name", sorted(SCRIPTS))
@pytest.mark.parametrize("stall_steps", [2, 3, 4])
def test_the_replay_ends_an_episode_where_the_planner_does(bench, name, stall_steps):
    recorded = run(SCRIPTS[name], stall_steps=0)
    live = run(SCRIPTS[name], stall_steps=stall_steps)
    at = bench.ended_at(recorded.trace, stall_steps)
    if live.summary.status == "budget_stall":
        assert at == live.summary.steps
        assert recorded.trace.of_type("act")[at - 1].step == at
    else:
        assert at is None and live.summary.status == recorded.summary.status


def test_the_replay_counts_winners_ended_and_tokens_saved_and_fits_twice_the_safe_value(bench, tmp_path):
    def replayed(name: str, stall_steps: int = 0) -> dict:
        path = tmp_path / f"{name}-{stall_steps}" / "traces.jsonl"
        append_trace(path, run(SCRIPTS[name], stall_steps=stall_steps).trace)
        return bench.replay(read_traces(path), values=(2, 4, 6))["reactive"]

    pacing, dawdler = replayed("pacing"), replayed("dawdler")
    assert pacing["won"] == 0 and dawdler["won"] == 1  # pacing reaches the step cap; the dawdler wins
    assert dawdler["values"][4]["winners_ended"] == 1  # it looked four times in a row
    assert dawdler["values"][6] == {"winners_ended": 0, "losers_ended_early": 0, "tokens_saved": 0}
    early = pacing["values"][2]
    assert early["losers_ended_early"] == 1 and 0 < early["tokens_saved"] < pacing["tokens"]
    assert bench.fitted([{"reactive": pacing}, {"reactive": dawdler}], values=(2, 4, 6)) == 12
    assert bench.fitted([{"reactive": dawdler}], values=(2, 4)) is None
    # a run that had a stall budget is replayed for smaller values only
    assert list(replayed("pacing", stall_steps=4)["values"]) == [2]


def test_an_episode_without_its_end_event_is_left_out_and_counted(bench):
    """A run interrupted while it played leaves traces without an end event: the replay skips them, says how many."""
    whole = run(SCRIPTS["pacing"], stall_steps=0).trace
    cut = run(SCRIPTS["expert"], stall_steps=0).trace
    cut.events = [e for e in cut.events if e.type != "end"]
    r = bench.replay([whole, cut], values=(2,))["reactive"]
    assert r["episodes"] == 1 and r["incomplete"] == 1 and r["won"] == 0
    assert "(1 incomplete, left out)" in "\n".join(bench.table("run", {"reactive": r}))
