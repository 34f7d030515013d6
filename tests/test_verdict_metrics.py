"""Online verdict accounting (issue 17): were the predicted endings of the episode right, and did they change
decisions? The act event records the verdict predicted for the executed step; the summary, the metrics and the
report count endings foreseen, false alarms and candidates predicted lost that the decision avoided.

    .venv/bin/pytest -q tests/test_verdict_metrics.py
"""

from __future__ import annotations

import json
from pathlib import Path

from test_oracle import TOY_TASKS, TrapOracle, TrapToy  # pytest puts tests/ on sys.path (rootdir-relative imports)

from simplan.data.episode import PromptSettings
from simplan.envs.base import Action
from simplan.evaluation.metrics import aggregate, records_from_traces
from simplan.evaluation.report import write_report
from simplan.inference.engines.scripted import ScriptedEngine, prompt_action, prompt_actions
from simplan.inference.planning.config import PromptConfig
from simplan.inference.planning.oracle import EnvOracle
from simplan.inference.planning.planner import Planner, PlannerConfig
from simplan.inference.planning.trace import (
    ActEvent,
    CandidateRecord,
    EndEvent,
    EpisodeTrace,
    ImagineEvent,
    append_trace,
    read_traces,
    summarize,
)

LOST = "lost score=0 reward=+0"  # judge.Outcome.label() of a predicted loss, as candidate records carry it


# ---------------------------------------------------------------------------------------------
# A scripted planner run: the simulator's verdicts, right or missing
# ---------------------------------------------------------------------------------------------
class OneLeverToy(TrapToy):
    """TrapToy whose losing lever is only in the first room, so that one decision (the first) can pull it."""

    def valid_actions(self) -> list[str]:
        actions = super().valid_actions()
        return actions if self.pos == 0 else [a for a in actions if a != "pull lever"]


class VerdictSimulator(TrapOracle):
    """A simulator trained with verdicts that predicts every step exactly; `wins=False`: it never says won (only
    the lever's loss), so the real win at the end comes unforeseen."""

    env_class = OneLeverToy

    def __init__(self, task, wins: bool) -> None:
        super().__init__(task)
        self.wins = wins

    def simulate(self, req, text: str) -> str:
        env = OneLeverToy()
        env.reset(self.task)
        for action in [*prompt_actions(text), prompt_action(text)]:
            result = env.step(Action.command(action))
        observation = result.observation.text
        if not result.done or (result.won and not self.wins):
            return observation
        return observation + ("\n[episode over: won]" if result.won else "\n[episode over: lost]")


def run_episode(tmp_path: Path, verdicts: bool, wins: bool = True) -> EpisodeTrace:
    task = TOY_TASKS[0]  # two decisions: take key, go east, go east from the first room; open door from the last
    simulator = VerdictSimulator(task, wins)
    engine = ScriptedEngine(simulator.decide, simulator.simulate, simulator.score).trained_with(
        "simulator", tmp_path / "simulator", PromptSettings(format="step", max_history=50, verdicts=verdicts)
    )
    cfg = PlannerConfig(
        arm="simplan", k=3, horizon=3, adaptive=False, raise_errors=True, prompts=PromptConfig(max_history=50)
    )
    planner = Planner(engine, OneLeverToy(), cfg)
    try:
        trace = planner.run(task).trace
    finally:
        planner.close()
    # What a report reads: the trace as written to and read back from its file.
    append_trace(tmp_path / "traces.jsonl", trace)
    return read_traces(tmp_path / "traces.jsonl")[0]


def test_a_candidate_predicted_lost_is_counted_avoided_and_raises_no_false_alarm(tmp_path):
    trace = run_episode(tmp_path, verdicts=True, wins=False)
    levers = [c for e in trace.of_type("imagine") for c in e.candidates if c.actions[0] == "pull lever"]
    assert len(levers) == 1 and levers[0].outcomes == [LOST] and not levers[0].chosen
    acts = trace.of_type("act")
    assert trace.of_type("end")[0].success and all(a.expected_verdict is None for a in acts)
    s = summarize(trace)
    assert s.verdicts and (s.candidates_predicted_lost, s.lost_candidates_avoided) == (1, 1)
    assert (s.verdict_steps, s.verdict_false_alarms) == (0, 0)
    # The winning step had a prediction, but without its verdict: an ending not foreseen.
    assert acts[-1].done and acts[-1].expectation is not None
    assert (s.ending_steps, s.ending_foreseen) == (1, 0)


