"""The belief-state snapshot (issue 32 item 1): envs extract facts from each observation, collection records them
with each step, and a model built with `snapshot` sees, at the top of each window, what the steps before the
window told, byte for byte as the planner shows it.

.venv/bin/pytest -q tests/test_snapshot.py
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_pivot_notes import NoListToy, _training_prefixes  # pytest puts tests/ on sys.path (rootdir-relative imports)

from simplan.core.errors import InputError
from simplan.core.io import iter_jsonl
from simplan.data.build import BuildConfig, build
from simplan.data.collect import CollectConfig, collect
from simplan.data.episode import EpisodeState, PromptSettings, renderer_for
from simplan.data.format import SECTION_KNOWN
from simplan.data.trajectory import Step, Trajectory, step_problems
from simplan.envs.actions import render_action
from simplan.envs.base import Action
from simplan.envs.subgoals import Belief, Fact, describe_belief, env_facts
from simplan.envs.textworld_express import TextWorldExpressEnv, twx_facts
from simplan.envs.toy import ToyEnv
from simplan.inference.engines.scripted import ScriptedEngine
from simplan.inference.planning.config import PlannerConfig
from simplan.inference.planning.planner import Planner
from simplan.inference.planning.prompts import PlannerPrompts
from simplan.models.tiny import _tokenizer

# A budget small enough that toy episodes of 4-8 steps open several windows.
SNAPSHOT = PromptSettings(budget=160, reserve=16, overlap=1, snapshot=True)

KITCHEN = (
    "You are in the kitchen. In one part of the room you see a fridge that is closed. \n"
    "To the South you see the backyard. Through an open frosted-glass door, to the East you see the pantry. "
    "To the West you see a closed wood door. "
)


@pytest.fixture(scope="module")
def tok():
    return _tokenizer()


def _belief(*observations: str) -> list[str]:
    belief = Belief()
    for text in observations:
        belief.add(twx_facts(text))
    return describe_belief(belief)


def test_twx_facts_keep_the_room_its_exits_and_the_inventory():
    assert _belief(KITCHEN) == [
        "location: kitchen",
        "exits: kitchen (south: the backyard, east: the pantry, west: a closed wood door)",
    ]
    pantry = "You are in the pantry. There is a shelf that has some flour. \nTo the West you see the kitchen. "
    taken = ["You take the cookbook.", "You take the block of cheese.", "You take the knife."]
    lines = _belief(KITCHEN, *taken, "You put the knife in the shelf.", pantry)
    assert lines[0] == "location: pantry"  # the latest room replaces the first
    assert lines[1].endswith("; pantry (west: the kitchen)")
    assert lines[2] == "inventory: cookbook, block of cheese"  # the knife put away
    # the meal prepared and eaten; an `inventory` listing replaces what was believed
    assert _belief("You take the water.", "Adding the meal to your inventory.") == ["inventory: water, meal"]
    assert _belief("You take the meal.", "You eat the meal.  It is delicious.") == []
    listed = "Inventory: \n  a map\n  an oven glove\n  some flour\n"
    assert _belief("You take the coin.", listed) == ["inventory: map, oven glove, flour"]
    assert _belief("You take the coin.", "Inventory: \n  Your inventory is currently empty.\n") == []
    # nothing from an answer that tells none of these, nor from a failed command or a command's intent
    assert twx_facts("You open the fridge. The fridge contains some water.") == []
    env = TextWorldExpressEnv.__new__(TextWorldExpressEnv)  # `facts` reads no state: no JVM needed
    assert env.facts(Action.command("take x"), "You take the x.", True) == []
    assert env.facts(Action.command("take x"), None, False) == []
    assert env.facts(None, KITCHEN, False) == twx_facts(KITCHEN)


def test_a_dropped_record_and_a_dropped_collection_leave_the_belief():
    belief = Belief()
    belief.add([Fact("inventory", "key"), Fact("inventory", "map"), Fact("orders", None, {"item": "a", "qty": 2})])
    assert describe_belief(belief) == ["inventory: key, map", "orders: #1 (item: a, qty: 2)"]
    belief.add([Fact("inventory", "key", drop=True), Fact("orders", None, drop=True)])
    assert describe_belief(belief) == ["inventory: map"]
    for fact in (Fact("exits", "hall", {"east": "the kitchen"}), Fact("inventory", None, drop=True)):
        assert Fact.from_dict(json.loads(json.dumps(fact.to_dict()))) == fact


def test_env_facts_checks_what_the_extractor_returns():
    class Wrong(ToyEnv):
        def facts(self, action, observation, error):
            return [("location", "room 1")]

    assert env_facts(object(), None, "anything", False) == []  # no extractor: no facts
    with pytest.raises(TypeError, match=r"Wrong.facts\(the reset observation\) returned .* expected Fact"):
        env_facts(Wrong(), None, "You are in room 1 of 3.", False)


def _toy_trajectories(tmp_path: Path, policies: list[str]) -> tuple[Path, list[Trajectory]]:
    out = tmp_path / "toy.jsonl"
    collect(CollectConfig(env="toy", policies=policies, attempts=2, limit=6, branches=0, out=str(out), progress=False))
    return out, [Trajectory.from_dict(json.loads(line)) for _, line in iter_jsonl(out)]


def test_collection_records_each_observations_facts(tmp_path):
    env = ToyEnv()
    _, trajs = _toy_trajectories(tmp_path, ["noisy_expert"])
    for traj in trajs:
        first = env_facts(env, None, traj.initial_observation, False)
        assert traj.steps[0].facts == [f.to_dict() for f in first]
        for before, step in zip(traj.steps, traj.steps[1:]):
            want = env_facts(env, before.action, before.next_observation, before.error)
            assert step.facts == [f.to_dict() for f in want], traj.id
    assert any(f["collection"] == "inventory" for t in trajs for s in t.steps for f in s.facts)
    # written only when there are some, and checked when read
    step = trajs[0].steps[0]
    assert "facts" not in Step(**{**step.__dict__, "facts": []}).to_dict()
    bad = {**step.to_dict(), "facts": [{"collection": 3}]}
    assert step_problems(bad) == [
        "facts[0]: expected {collection: string, key: string or null, fields: object, "
        "drop: bool}, got {'collection': 3}"
    ]


def test_a_window_shows_what_the_steps_before_it_told(tok):
    def room(n: int) -> list[Fact]:
        return [Fact("location", "", {"room": str(n)})]

    state = EpisodeState.start("Open the door.", "You are in room 1 of 5.", facts=room(1))
    state.step("go east", "You are in room 2 of 5. A key lies on the floor.", facts=room(2))
    state.step("take key", "You take the key.", facts=[Fact("inventory", "key")])
    for n in (3, 4, 3, 4, 3):
        state.step("go east" if n > 3 else "go west", f"You are in room {n} of 5. Nothing here.", facts=room(n))
    renderer = renderer_for(SNAPSHOT, tok)
    plain = renderer_for(PromptSettings(budget=160, reserve=16, overlap=1), tok)
    assert renderer.known_before(state, 0) == []
    assert renderer.known_before(state, 3) == ["location: 2", "inventory: key"]  # the turns before step 3
    start = renderer.window_start(state, "decider")
    assert start > 0, "the budget should open a later window"
    system = renderer.decider_messages(state)[0]["content"]
    known = SECTION_KNOWN.format(items="\n".join(f"- {k}" for k in renderer.known_before(state, start)))
    assert system.endswith(known)
    assert "Known from earlier steps" not in plain.decider_messages(state)[0]["content"]
    assert "Known from earlier steps" in renderer.simulator_messages(state, "go east")[0]["content"]
    with pytest.raises(ValueError, match="snapshot: needs format conversation"):
        PromptSettings(format="step", snapshot=True)


def test_planner_prompts_with_the_snapshot_are_the_training_prefixes(tmp_path, tok):
    """Recorded episodes replayed by a reactive planner whose decider plays the recorded actions: with the snapshot
    shown, every prompt is the training prefix of its step, the snapshots of later windows included."""
    _, trajs = _toy_trajectories(tmp_path, ["expert", "noisy_expert"])
    shown = 0
    for traj in trajs:
        actions = iter(s.action for s in traj.steps)
        engine = ScriptedEngine(decide=lambda req, user, it=actions: render_action(next(it)))
        cfg = PlannerConfig.from_dict(
            {"arm": "reactive", "raise_errors": True, "propose": "sample", "max_steps": len(traj.steps)}
        )
        planner = Planner(engine, NoListToy(), cfg, tokenizer=tok)
        planner.prompts = PlannerPrompts(SNAPSHOT, SNAPSHOT, tok)
        result = planner.run(traj.task)
        assert result.summary.steps == len(traj.steps)
        prompts = [r.messages for kind, requests in engine.calls if kind == "generate" for r in requests]
        assert prompts == _training_prefixes(traj, SNAPSHOT, tok), traj.id
        shown += sum("Known from earlier steps" in p[0]["content"] for p in prompts)
    assert shown >= 5, "later windows should show a snapshot"


def test_build_with_a_snapshot_needs_recorded_facts(tmp_path, tok):
    path, trajs = _toy_trajectories(tmp_path, ["expert"])
    cfg = BuildConfig(
        inputs=[str(path)],
        out=str(tmp_path / "ds"),
        role="decider",
        snapshot=True,
        max_prompt_tokens=160,
        completion_reserve=16,
        window_overlap=1,
        progress=False,
    )
    result = build(cfg, tokenizer=tok)
    assert json.loads(Path(result.paths["prompt_settings"]).read_text())["snapshot"] is True
    rows = [json.loads(line) for line in Path(result.paths["train"]).read_text().splitlines()]
    assert any("Known from earlier steps" in r["messages"][0]["content"] for r in rows)
    # the same trajectories without facts (collected before they were recorded): a clear error
    old = tmp_path / "old.jsonl"
    old.write_text(
        "".join(
            json.dumps(
                {**t.to_dict(), "steps": [{k: v for k, v in s.to_dict().items() if k != "facts"} for s in t.steps]}
            )
            + "\n"
            for t in trajs
        )
    )
    with pytest.raises(InputError, match="records facts .* Collect them again"):
        build(
            BuildConfig(inputs=[str(old)], out=str(tmp_path / "ds2"), role="decider", snapshot=True, progress=False),
            tokenizer=tok,
        )
    with pytest.raises(ValueError, match="snapshot: needs --format conversation"):
        BuildConfig(inputs=["x.jsonl"], out="ds", role="decider", snapshot=True, format="step")


def _expert_predicting(env: ToyEnv, prediction: str, **config):
    """Dev task 3 of the toy env run by simplan-always (k 1) with the toy expert as the decider and a simulator that
    predicts `prediction` for every step; `config`: the other PlannerConfig keys."""
    from simplan.inference.engines.scripted import toy_expert_action

    engine = ScriptedEngine(
        lambda req, user: toy_expert_action(env),
        lambda req, user: prediction,
        lambda req, t: [0.0] * len(req.candidates),
    )
    cfg = PlannerConfig.from_dict({"arm": "simplan-always", "k": 1, "raise_errors": True, **config})
    return Planner(engine, env, cfg).run(env.tasks("dev")[3])


def test_fact_mismatch_needs_facts_only_not_sub_goals():
    """The toy env declares facts and no sub-goals: a simulator that predicts the wrong room fires fact_mismatch
    (on), and nothing of the kind with the rule off."""
    from simplan.inference.planning.trace import PivotEvent, event_from_dict

    def run(on: bool) -> list:  # every step predicted to end in room 1
        rules = {"fact_mismatch": on}
        result = _expert_predicting(
            ToyEnv(), "You are in room 1 of 5.", horizon=1, budgets={"max_steps": 12}, pivot_rules=rules
        )
        events = [event_from_dict(e) for e in result.trace.to_dicts()]
        return [e for e in events if isinstance(e, PivotEvent) and e.rule == "fact_mismatch"]

    fired = run(True)
    differences = [d for e in fired for d in e.evidence["differences"]]
    assert any(d.startswith("location .room: expected '1', got '") for d in differences), differences
    assert run(False) == []


def test_the_end_event_records_what_the_real_steps_told():
    """The trace's end event holds the belief the real observations built, as a snapshot shows it, and the
    readable trace prints it; an env without facts records none."""
    from simplan.inference.engines.scripted import toy_expert_action
    from simplan.inference.planning.trace import EndEvent, event_from_dict, format_event

    def end(env) -> EndEvent:
        engine = ScriptedEngine(lambda req, user: toy_expert_action(env))
        cfg = PlannerConfig.from_dict({"arm": "reactive", "raise_errors": True, "budgets": {"max_steps": 12}})
        result = Planner(engine, env, cfg).run(env.tasks("dev")[3])
        assert result.summary.success
        return event_from_dict(result.trace.to_dicts()[-1])

    env = ToyEnv()
    last = end(env)
    room = env.pos + 1  # where the won episode stands
    assert last.belief == [f"location: {room}", "inventory: key"]
    assert f"\n  known: location: {room}\n  known: inventory: key" in format_event(last)

    class NoFacts(ToyEnv):
        facts = None

    assert end(NoFacts()).belief is None


def test_a_ban_by_belief_holds_in_the_same_place_under_another_description():
    """pivot_rules.ban_where: an action banned in a toy room before `inventory` (another text, the same room and
    valid actions) is still banned after it when bans are kept by the belief, not when they are kept by the
    observation; an env without facts keeps them by the observation either way."""
    from simplan.inference.planning.episode_run import EpisodeRun, state_key

    env = ToyEnv()
    task = env.tasks("dev")[0]
    first = env.reset(task)
    inventory = Action.command("inventory")
    after = env.step(inventory).observation
    assert after.text != first.text and after.valid_actions == first.valid_actions
    state = EpisodeState.start(
        first.goal, first.text, None, first.valid_actions, facts=env_facts(env, None, first.text, False)
    )
    state.step("inventory", after.text, False, after.valid_actions, facts=env_facts(env, inventory, after.text, False))
    east = Action.command("go east")
    engine = ScriptedEngine(lambda req, user: "look", lambda req, user: "", lambda req, t: [0.0] * len(req.candidates))
    for where, kept in (("observation", False), ("belief", True)):
        cfg = PlannerConfig.from_dict({"arm": "simplan", "pivot_rules": {"ban_where": where}})
        run = EpisodeRun(task, cfg.budgets, None, None, after, first.goal, state=state, ban_where=where)
        run.ban(east, run.place(first, upto=-1))  # banned in the state before the last step
        allowed = Planner(engine, env, cfg)._allowed(run)
        assert ("go east" not in allowed) is kept, where
        assert set(allowed) | {"go east"} == set(after.valid_actions)
    bare = EpisodeState.start(first.goal, first.text, None, first.valid_actions)  # no facts recorded
    run = EpisodeRun(task, cfg.budgets, None, None, after, first.goal, state=bare, ban_where="belief")
    assert run.place(first) == state_key(first) != run.place(after) == state_key(after)
    with pytest.raises(ValueError, match="ban_where: 'room' is not one of observation, belief"):
        PlannerConfig.from_dict({"pivot_rules": {"ban_where": "room"}})


def test_imagined_steps_carry_the_facts_of_their_predictions(monkeypatch):
    """Inside a rollout a predicted observation is a step of the branched state with the env's facts of it, as a
    real step's: a window's snapshot reads imagined steps as it reads real ones; the real state gets none."""
    env = ToyEnv()
    imagined: list[tuple[str, list]] = []
    real = EpisodeState.step

    def spy(self, action, observation, error=False, *args, **kwargs):
        if kwargs.get("imagined"):
            imagined.append((observation, list(kwargs.get("facts", ()))))
        return real(self, action, observation, error, *args, **kwargs)

    monkeypatch.setattr(EpisodeState, "step", spy)
    settings = {"budgets": {"max_steps": 3}, "prompts": {"format": "conversation"}}
    _expert_predicting(env, "You are in room 3 of 5.", horizon=2, **settings)
    assert imagined and all(o == "You are in room 3 of 5." for o, _ in imagined)
    assert all(facts == [Fact("location", "", {"room": "3"})] for _, facts in imagined), imagined
