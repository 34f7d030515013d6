"""The simulator's verdict line (issue 17): a step that ended the episode is learned as its observation then
`[episode over: won|lost]`; the planner splits it off a prediction and judges it as the env oracle's verdict;
eval-model scores it.

    .venv/bin/pytest -q tests/test_verdicts.py
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from test_oracle import TOY_TASKS, TrapOracle, TrapToy  # pytest puts tests/ on sys.path (rootdir-relative imports)

from simplan.core.io import iter_jsonl, write_jsonl
from simplan.data.build import BuildConfig, build
from simplan.data.build_rows import step_rows
from simplan.data.collect import CollectConfig, collect
from simplan.data.episode import SETTINGS_FILE, EpisodeState, PromptSettings, renderer_for, write_settings
from simplan.data.format import observation_completion, split_verdict
from simplan.data.trajectory import Trajectory
from simplan.evaluation.offline import EvalModelConfig, dataset_verdicts, evaluate, simulator_metrics
from simplan.inference.engines.scripted import ScriptedEngine, prompt_action
from simplan.inference.planning.config import PromptConfig
from simplan.inference.planning.planner import Planner, PlannerConfig
from simplan.models.tiny import _tokenizer

LOST = "[episode over: lost]"
WON = "[episode over: won]"


@pytest.fixture(scope="module")
def tok():
    return _tokenizer()


@pytest.fixture(scope="module")
def episodes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Trajectory]:
    """A won toy episode, the same episode lost on its last step, and one cut by a step cap (not done)."""
    out = tmp_path_factory.mktemp("collect") / "toy.jsonl"
    collect(CollectConfig(env="toy", policies=["expert"], limit=1, branches=0, out=str(out), progress=False))
    won = Trajectory.from_dict(json.loads(next(iter_jsonl(out))[1]))
    assert won.steps[-1].done and won.steps[-1].won and not any(s.done for s in won.steps[:-1])
    lost_step = replace(won.steps[-1], won=False)
    lost = replace(won, id=won.id + "-lost", steps=[*won.steps[:-1], lost_step], success=False)
    cut_step = replace(won.steps[-1], done=False, won=False)
    cut = replace(won, id=won.id + "-cut", steps=[*won.steps[:-1], cut_step], success=False, status="truncated")
    return {"won": won, "lost": lost, "cut": cut}


def _simulator_replies(traj: Trajectory, settings: PromptSettings, tok) -> dict[int, str]:
    """Step -> the simulator's trained reply, over every window of the episode."""
    state = EpisodeState.from_trajectory(traj)
    replies = {}
    for ex in renderer_for(settings, tok).examples(state, "simulator"):
        for m, s, w in zip(ex.messages, ex.steps, ex.weights):
            if w:
                replies[s] = m["content"]
    return replies


# ---------------------------------------------------------------------------------------------
# The marker: one format, parsed strictly
# ---------------------------------------------------------------------------------------------
def test_split_verdict_reads_only_a_final_marker_line():
    assert observation_completion(" You open the door. ", "won") == "You open the door.\n" + WON
    assert split_verdict("You open the door.\n" + WON) == ("You open the door.", "won")
    assert split_verdict("The cheese burns.\n  " + LOST + "  \n") == ("The cheese burns.", "lost")
    assert split_verdict(LOST) == ("", "lost")
    # Anywhere but as the final line it is text, returned as it is.
    for text in (
        f"{LOST}\nYou are in the kitchen.",
        f"The cheese burns. {LOST}",
        "You open the door.",
        "You open the door.\n[episode over: draw]",
        "You open the door.\n[Episode over: lost]",
    ):
        assert split_verdict(text) == (text, None), text
    with pytest.raises(ValueError, match="verdict"):
        observation_completion("x", "draw")


def test_old_settings_without_the_key_read_no_verdicts(tmp_path):
    saved = PromptSettings(budget=512).to_dict()
    del saved["verdicts"]
    (tmp_path / SETTINGS_FILE).write_text(json.dumps(saved))
    assert PromptSettings.from_dict(saved).verdicts is False
    assert not dataset_verdicts(EvalModelConfig(role="simulator", dataset=str(tmp_path)))
    write_settings(tmp_path, PromptSettings(budget=512, verdicts=True))
    assert dataset_verdicts(EvalModelConfig(role="simulator", dataset=str(tmp_path)))
    with pytest.raises(ValueError, match="verdicts"):
        PromptSettings(verdicts="yes")  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------