def test_the_final_step_predicted_won_and_won_is_foreseen(tmp_path):
    trace = run_episode(tmp_path, verdicts=True, wins=True)
    acts = trace.of_type("act")
    assert [a.expected_verdict for a in acts] == [None] * (len(acts) - 1) + ["won"]
    assert acts[-1].done and acts[-1].won
    s = summarize(trace)
    assert (s.ending_steps, s.ending_foreseen) == (1, 1)
    assert (s.verdict_steps, s.verdict_false_alarms) == (1, 0)
    assert (s.candidates_predicted_lost, s.lost_candidates_avoided) == (1, 1)
    m = aggregate(records_from_traces([trace]))[0]
    assert (m.verdict_episodes, m.verdict_episodes_recorded, m.ending_foreseen, m.ending_steps) == (1, 1, 1, 1)
    assert m.ending_foreseen_share == 1.0 and m.verdict_false_alarms == 0


def test_a_simulator_without_verdicts_counts_none(tmp_path):
    trace = run_episode(tmp_path, verdicts=False)
    assert all(a.expected_verdict is None for a in trace.of_type("act"))
    s = summarize(trace)
    assert not s.verdicts
    assert (s.ending_steps, s.ending_foreseen, s.verdict_steps, s.verdict_false_alarms) == (None,) * 4
    assert (s.candidates_predicted_lost, s.lost_candidates_avoided) == (0, 0)
    m = aggregate(records_from_traces([trace]))[0]
    assert m.verdict_episodes == 0 and m.ending_steps is None and m.ending_foreseen_share is None


def test_the_env_oracles_verdicts_are_accounted_the_same_way():
    task = TOY_TASKS[0]
    decider = VerdictSimulator(task, wins=True)  # its decider and scores; the env oracle predicts
    engine = ScriptedEngine(decider.decide, None, decider.score, adapters=["decider"])
    cfg = PlannerConfig(
        arm="simplan", k=3, horizon=3, adaptive=False, simulator="env", prompts=PromptConfig(max_history=50)
    )
    planner = Planner(engine, OneLeverToy(), cfg, oracle=EnvOracle(OneLeverToy))
    try:
        trace = planner.run(task).trace
    finally:
        planner.close()
    acts = trace.of_type("act")
    assert acts[-1].won and [a.expected_verdict for a in acts] == [None] * (len(acts) - 1) + ["won"]
    s = summarize(trace)
    assert (s.ending_foreseen, s.ending_steps, s.verdict_false_alarms, s.verdict_steps) == (1, 1, 0, 1)
    assert (s.lost_candidates_avoided, s.candidates_predicted_lost) == (1, 1)


# ---------------------------------------------------------------------------------------------
# Hand-made traces
# ---------------------------------------------------------------------------------------------
def candidate(actions: list[str], outcomes: list[str | None] | None, chosen: bool = False) -> CandidateRecord:
    return CandidateRecord(actions=actions, predicted=["..."] * len(actions), outcomes=outcomes, chosen=chosen)


def hand_trace(eid: str, arm: str, decisions: list[list[CandidateRecord]], acts: list[dict]) -> EpisodeTrace:
    t = EpisodeTrace.start(eid, "toy", {"task_id": eid.split("/")[1], "family": "x", "fold": "dev"}, arm)
    for candidates in decisions:
        t.add(ImagineEvent(candidates=candidates, horizon=1 if candidates else 0))
    for i, a in enumerate(acts, start=1):
        t.add(ActEvent(**{"action": "look", "observation": f"o{i}", **a}), step=i)
    won = bool(acts and acts[-1].get("won"))
    t.add(EndEvent(status="success" if won else "failed", success=won, steps=len(acts)))
    return t


def false_alarm_trace() -> EpisodeTrace:
    """Two decisions: the first avoids a lever predicted lost (proposed twice: one first action), the second takes
    it; the step predicted lost goes on (a false alarm), and the last, also predicted lost, wins (another)."""
    first = [
        candidate(["pull lever"], [LOST]),
        candidate(["pull lever", "look"], [LOST]),
        candidate(["look"], ["on score=0 reward=+0"], chosen=True),
    ]
    second = [candidate(["pull lever"], [LOST], chosen=True), candidate(["look"], [None])]
    acts = [
        {"expectation": "o1"},
        {"action": "pull lever", "expectation": "o2", "expected_verdict": "lost"},
        {"expectation": "o3", "expected_verdict": "lost", "done": True, "won": True},
    ]
    return hand_trace("toy/a/simplan/0", "simplan", [first, second], acts)


