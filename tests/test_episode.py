"""One episode, one conversation (data/episode.py): windows, loss masks, planner/training identity.

.venv/bin/pytest -q tests/test_episode.py
"""

from __future__ import annotations

import json
import warnings
from dataclasses import replace
from pathlib import Path

import pytest

from simplan.core.io import iter_jsonl
from simplan.data.build import BuildConfig, build
from simplan.data.build_rows import step_rows
from simplan.data.collect import CollectConfig, collect
from simplan.data.episode import EpisodeState, PromptSettings, renderer_for, write_settings
from simplan.data.trajectory import Trajectory
from simplan.envs.failures import FailureRules
from simplan.envs.registry import make_env
from simplan.inference.engines.scripted import ScriptedEngine
from simplan.inference.planning.config import PlannerConfig, PromptConfig, SamplingConfig
from simplan.inference.planning.planner import Planner
from simplan.inference.planning.prompts import PlannerPrompts
from simplan.inference.planning.router import BudgetConfig
from simplan.models.tiny import _tokenizer
from simplan.training.examples import IGNORE_INDEX, tokenize_conversation


@pytest.fixture(scope="module")
def tok():
    return _tokenizer()


def _collect(tmp_path: Path, env: str, policies: list[str], limit: int, **kw) -> list[Trajectory]:
    out = tmp_path / f"{env}.jsonl"
    collect(CollectConfig(env=env, policies=policies, limit=limit, branches=0, out=str(out), progress=False, **kw))
    return [Trajectory.from_dict(json.loads(line)) for _, line in iter_jsonl(out)]


def _long_toy(tmp_path: Path) -> list[Trajectory]:
    return _collect(tmp_path, "toy", ["expert", "noisy_expert"], 6, env_kwargs={"max_rooms": 12})


# ---------------------------------------------------------------------------------------------
# Windows and masks
# ---------------------------------------------------------------------------------------------
def test_windows_repeat_the_goal_and_train_every_learned_step_once(tmp_path, tok):
    renderer = renderer_for(PromptSettings(budget=200, reserve=16, overlap=2), tok)
    windowed = 0
    for traj in _long_toy(tmp_path):
        state = EpisodeState.from_trajectory(traj, learn=lambda s: s.source in ("expert", "recovery"))
        examples = renderer.examples(state, "decider")
        windowed += len(examples) > 1
        trained = [s for ex in examples for s, w in zip(ex.steps, ex.weights) if w]
        expected = [s.index for s in traj.steps if s.source in ("expert", "recovery")]
        assert trained == expected  # each learned step exactly once, in order; noise never trained
        for before, ex in zip([None, *examples], examples):
            assert ex.messages[0]["role"] == "system" and f"Goal: {traj.goal.strip()}" in ex.messages[0]["content"]
            if before is not None:  # a later window repeats at most `overlap` steps of the one before
                assert 0 <= before.window[1] + 1 - ex.window[0] <= 2
            for m, w in zip(ex.messages, ex.weights):
                assert w == 0 or m["role"] == "assistant"
    assert windowed >= 2, "the budget should cut the longer corridors into several windows"


def test_loss_mask_covers_exactly_the_weighted_assistant_turns(tmp_path, tok):
    traj = _long_toy(tmp_path)[1]
    state = EpisodeState.from_trajectory(traj, learn=lambda s: s.source != "noise")
    ex = renderer_for(PromptSettings(budget=4096), tok).examples(state, "decider")[0]
    enc = tokenize_conversation(tok, ex.messages, ex.weights)
    labelled = [i for i, y in enumerate(enc["labels"]) if y != IGNORE_INDEX]
    text = tok.decode([enc["input_ids"][i] for i in labelled])
    expected = "".join(m["content"] + tok.eos_token for m, w in zip(ex.messages, ex.weights) if w)
    assert text == expected
    assert sum(ex.weights) < sum(m["role"] == "assistant" for m in ex.messages)  # the noise stays masked


def test_an_imagined_step_renders_like_a_real_one(tok):
    renderer = renderer_for(PromptSettings(budget=1024), tok)
    real = EpisodeState.start("Reach the end.", "Room 1.", valid_actions=["go east"])
    imagined = real.branch().step("go east", "Room 2.", imagined=True)
    real.step("go east", "Room 2.")
    assert renderer.decider_messages(imagined) == renderer.decider_messages(real)
    assert renderer.simulator_messages(imagined, "go west") == renderer.simulator_messages(real, "go west")
    assert len(real.turns) == 2 and len(imagined.turns) == 2