# Data: both formats
# ---------------------------------------------------------------------------------------------
def test_the_ending_step_of_an_episode_is_learned_with_its_verdict(episodes, tok):
    on, off = PromptSettings(budget=200, reserve=16, verdicts=True), PromptSettings(budget=200, reserve=16)
    for name, marker in (("won", WON), ("lost", LOST), ("cut", None)):
        traj = episodes[name]
        last = len(traj.steps) - 1
        replies = _simulator_replies(traj, on, tok)
        assert sorted(replies) == list(range(len(traj.steps)))  # every step trained, across windows
        for t, reply in replies.items():
            expected = traj.steps[t].next_observation.strip()
            assert reply == (expected + "\n" + marker if t == last and marker else expected), (name, t)
        # Without the setting nothing carries a marker; the observations are the same.
        plain = _simulator_replies(traj, off, tok)
        assert plain == {t: traj.steps[t].next_observation.strip() for t in range(len(traj.steps))}
        assert not any("[episode over" in r for r in plain.values())
    # A decider's conversation never shows the final step's reply: no marker anywhere in it.
    state = EpisodeState.from_trajectory(episodes["lost"])
    decider = renderer_for(on, tok).examples(state, "decider")
    assert not any("[episode over" in m["content"] for ex in decider for m in ex.messages)


@pytest.mark.parametrize("fmt", ["conversation", "step"])
def test_build_writes_the_verdict_into_simulator_targets_and_the_settings(episodes, tok, tmp_path, fmt):
    inputs = tmp_path / "episodes.jsonl"
    write_jsonl(inputs, (t.to_dict() for t in episodes.values()))
    targets = {}
    for verdicts in (True, False):
        out = tmp_path / f"sim-{verdicts}"
        cfg = BuildConfig(
            role="simulator", format=fmt, inputs=[str(inputs)], out=str(out), verdicts=verdicts, progress=False
        )
        build(cfg, tokenizer=tok)
        assert json.loads((out / SETTINGS_FILE).read_text())["verdicts"] is verdicts
        from datasets import load_from_disk

        rows = [r for split in load_from_disk(str(out / "dataset")).values() for row in split for r in step_rows(row)]
        targets[verdicts] = {(r["trajectory_id"], r["step"]): r["completion"] for r in rows}
    last = len(episodes["won"].steps) - 1
    with_verdicts = targets[True]
    assert sum(text.endswith(WON) for text in with_verdicts.values()) == 1
    assert sum(text.endswith(LOST) for text in with_verdicts.values()) == 1
    for name, marker in (("won", WON), ("lost", LOST)):
        assert with_verdicts[(episodes[name].id, last)].endswith("\n" + marker)
    cut = with_verdicts.get((episodes["cut"].id, last))  # dedupe may keep the won episode's equal context
    assert cut is None or "[episode over" not in cut
    assert not any("[episode over" in text for text in targets[False].values())
    # The decider's data and settings do not change.
    out = tmp_path / "decider"
    build(BuildConfig(role="decider", format=fmt, inputs=[str(inputs)], out=str(out), progress=False), tok)
    assert json.loads((out / SETTINGS_FILE).read_text())["verdicts"] is False
    assert not any("[episode over" in f.read_text() for f in out.glob("*.jsonl"))


# ---------------------------------------------------------------------------------------------
# Planner: the learned simulator's verdict is judged like the env oracle's
# ---------------------------------------------------------------------------------------------
class VerdictOracle(TrapOracle):
    """TrapOracle whose texts-only simulator, trained with verdicts, says the lever ends the episode unwon."""

    def simulate(self, req, text: str) -> str:
        observation = super().simulate(req, text)
        return observation + "\n" + LOST if prompt_action(text) == "pull lever" else observation


def _run_trap(tmp_path: Path, verdicts: bool):
    task = TOY_TASKS[1]
    oracle = VerdictOracle(task)
    engine = ScriptedEngine(oracle.decide, oracle.simulate, oracle.score).trained_with(
        "simulator", tmp_path / "simulator", PromptSettings(format="step", max_history=50, verdicts=verdicts)
    )
    cfg = PlannerConfig(
        arm="simplan", k=3, horizon=2, adaptive=False, raise_errors=True, prompts=PromptConfig(max_history=50)
    )
    planner = Planner(engine, TrapToy(), cfg)
    try:
        return planner.run(task).trace
    finally:
        planner.close()