def foreseen_trace() -> EpisodeTrace:
    decision = [candidate(["look", "open door"], [None, "won score=1 reward=+1"], chosen=True)]
    acts = [{"expectation": "o1"}, {"expectation": "o2", "expected_verdict": "won", "done": True, "won": True}]
    return hand_trace("toy/b/simplan/0", "simplan", [decision], acts)


def reactive_trace() -> EpisodeTrace:
    return hand_trace("toy/a/reactive/0", "reactive", [[], []], [{}, {"done": True}])


def test_false_alarms_and_a_lost_candidate_taken_from_a_hand_made_trace():
    s = summarize(false_alarm_trace())
    assert s.verdicts
    assert (s.verdict_steps, s.verdict_false_alarms) == (2, 2)  # went on; won where lost was predicted
    assert (s.ending_steps, s.ending_foreseen) == (1, 0)
    assert (s.candidates_predicted_lost, s.lost_candidates_avoided) == (2, 1)  # one per decision; the second took it
    r = summarize(reactive_trace())
    assert not r.verdicts and r.ending_steps is None and r.candidates_predicted_lost == 0


def test_old_traces_without_expected_verdicts_load_and_count_only_candidates(tmp_path):
    lines = []
    for d in false_alarm_trace().to_dicts():
        d.pop("expected_verdict", None)  # act events before the field
        if d["type"] == "start":
            d["version"] = 1
        lines.append(json.dumps(d))
    path = tmp_path / "traces.jsonl"
    path.write_text("\n".join(lines) + "\n")
    trace = read_traces(path)[0]
    assert all(a.expected_verdict is None for a in trace.of_type("act"))
    s = summarize(trace)
    assert s.verdicts and (s.candidates_predicted_lost, s.lost_candidates_avoided) == (2, 1)
    # Unknown, not zero: the acts did not record what was predicted for them.
    assert (s.ending_steps, s.ending_foreseen, s.verdict_steps, s.verdict_false_alarms) == (None,) * 4
    m = aggregate(records_from_traces([trace, foreseen_trace()]))[0]
    assert (m.verdict_episodes, m.verdict_episodes_recorded) == (2, 1)
    assert (m.ending_foreseen, m.ending_steps, m.verdict_false_alarms, m.verdict_steps) == (1, 1, 0, 1)
    assert (m.lost_candidates_avoided, m.candidates_predicted_lost) == (1, 2)


def test_the_report_shows_endings_foreseen_only_for_runs_with_verdicts(tmp_path):
    run = tmp_path / "verdicts"
    for t in (reactive_trace(), false_alarm_trace(), foreseen_trace()):
        append_trace(run / "traces.jsonl", t)
    paths = write_report([run], tmp_path / "report")
    main = paths["md"].read_text().split("## Plots")[0]
    table = main.split("### Episode endings foreseen")[1].split("###")[0]
    # simplan: endings 1 foreseen of 2; false alarms 2 of 3 steps predicted to end; lost candidates 1 avoided of 2.
    assert "| verdicts | simplan | 2/2 | 1/2 [50.0%] | 2/3 [66.7%] | 1/2 [50.0%] |" in table
    assert "| verdicts | reactive | 0/1 | - | - | - |" in table
    simplan = next(a for a in json.loads(paths["json"].read_text())["runs"][0]["arms"] if a["arm"] == "simplan")
    counters = ("ending_foreseen", "ending_steps", "verdict_false_alarms", "verdict_steps")
    assert [simplan[k] for k in counters] == [1, 2, 2, 3]
    assert (simplan["lost_candidates_avoided"], simplan["candidates_predicted_lost"]) == (1, 2)
    assert "Episode endings foreseen" in paths["html"].read_text()

    plain = tmp_path / "plain"
    append_trace(plain / "traces.jsonl", reactive_trace())
    assert "Episode endings foreseen" not in write_report([plain], tmp_path / "plain-report")["md"].read_text()