# ---------------------------------------------------------------------------------------------
# The planner renders what training saw, byte for byte
# ---------------------------------------------------------------------------------------------
def _replay_prompts(env_name: str, traj: Trajectory, settings: PromptSettings, tok) -> list[list[dict]]:
    """The decider prompts the planner sends when its decider replays the recorded actions."""
    actions = iter(s.action for s in traj.steps)
    from simplan.envs.actions import render_action

    engine = ScriptedEngine(decide=lambda req, user: render_action(next(actions)))
    env = make_env(env_name, **traj.meta.get("env_kwargs", {}))
    try:
        config = PlannerConfig(
            arm="reactive",
            raise_errors=True,
            sampling=SamplingConfig(propose="sample"),
            prompts=PromptConfig(format=settings.format, budget=settings.budget),
            budgets=BudgetConfig(max_steps=len(traj.steps)),
        )
        planner = Planner(engine, env, config, tokenizer=tok)
        planner.prompts = PlannerPrompts(settings, settings, tok)
        result = planner.run(traj.task)
    finally:
        getattr(env, "close", lambda: None)()
    assert result.summary.steps == len(traj.steps)
    return [r.messages for kind, requests in engine.calls if kind == "generate" for r in requests]


def _training_prefixes(traj: Trajectory, settings: PromptSettings, tok) -> list[list[dict]]:
    state = EpisodeState.from_trajectory(traj)
    prefixes = {}
    for ex in renderer_for(settings, tok).examples(state, "decider"):
        for i, (m, s, w) in enumerate(zip(ex.messages, ex.steps, ex.weights)):
            if m["role"] == "assistant" and w:
                prefixes[s] = ex.messages[:i]
    return [prefixes[t] for t in range(len(traj.steps))]


def _check_identity(env_name: str, trajs: list[Trajectory], settings: PromptSettings, tok) -> None:
    assert trajs
    for traj in trajs:
        planner_prompts = _replay_prompts(env_name, traj, settings, tok)
        assert planner_prompts == _training_prefixes(traj, settings, tok), traj.id


def test_planner_prompts_are_the_training_prefixes_toy(tmp_path, tok):
    trajs = [t for t in _long_toy(tmp_path) if t.policy == "expert"]
    _check_identity("toy", trajs, PromptSettings(budget=200, reserve=16), tok)


def test_planner_prompts_are_the_training_prefixes_twx(tmp_path, tok):
    pytest.importorskip("textworld_express")
    trajs = _collect(tmp_path, "twx", ["expert"], 1, families=["cookingworld", "coin", "sorting"])
    _check_identity("twx", trajs, PromptSettings(budget=512, reserve=32, show_valid=True), tok)


def test_planner_prompts_are_the_training_prefixes_bfcl(tmp_path, tok):
    pytest.importorskip("bfcl_eval")
    trajs = _collect(tmp_path, "bfcl", ["expert"], 2, families=["multi_turn_base"])
    _check_identity("bfcl", trajs, PromptSettings(budget=1024, reserve=32), tok)


@pytest.mark.slow
def test_planner_prompts_are_the_training_prefixes_scienceworld(tmp_path, tok):
    pytest.importorskip("scienceworld")
    from simplan.envs.actions import render_action

    # ScienceWorld lists a capped hint of valid actions and the planner decides among the listed ones,
    # so the replay covers each episode up to its first expert action the hint does not list.
    trajs = []
    # Two task types: ScienceWorld's observations can change with the tasks its JVM played before, so
    # a long collection replayed in fresh envs compares the env with itself rather than the renderer.
    for traj in _collect(tmp_path, "scienceworld", ["expert"], 1, families=["boil", "melt"]):
        listed = next(
            (i for i, s in enumerate(traj.steps) if render_action(s.action) not in (s.valid_actions or [])),
            len(traj.steps),
        )
        if listed:
            trajs.append(replace(traj, steps=traj.steps[:listed]))
    _check_identity("scienceworld", trajs, PromptSettings(budget=1024, reserve=32), tok)


# ---------------------------------------------------------------------------------------------
# Settings travel with the artifacts
# ---------------------------------------------------------------------------------------------
def test_build_writes_settings_and_eval_view_matches_the_turns(tmp_path, tok):
    _long_toy(tmp_path)
    out = tmp_path / "ds"
    result = build(
        BuildConfig(inputs=[str(tmp_path / "toy.jsonl")], out=str(out), max_prompt_tokens=200, progress=False),
        tokenizer=tok,
    )
    saved = json.loads((out / "prompt_settings.json").read_text())
    assert saved["format"] == "conversation" and saved["budget"] == 200
    rows = [json.loads(line) for _, line in iter_jsonl(out / "train.jsonl")]
    assert all("weight" in m for r in rows for m in r["messages"] if m["role"] == "assistant")
    from datasets import load_from_disk

    train = load_from_disk(str(out / "dataset"))["train"].to_list()
    steps = [s for row in train for s in step_rows(row)]
    assert (
        len(steps)
        == sum(r["trained_turns"] for r in train)
        == result.stats["examples"]["by_source"]["expert"] + (result.stats["examples"]["by_source"].get("recovery", 0))
    )
    assert all(s["prompt"][-1]["role"] == "user" and s["completion"] for s in steps)