def test_a_predicted_loss_makes_the_planner_avoid_the_action_a_texts_only_judge_takes(tmp_path):
    trace = _run_trap(tmp_path / "on", verdicts=True)
    candidates = [c for e in trace.of_type("imagine") for c in e.candidates]
    levers = [c for c in candidates if c.actions[0] == "pull lever"]
    assert levers and all(not c.chosen and c.parts["lost"] == -10.0 for c in levers)
    assert all(c.outcomes == ["lost score=0 reward=+0"] and len(c.actions) == 1 for c in levers)
    # The marker never reaches a predicted text, an expectation or a committed plan.
    assert not any("[episode over" in p for c in candidates for p in c.predicted)
    assert not any("[episode over" in (item.expectation or "") for e in trace.of_type("commit") for item in e.plan)
    assert "pull lever" not in [e.action for e in trace.of_type("act")]
    assert trace.of_type("end")[0].success

    # The same simulator under settings without verdicts: its text is left alone, no verdict is read.
    off = _run_trap(tmp_path / "off", verdicts=False)
    levers = [c for e in off.of_type("imagine") for c in e.candidates if c.actions[0] == "pull lever"]
    assert levers and all(c.outcomes is None and "lost" not in c.parts for c in levers)
    assert all(c.predicted[0].endswith("\n" + LOST) for c in levers)
    assert [e.action for e in off.of_type("act")] == ["pull lever"]  # the texts read like progress
    assert not off.of_type("end")[0].success


# ---------------------------------------------------------------------------------------------
# eval-model
# ---------------------------------------------------------------------------------------------
def test_eval_model_reports_verdict_recall_and_precision():
    rows = [
        {"completion": "You win.\n" + WON, "error": False},
        {"completion": "The cheese burns.\n" + LOST, "error": False},
        {"completion": "You slice the carrot.\n" + LOST, "error": False},
        {"completion": "You are in the kitchen.", "error": False},
        {"completion": "You open the fridge.", "error": False},
    ]
    preds = [
        "You win.\n" + WON,  # right
        "The cheese burns.",  # missed
        "You slice the carrot.\n" + WON,  # wrong verdict: counts in neither
        "You are in the kitchen.\n" + LOST,  # a false alarm
        f"You open the fridge. {LOST}",  # not on its own line: no verdict
    ]
    m = simulator_metrics(preds, None, rows, set(), verdicts=True)
    assert m["verdict_rows"] == 3
    assert m["verdict_recall"] == pytest.approx(1 / 3)
    assert m["verdict_precision"] == pytest.approx(1 / 3)
    assert m["exact"] == pytest.approx(1 / 5)  # the marker is part of the text exact compares
    assert "verdict_recall" not in simulator_metrics(preds, None, rows, set())
    none = simulator_metrics(["x"], None, [{"completion": "x", "error": False}], set(), verdicts=True)
    assert none["verdict_recall"] is None and none["verdict_precision"] is None and none["verdict_rows"] == 0


def test_eval_model_on_a_built_dataset_prints_the_verdict_metrics(episodes, tok, tmp_path):
    inputs = tmp_path / "episodes.jsonl"
    write_jsonl(inputs, (t.to_dict() for t in episodes.values()))
    data = tmp_path / "sim"
    build(BuildConfig(role="simulator", inputs=[str(inputs)], out=str(data), verdicts=True, progress=False), tok)
    fold = episodes["won"].task.fold
    # Saved outputs: every gold reply, with the verdict dropped where the episode was lost.
    from datasets import load_from_disk

    rows = [r for row in load_from_disk(str(data / "dataset"))[fold] for r in step_rows(row)]
    preds = [split_verdict(r["completion"])[0] if r["completion"].endswith(LOST) else r["completion"] for r in rows]
    predictions = tmp_path / "predictions.jsonl"
    write_jsonl(predictions, ({"gold": r["completion"], "adapter": p} for r, p in zip(rows, preds)))
    report = evaluate(
        EvalModelConfig(role="simulator", dataset=str(data), fold=fold, predictions=str(predictions), limit=0)
    )
    adapter = report["results"]["adapter"]
    assert adapter["verdict_rows"] == 2 and adapter["verdict_recall"] == 0.5 and adapter["verdict_precision"] == 1.0
    table = (Path(report["out"]) / "metrics.md").read_text()
    assert "verdict_recall" in table and "50.0%" in table
