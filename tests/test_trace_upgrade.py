"""Old trace versions read as today's: `upgrade` is the one place that knows the trace format's history.

A version-1 and a version-2 trace of one toy episode (its start event's planner config in the flat keys of
before the sections; the version-1 acts without `expected_verdict`) read through every trace reader (trace
reading, the summary, the metrics, the report, the simulator's accuracy, the harvest, the eval's resume)
give what the same episode written today gives. `upgrade` is idempotent, and a newer version is refused.

    .venv/bin/pytest -q tests/test_trace_upgrade.py
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from simplan.envs.toy import ToyEnv
from simplan.evaluation.metrics import aggregate, load_run
from simplan.evaluation.report import write_report
from simplan.evaluation.resume import RESULTS, TRACES, finished_traces, sync_results
from simplan.inference.planning.sim_accuracy import accuracy_from_traces
from simplan.inference.planning.trace import EpisodeTrace, append_trace, read_traces, summarize
from simplan.inference.planning.trace_events import (
    TRACE_VERSION,
    ActEvent,
    CandidateRecord,
    CommitEvent,
    EndEvent,
    ImagineEvent,
    PlanItem,
    TraceVersionError,
    upgrade,
)
from simplan.workflows.harvest import TracesConfig, harvest

FLAT = {"w_error": -3, "max_steps": 7}  # a planner config in the flat keys of versions 1 and 2
NESTED = {"judge": {"error": -3}, "budgets": {"max_steps": 7}}  # the same in today's sections
WON = "won score=1 reward=+0.5"  # judge.Outcome.label() of a predicted win
LOST = "lost score=0 reward=+0"
VERDICT_COUNTS = ("ending_steps", "ending_foreseen", "verdict_steps", "verdict_false_alarms")


def today_lines(verdicts: bool) -> list[dict[str, Any]]:
    """A won toy episode as the planner writes it today: each real step from the env, predicted before it was
    taken (the third prediction wrong). With `verdicts`, each decision also predicted a losing `look`, and the
    last step was predicted to win (its act records the expected verdict)."""
    env = ToyEnv()
    task = env.tasks("dev")[0]
    obs = env.reset(task)
    eid = f"toy-dev/toy/{task.task_id}/simplan/0"
    trace = EpisodeTrace.start(eid, "toy", task.to_dict(), "simplan", NESTED, {"max_steps": 7}, obs.goal, obs.text)
    plan = env.expert_plan()
    for step, action in enumerate(plan):
        real = env.step(action)
        last = step == len(plan) - 1
        expectation = "You are in room 2 of 4." if step == 2 else real.observation.text
        verdict = "won" if verdicts and last else None
        chosen = CandidateRecord(0, [action.text], [expectation], total=1.0, chosen=True)
        other = CandidateRecord(1, ["look"], ["You are in room 1 of 4."], total=-1.0)
        if verdicts:
            chosen.outcomes, other.outcomes = [WON if last else None], [LOST]
        trace.add(
            ImagineEvent(
                candidates=[chosen, other],
                horizon=1,
                model_calls=2,
                prompt_tokens=100,
                cached_prompt_tokens=40,
                decision_prompt_tokens=60,
                decision_cached_prompt_tokens=20,
                candidate_tokens=12,
                decision_candidate_tokens=8,
                completion_tokens=5,
            ),
            step=step,
        )
        trace.add(CommitEvent(plan=[PlanItem(action.text, expectation)], total=1.0), step=step)
        act = ActEvent(
            action=action.text,
            action_key=action.key(),
            observation=real.observation.text,
            expectation=expectation,
            expected_verdict=verdict,
            match=1.0 if expectation == real.observation.text else 0.5,
            reward=real.reward,
            score=real.score,
            done=real.done,
            won=real.won,
            model_calls=2,
            prompt_tokens=100,
            cached_prompt_tokens=40,
            completion_tokens=5,
        )
        trace.add(act, step=step + 1)
    n = len(plan)
    end = EndEvent(
        status="success",
        success=True,
        score=1.0,
        steps=n,
        model_calls=2 * n,
        prompt_tokens=100 * n,
        cached_prompt_tokens=40 * n,
        completion_tokens=5 * n,
        wall_seconds=2.0,
        planning_seconds=1.0,
    )
    trace.add(end, step=n)
    return json.loads(json.dumps(trace.to_dicts()))


def as_version(lines: list[dict[str, Any]], version: int) -> list[dict[str, Any]]:
    """Today's lines as a writer of `version` wrote them: the start event with its version and the planner config
    in flat keys, without `act_verdicts` (today's writer adds it); in version 1, acts without `expected_verdict`;
    before version 4, acts without `notes`; before version 5, ends without `unmet` and commits without `suboptimal`;
    before version 6, ends without `reason`, `best_score` and `best_step`; before version 8, ends without `belief`."""
    old = copy.deepcopy(lines)
    for line in old:
        if line["type"] == "start":
            line["version"], line["config"] = version, dict(FLAT)
            del line["act_verdicts"]
        if line["type"] == "act" and version < 2:
            del line["expected_verdict"]
        if line["type"] == "act" and version < 4:
            assert line["notes"] == []  # (today's episode writes notes only where a step failed or a pivot fired)
            del line["notes"]
        if line["type"] == "commit" and version < 5:
            assert line["suboptimal"] == ""
            del line["suboptimal"]
        if line["type"] == "end" and version < 5:
            assert line["unmet"] is None  # (no sub-goals in these episodes)
            del line["unmet"]
        if line["type"] == "end" and version < 6:
            assert line["reason"] is None and line["best_score"] is None  # (written by hand, like a v5 writer)
            del line["reason"], line["best_score"], line["best_step"]
        if line["type"] == "end" and version < 8:
            assert line["belief"] is None  # (written by hand: no env facts)
            del line["belief"]
    return old


def write_run(folder: Path, lines: list[dict[str, Any]]) -> Path:
    folder.mkdir(parents=True)
    (folder / TRACES).write_text("".join(json.dumps(line) + "\n" for line in lines))
    return folder


def readers(run: Path) -> dict[str, Any]:
    """What every trace reader makes of the run folder's traces.jsonl."""
    traces = read_traces(run / TRACES)
    records = load_run(run)
    report = json.loads(write_report([run], run.parent / f"{run.name}-report")["json"].read_text())["runs"][0]
    done, notes = finished_traces(run)  # the eval's resume
    assert notes == [] and sync_results(run, done) == 1
    out = run.parent / f"{run.name}-harvest.jsonl"
    assert harvest(TracesConfig(runs=[str(run)], out=str(out))).written == 1
    trajectories = [json.loads(line) for line in out.read_text().splitlines()]
    for t in trajectories:
        t["meta"].pop("run")  # the folder the trace came from
    return {
        "events": [e.to_dict() for t in traces for e in t.events],
        "summaries": [summarize(t).to_dict() for t in traces],
        "metrics": [m.to_dict() for m in aggregate(records) + aggregate(records, by_family=True)],
        "report": {"arms": report["arms"], "families": report["families"]},
        "sim_accuracy": accuracy_from_traces(traces).to_dict(),
        "results": [json.loads(line) for line in (run / RESULTS).read_text().splitlines()],
        "trajectories": trajectories,
    }


@pytest.mark.parametrize("verdicts", [True, False])
def test_a_version_2_trace_reads_as_the_same_trace_written_today(tmp_path: Path, verdicts: bool) -> None:
    today = today_lines(verdicts)
    now = readers(write_run(tmp_path / "today", today))
    assert now["summaries"][0]["sim_accuracy"] == pytest.approx(4 / 5)
    assert now["summaries"][0]["verdicts"] is verdicts
    assert (now["summaries"][0]["ending_foreseen"] == 1) is verdicts
    old = readers(write_run(tmp_path / "v2", as_version(today, 2)))
    assert old == now
    (start,) = [e for e in old["events"] if e["type"] == "start"]
    assert start["config"] == NESTED and start["version"] == TRACE_VERSION and start["act_verdicts"]


def test_a_version_1_trace_reads_as_today_with_its_acts_verdicts_unknown(tmp_path: Path) -> None:
    today = today_lines(verdicts=True)
    now = readers(write_run(tmp_path / "today", today))
    old = readers(write_run(tmp_path / "v1", as_version(today, 1)))
    for key in ("sim_accuracy", "trajectories"):
        assert old[key] == now[key]
    # Unknown, not zero: the acts did not record the verdict predicted for them. Everything else is the same.
    (summary,) = old["summaries"]
    assert [summary[k] for k in VERDICT_COUNTS] == [None] * 4
    assert summary == {**now["summaries"][0], **dict.fromkeys(VERDICT_COUNTS)}
    assert old["results"] == old["summaries"]
    unknown = {**dict.fromkeys(VERDICT_COUNTS), "ending_foreseen_share": None, "verdict_episodes_recorded": 0}
    assert old["metrics"] == [{**m, **unknown} for m in now["metrics"]]
    for part in ("arms", "families"):
        assert old["report"][part] == [{**m, **unknown} for m in now["report"][part]]
    assert [m["lost_candidates_avoided"] for m in old["metrics"]] == [5, 5]  # the candidates' verdicts count
    # The events: the start says so, and no act has an expected verdict; the rest is today's.
    acts = [e for e in old["events"] if e["type"] == "act"]
    assert [a["expected_verdict"] for a in acts] == [None] * len(acts)
    (start,) = [e for e in old["events"] if e["type"] == "start"]
    assert start["act_verdicts"] is False and start["config"] == NESTED and start["version"] == TRACE_VERSION


def test_a_version_1_trace_without_verdicts_reads_as_today(tmp_path: Path) -> None:
    today = today_lines(verdicts=False)
    now = readers(write_run(tmp_path / "today", today))
    old = readers(write_run(tmp_path / "v1", as_version(today, 1)))
    for start in (e for e in old["events"] if e["type"] == "start"):
        assert start.pop("act_verdicts") is False
    for start in (e for e in now["events"] if e["type"] == "start"):
        assert start.pop("act_verdicts") is True
    assert old == now


@pytest.mark.parametrize("version", [1, 2, 3, TRACE_VERSION])
def test_upgrade_is_idempotent_and_leaves_its_argument_alone(version: int) -> None:
    today = today_lines(verdicts=True)
    lines = today if version == TRACE_VERSION else as_version(today, version)
    for line in lines:
        before = copy.deepcopy(line)
        once = upgrade(line)
        assert line == before
        assert upgrade(once) == once
    assert [upgrade(line) for line in today] == today  # a line written today is already in today's form


def test_upgrade_fills_what_an_old_line_lacks() -> None:
    start = upgrade({"type": "start", "episode_id": "e", "config": {"w_error": -3, "gone": 1}})  # no version: 1
    assert (start["version"], start["act_verdicts"], start["run_id"]) == (TRACE_VERSION, False, "")
    assert start["config"] == {"gone": 1, "judge": {"error": -3}}  # a key PlannerConfig no longer has is kept
    imagine = upgrade({"type": "imagine", "candidates": [{"actions": ["look"]}]})
    assert imagine["decision_prompt_tokens"] is None and imagine["candidates"][0]["outcomes"] is None
    assert upgrade({"type": "act", "action": "look"})["expected_verdict"] is None
    assert upgrade({"type": "what"}) == {"type": "what"}  # unknown: left to event_from_dict to refuse


def test_a_newer_trace_version_is_refused_with_what_to_do(tmp_path: Path) -> None:
    lines = today_lines(verdicts=False)
    lines[0]["version"] = TRACE_VERSION + 1
    run = write_run(tmp_path / "future", lines)
    path = run / TRACES
    with pytest.raises(TraceVersionError) as refused:
        read_traces(path)
    message = str(refused.value)
    assert message.startswith(f"{path}: trace of episode {lines[0]['episode_id']!r}: ")
    assert f"trace version {TRACE_VERSION + 1} is newer than this simplan reads (1 to {TRACE_VERSION})" in message
    assert message.endswith("upgrade simplan to read it")
    with pytest.raises(TraceVersionError, match="upgrade simplan"):
        load_run(run)  # the metrics and the report
    with pytest.raises(TraceVersionError, match=f"^{path}: "):
        finished_traces(run)  # the eval's resume
    with pytest.raises(TraceVersionError, match="'x' is not a trace version"):
        upgrade({"type": "start", "version": "x"})


def test_a_trace_written_and_read_today_is_unchanged(tmp_path: Path) -> None:
    lines = today_lines(verdicts=True)
    (trace,) = read_traces(write_run(tmp_path / "run", lines) / TRACES)
    append_trace(tmp_path / "again.jsonl", trace)
    again = [json.loads(line) for line in (tmp_path / "again.jsonl").read_text().splitlines()]
    assert again == lines