class _Engine:
    adapters = ["decider", "simulator"]

    def __init__(self, dirs: dict[str, str]) -> None:
        self.adapter_dirs = dirs


def test_settings_that_contradict_the_adapter_fail_naming_both(tmp_path):
    for role in ("decider", "simulator"):
        write_settings(tmp_path / role, PromptSettings(budget=512))
    engine = _Engine({r: str(tmp_path / r) for r in ("decider", "simulator")})
    prompts = PlannerPrompts.for_engine(engine, PlannerConfig())
    assert prompts.conversation and prompts.decider_settings.budget == 512
    assert (
        PlannerPrompts.for_engine(engine, PlannerConfig(prompts=PromptConfig(budget=512))).decider_settings.budget
        == 512
    )
    with pytest.raises(ValueError, match=r"budget: 512 in the decider adapter .*, 1024 given"):
        PlannerPrompts.for_engine(engine, PlannerConfig(prompts=PromptConfig(budget=1024)))
    write_settings(tmp_path / "simulator", PromptSettings(format="step"))
    with pytest.raises(ValueError, match="same --format"):
        PlannerPrompts.for_engine(engine, PlannerConfig())
    # No saved settings (an adapter from before they travelled, or the base model): per-step prompts.
    assert not PlannerPrompts.for_engine(_Engine({}), PlannerConfig()).conversation
    # A decider adapter alone (the reactive arm needs no simulator): the simulator role takes its format.
    alone = PlannerPrompts.for_engine(_Engine({"decider": str(tmp_path / "decider")}), PlannerConfig())
    assert alone.conversation and alone.simulator_settings.format == "conversation"


# ---------------------------------------------------------------------------------------------
# The OpenAI-messages export trains under TRL's SFTTrainer with the same loss mask
# ---------------------------------------------------------------------------------------------
# SmolLM2's ChatML template for conversations that open with a system message, with TRL's
# {% generation %} markers around the assistant turns whose export `weight` is 1.
WEIGHTED_CHATML = (
    "{%- for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{%- if message['role'] == 'assistant' and message.get('weight', 1) %}"
    "{% generation %}{{ message['content'] }}<|im_end|>{% endgeneration %}"
    "{%- else %}{{ message['content'] }}<|im_end|>{%- endif %}\n"
    "{%- endfor %}{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}"
)


def test_trl_sft_trains_on_the_export_with_our_loss_mask(tmp_path, tok):
    trl = pytest.importorskip("trl")
    from datasets import load_dataset

    from simplan.models.tiny import tiny_model

    _long_toy(tmp_path)
    out = tmp_path / "ds"
    build(BuildConfig(inputs=[str(tmp_path / "toy.jsonl")], out=str(out), max_prompt_tokens=200, progress=False), tok)
    data = load_dataset("json", data_files=str(out / "train.jsonl"), split="train")
    trl_tok = _tokenizer()
    trl_tok.chat_template = WEIGHTED_CHATML
    args = trl.SFTConfig(
        output_dir=str(tmp_path / "trl"),
        assistant_only_loss=True,
        max_steps=2,
        per_device_train_batch_size=2,
        learning_rate=1e-3,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        bf16=False,
    )
    trainer = trl.SFTTrainer(model=str(tiny_model("llama")), args=args, train_dataset=data, processing_class=trl_tok)
    for i in range(3):
        row = trainer.train_dataset[i]
        theirs = [y for y in row["labels"] if y != IGNORE_INDEX]  # TRL's labels from its assistant masks
        messages = [{"role": m["role"], "content": m["content"]} for m in data[i]["messages"]]
        weights = [int(m["role"] == "assistant" and (m.get("weight") or 0)) for m in data[i]["messages"]]
        ours = [y for y in tokenize_conversation(tok, messages, weights)["labels"] if y != IGNORE_INDEX]
        assert theirs == ours and ours
    trainer.train()
    losses = [r["loss"] for r in trainer.state.log_history if "loss" in r]
    assert losses and all(loss == loss and loss > 0 for loss in losses)  # finite, positive


