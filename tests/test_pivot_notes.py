"""Pivot notes (issue 32 item 3): the planner notes every pivot in the episode state, collection records the note of
a failed step as every arm writes it, harvesting keeps the traced notes, and a decider built with `notes` reads
the same bytes in training and in the planner's prompts.

.venv/bin/pytest -q tests/test_pivot_notes.py
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from simplan.core.io import iter_jsonl
from simplan.data.build import BuildConfig
from simplan.data.collect import CollectConfig, collect
from simplan.data.episode import EpisodeState, PromptSettings, renderer_for
from simplan.data.format import SECTION_NOTE, failed_step_note, pivot_note
from simplan.data.trajectory import Trajectory
from simplan.envs.actions import render_action
from simplan.envs.base import Observation
from simplan.envs.toy import ToyEnv
from simplan.inference.engines.scripted import ScriptedEngine, toy_expert_action
from simplan.inference.planning.config import PlannerConfig
from simplan.inference.planning.planner import Planner
from simplan.inference.planning.prompts import PlannerPrompts
from simplan.models.tiny import _tokenizer
from simplan.workflows.harvest import replay, step_sources

NOTES = PromptSettings(budget=4096, reserve=16, notes=True)
WRONG = "You are in a strange dark room."


@pytest.fixture(scope="module")
def tok():
    return _tokenizer()


class NoListToy(ToyEnv):
    """The toy env without valid-action lists, so a replayed decider may play an action outside them."""

    def _observe(self, text: str, error: bool) -> Observation:
        return Observation(text=text, goal=self.goal, valid_actions=None, error=error)


def _noisy_toy(tmp_path: Path) -> list[Trajectory]:
    out = tmp_path / "toy.jsonl"
    collect(
        CollectConfig(
            env="toy", policies=["noisy_expert"], attempts=3, limit=6, branches=0, out=str(out), progress=False
        )
    )
    return [Trajectory.from_dict(json.loads(line)) for _, line in iter_jsonl(out)]


def _training_prefixes(traj: Trajectory, settings: PromptSettings, tok) -> list[list[dict]]:
    prefixes = {}
    for ex in renderer_for(settings, tok).examples(EpisodeState.from_trajectory(traj), "decider"):
        for i, (m, s, w) in enumerate(zip(ex.messages, ex.steps, ex.weights)):
            if m["role"] == "assistant" and w:
                prefixes[s] = ex.messages[:i]
    return [prefixes[t] for t in range(len(traj.steps))]


def _planner(engine, cfg: PlannerConfig, tok, env=None) -> Planner:
    planner = Planner(engine, env or ToyEnv(), cfg, tokenizer=tok)
    planner.prompts = PlannerPrompts(NOTES, NOTES, tok)
    return planner


def test_a_note_says_the_rules_what_was_expected_and_the_ban():
    note = pivot_note(["expectation_mismatch", "repeated_action"], "go east", expected="x " * 100, banned=True)
    assert note.startswith("pivot expectation_mismatch+repeated_action at go east: expected 'x x x")
    assert note.endswith("...' (banned here)") and "x " * 40 not in note  # cut to 80 characters
    assert pivot_note(["not_valid_now"], "go north") == "pivot not_valid_now at go north"
    assert failed_step_note("open door", "permanent") == "pivot error_observation at open door (failure: permanent)"


def test_collection_notes_each_failed_step_as_the_planner_does(tmp_path):
    trajs = _noisy_toy(tmp_path)
    noted = 0
    for traj in trajs:
        assert traj.steps[0].notes == []
        for before, step in zip(traj.steps, traj.steps[1:]):
            want = [failed_step_note(render_action(before.action), "permanent")]
            assert step.notes == (want if before.error else [])
            noted += bool(step.notes)
    assert noted >= 3, "noisy experts should fail some steps"


def test_planner_prompts_with_notes_are_the_training_prefixes(tmp_path, tok):
    """Noisy-expert episodes replayed by a reactive planner whose decider plays the recorded actions: with notes
    shown, every prompt is the training prefix of its step, notes of the failed steps included."""
    checked = 0
    for traj in _noisy_toy(tmp_path):
        if not any(s.notes for s in traj.steps):
            continue
        actions = iter(s.action for s in traj.steps)
        engine = ScriptedEngine(decide=lambda req, user, it=actions: render_action(next(it)))
        cfg = PlannerConfig.from_dict(
            {"arm": "reactive", "raise_errors": True, "propose": "sample", "max_steps": len(traj.steps)}
        )
        result = _planner(engine, cfg, tok, env=NoListToy()).run(traj.task)
        assert result.summary.steps == len(traj.steps)
        prompts = [r.messages for kind, requests in engine.calls if kind == "generate" for r in requests]
        assert prompts == _training_prefixes(traj, NOTES, tok), traj.id
        assert [a.notes for a in result.trace.of_type("act")] == [s.notes for s in traj.steps]
        checked += 1
    assert checked >= 2


def test_a_pivots_note_reaches_the_next_prompt_and_the_harvested_trajectory(tok):
    """A simulator that is always wrong: the first planned step fires the mismatch pivot; its note is in the next
    decision's prompt, in the act's trace, and in the harvested trajectory, whose training prefix for that decision
    is the planner's prompt byte for byte."""
    env = ToyEnv()
    task = env.tasks("dev")[3]

    def score(req, text):  # the expert's action in the real state
        best = toy_expert_action(env)
        return [0.0 if c == best else -5.0 for c in req.candidates]

    engine = ScriptedEngine(lambda req, user: toy_expert_action(env), lambda req, user: WRONG, score)
    cfg = PlannerConfig.from_dict(
        {"arm": "simplan", "k": 1, "horizon": 1, "adaptive": False, "raise_errors": True, "max_steps": 12}
    )
    result = _planner(engine, cfg, tok, env=env).run(task)
    assert result.summary.success
    acts = result.trace.of_type("act")
    first = acts[0]
    note = pivot_note(["expectation_mismatch"], first.action, expected=WRONG)
    assert acts[1].notes[0] == note
    replan = result.trace.of_type("replan")[0]
    assert replan.step == 1 and replan.reason == "expectation_mismatch"
    # the decision after the pivot reads the note with the real observation
    prompts = [r.messages for kind, requests in engine.calls if kind == "score" for r in requests]
    shown = "\n\n".join([first.observation, SECTION_NOTE.format(note=note)])
    assert prompts[1][-1] == {"role": "user", "content": shown}
    assert all(SECTION_NOTE.format(note=note) not in m["content"] for m in prompts[0])
    # harvested: the same notes on the same steps, and the training prefixes are the planner's prompts
    traj = replay(ToyEnv(), result.trace, step_sources(acts, True), {})
    assert [s.notes for s in traj.steps] == [a.notes for a in acts]
    assert _training_prefixes(traj, NOTES, tok)[1] == prompts[1]


def test_build_shows_notes_to_the_decider_only():
    decider = BuildConfig(inputs=["x.jsonl"], out="ds", role="decider", notes=True).settings()
    simulator = BuildConfig(inputs=["x.jsonl"], out="ds", role="simulator", notes=True).settings()
    assert decider.notes and not simulator.notes
    assert not BuildConfig(inputs=["x.jsonl"], out="ds", role="decider").settings().notes
    with pytest.raises(ValueError, match="notes: needs"):
        BuildConfig(inputs=["x.jsonl"], out="ds", role="decider", notes=True, format="step")
    # without the setting a turn's notes stay out of the prompt
    state = EpisodeState.start("Reach the end.", "Room 1.")
    state.note("pivot not_valid_now at go north")
    plain = renderer_for(PromptSettings(budget=4096), _tokenizer()).user(state, 0, 0)
    shown = renderer_for(NOTES, _tokenizer()).user(state, 0, 0)
    assert plain == "Room 1." and shown == "Room 1.\n\nNote: pivot not_valid_now at go north"