# ---------------------------------------------------------------------------------------------
# Transient failures are retried, not remembered (training and planner alike)
# ---------------------------------------------------------------------------------------------
def test_transient_failures_stay_out_of_the_failure_memory_in_training_and_planner_prompts(
    tmp_path, tok, shop_on_path
):
    trajs = _collect(tmp_path, "simplan_shop.env:ShopEnv", ["expert", "noisy_expert"], 3)
    settings = PromptSettings(budget=600, reserve=16, overlap=1)  # the shop's episodes span 2 windows here
    renderer = renderer_for(settings, tok)
    memories: list[str] = []
    unclassed: list[str] = []  # every failure remembered, as before transient ones were told apart
    for traj in trajs:
        state = EpisodeState.from_trajectory(traj)
        starts = {ex.window[0] for ex in renderer.examples(state, "decider")}
        memories += [renderer.system(state, s, "decider") for s in starts]
        plain = EpisodeState.from_trajectory(traj, failures=FailureRules())  # no transient patterns
        unclassed += [renderer.system(plain, s, "decider") for s in starts]
    assert len([m for m in unclassed if "503" in m]) >= 3, "windows must open after a 503 for the check to matter"
    assert not [m for m in memories if "503" in m]
    assert [m for m in memories if "Failed before" in m], "permanent and sell-out failures are still remembered"

    # The planner (reactive: it asks the decider at every step, the retry too) sends the training prefixes. The
    # expert's episodes only: a noisy one's unknown tool is parsed into another action by the planner.
    _check_identity("simplan_shop.env:ShopEnv", [t for t in trajs if t.policy == "expert"], settings, tok)


def test_step_format_leaves_transient_failures_out_of_the_failure_memory_too(tmp_path, shop_on_path):
    from simplan.data import format as fmt
    from simplan.envs.failures import rules_of_env

    trajs = _collect(tmp_path, "simplan_shop.env:ShopEnv", ["expert", "noisy_expert"], 3)
    rules = rules_of_env("simplan_shop.env:ShopEnv")
    assert rules.transient, "the shop declares its 503 transient"
    kept = [f for t in trajs for st in fmt.trajectory_states(t, None, None, rules) for f in st.failures]
    every = [f for t in trajs for st in fmt.trajectory_states(t, None, None) for f in st.failures]
    assert [f for f in every if "503" in f], "a 503 must be in some failure memory for the check to matter"
    assert not [f for f in kept if "503" in f] and kept, "permanent failures are still remembered"


SHOP_PACKAGE = Path(__file__).resolve().parents[1] / "examples" / "simplan-shop"
SHOP_SPEC = "simplan_shop.env:ShopEnv"


@pytest.fixture
def shop_unnamed(monkeypatch: pytest.MonkeyPatch):
    """The shop importable by its class spec but with no `shop` entry point: a fresh clone, where the example
    package is not pip-installed (the opposite of conftest's shop_on_path)."""
    from simplan.envs import registry
    from simplan.envs.failures import rules_of_env

    monkeypatch.syspath_prepend(str(SHOP_PACKAGE))
    installed = [e for e in registry._entry_points() if e.name != "shop"]
    monkeypatch.setattr(registry, "_entry_points", lambda: installed)
    rules_of_env.cache_clear()  # an earlier test may have cached "shop" as known
    yield
    rules_of_env.cache_clear()


def test_build_env_names_the_failure_classes_where_the_recorded_env_name_is_unknown(tmp_path, tok, shop_unnamed):
    from simplan.envs.registry import UnknownEnvError

    trajs = _collect(tmp_path, SHOP_SPEC, ["expert", "noisy_expert"], 3)
    assert {t.env for t in trajs} == {"shop"}, "collection records the env's own name, unknown here"
    inputs = [str(tmp_path / f"{SHOP_SPEC}.jsonl")]

    def memories(out: str, **kw) -> list[str]:
        """The system message (goal and failure memory) of every decider window built."""
        window = {"max_prompt_tokens": 600, "completion_reserve": 16, "window_overlap": 1}  # 503s open windows
        result = build(BuildConfig(inputs=inputs, out=str(tmp_path / out), progress=False, **window, **kw), tok)
        files = [result.paths[fold] for fold in ("train", "dev", "test") if fold in result.paths]
        return [json.loads(line)["messages"][0]["content"] for path in files for _, line in iter_jsonl(path)]

    with pytest.warns(UserWarning, match=r"simplan build --env package\.module:Class"):
        unclassed = memories("by-recorded-name")
    assert [m for m in unclassed if "503" in m], "a window must open after a 503 for the check to matter"

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        classed = memories("by-class", env=SHOP_SPEC)
    assert not [w for w in caught if "cannot be told apart" in str(w.message)], "the named env resolves"
    assert not [m for m in classed if "503" in m], "the shop's 503 is transient: retried, not remembered"
    assert [m for m in classed if "Failed before" in m], "permanent and sell-out failures are still remembered"

    with pytest.raises(UnknownEnvError, match="no_such_env"):  # a misspelt env fails before anything is built
        memories("misspelt", env="no_such_env")
    assert not (tmp_path / "misspelt").exists()
