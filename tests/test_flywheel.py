"""The data flywheel: eval traces as trajectories (`simplan traces`), losing branches in collection, one round.

.venv/bin/pytest -q tests/test_flywheel.py

Evaluations use the model-free engines (`expert` wins every toy task, `random` mostly wanders), so no
model is loaded; datasets are built with a tiny random tokenizer.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest

from simplan.data.build import BuildConfig, BuildResult, build
from simplan.data.collect import CollectConfig, collect
from simplan.envs import registry
from simplan.envs.base import Observation, StepResult
from simplan.envs.toy import ToyEnv
from simplan.evaluation.faults import TRANSIENT_TEXT
from simplan.evaluation.runner import EvalConfig, evaluate
from simplan.inference.engines import make_engine
from simplan.inference.planning.trace import ActEvent, read_traces
from simplan.scripts.cli import main as cli_main
from simplan.workflows.harvest import TracesConfig, harvest, step_sources

REPO = Path(__file__).resolve().parents[1]
TRAP_TEXT = "The key slips into a crack in the floor. The door can never be opened now."


def _eval(out: Path, engine: str, suite: str = "toy-dev", **kw) -> Path:
    settings = {"suite": suite, "arms": ["reactive"], "episodes": 3, "max_steps": 8, **kw}  # toy-sized by default
    cfg = EvalConfig(**settings, out=str(out), progress=False)
    evaluate(cfg, make_engine(engine, "unused"), concurrency=1)
    return out


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def toy_runs(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Two toy-dev eval runs: the expert engine (every episode won) and the random one (mostly lost)."""
    root = tmp_path_factory.mktemp("runs")
    return [_eval(root / "expert", "expert"), _eval(root / "random", "random")]


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from simplan.models.tiny import tiny_model

    return AutoTokenizer.from_pretrained(tiny_model("llama"))


def _build(tmp_path: Path, role: str, inputs: list[Path], tokenizer) -> BuildResult:
    files = [str(p) for p in inputs]
    cfg = BuildConfig(role=role, inputs=files, out=str(tmp_path / role), dedupe=False, progress=False)
    return build(cfg, tokenizer=tokenizer)


# ---------------------------------------------------------------------------------------------
# Traces -> trajectories
# ---------------------------------------------------------------------------------------------
def test_traces_round_trip_validates_and_builds_both_datasets(tmp_path, toy_runs, tokenizer, capsys) -> None:
    out = tmp_path / "traces.jsonl"
    assert cli_main(["traces", "--runs", ",".join(map(str, toy_runs)), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    records = _records(out)
    traces = [t for run in toy_runs for t in read_traces(run / "traces.jsonl")]
    assert len(records) == len(traces) == 6 and "episodes: 6 finished, 6 written" in printed

    # every real transition the agent caused is a step, in order, with what the agent saw
    by_episode = {(r["meta"]["run"], r["meta"]["episode_id"]): r for r in records}
    for run in toy_runs:
        for trace in read_traces(run / "traces.jsonl"):
            acts, steps = trace.of_type("act"), by_episode[str(run), trace.episode_id]["steps"]
            assert [s["action"]["text"] for s in steps] == [a.action for a in acts]
            assert [s["next_observation"] for s in steps] == [a.observation for a in acts]
            assert all(s["valid_actions"] for s in steps)  # recorded by replaying the env, as collection does
    won = [r for r in records if r["success"]]
    lost = [r for r in records if not r["success"]]
    assert len(won) >= 3 and lost  # the expert's three, and the random engine's losses
    assert all(r["policy"] == "reactive" and r["id"].startswith("toy/corridor-") for r in records)
    assert {s["source"] for r in won for s in r["steps"]} <= {"expert", "recovery", "noise"}
    assert {s["source"] for r in lost for s in r["steps"]} <= {"policy", "noise"}  # nothing of a loss is a target
    targets = sum(s["source"] in ("expert", "recovery") and not s["error"] for r in records for s in r["steps"])
    transitions = sum(len(r["steps"]) for r in records)
    assert f"decider targets: {targets}; masked steps: {transitions - targets}" in printed

    assert cli_main(["validate", str(out)]) == 0
    decider = _build(tmp_path, "decider", [out], tokenizer)
    simulator = _build(tmp_path, "simulator", [out], tokenizer)
    trained = {role: _trained(Path(res.out)) for role, res in (("decider", decider), ("simulator", simulator))}
    assert trained["decider"]["count"] == targets and trained["decider"]["sources"] <= {"expert", "recovery"}
    assert trained["simulator"]["count"] == transitions  # mistakes included: what they lead to is learned
    assert {"noise", "policy"} & trained["simulator"]["sources"]


def _trained(out: Path) -> dict:
    """Trained turns of a built dataset (every fold) and the sources they came from."""
    from datasets import load_from_disk

    dataset = load_from_disk(str(out / "dataset"))
    pairs = [(s, w) for fold in dataset for row in dataset[fold] for s, w in zip(row["sources"], row["weights"])]
    return {"count": sum(w for _, w in pairs), "sources": {s for s, w in pairs if w}}


def _act(step: int, action: str, observation: str, **kw) -> ActEvent:
    return ActEvent(step=step, action=action, action_key=action, observation=observation, **kw)


def test_step_sources_mask_mistakes_and_everything_a_loss_never_recovered_from() -> None:
    won = [
        _act(1, "go east", "room 2"),
        _act(2, "dance", "You can't do that.", error=True),  # failed: masked
        _act(3, "take key", "You take the key.", reward=0.5),  # right after a mistake: recovery
        _act(4, "look", "room 2"),
        _act(5, "look", "room 2"),  # repeats step 4's (action, observation): masked
        _act(6, "go east", TRANSIENT_TEXT, error=True, fault="transient"),  # never ran: masked
        _act(7, "go east", "room 3"),
    ]
    assert step_sources(won, succeeded=True) == ["expert", "noise", "recovery", "expert", "noise", "noise", "recovery"]
    lost = [
        _act(1, "go east", "room 2"),
        _act(2, "take key", "You take the key.", reward=0.5),  # the last score gain
        _act(3, "go west", "room 1"),  # the episode never recovered from here on
        _act(4, "dance", "You can't do that.", error=True),
        _act(5, "throw key", TRAP_TEXT, reward=-0.5, done=True),
    ]
    assert step_sources(lost, succeeded=False) == ["policy", "policy", "noise", "noise", "noise"]
    assert step_sources(lost[:1], succeeded=False) == ["noise"]  # no gain at all: nothing was worth it


def test_arms_and_min_score_select_and_a_diverging_replay_is_skipped(tmp_path, toy_runs) -> None:
    expert, random_run = toy_runs
    report = harvest(TracesConfig(runs=[str(random_run)], out=str(tmp_path / "a.jsonl"), arms=["plan"]))
    assert report.episodes == 0 and not _records(tmp_path / "a.jsonl")  # no episode of that arm

    # with min_score 0 every finished episode counts as a success: the lost ones' actions become targets too
    plain = harvest(TracesConfig(runs=[str(random_run)], out=str(tmp_path / "b.jsonl")))
    generous = harvest(TracesConfig(runs=[str(random_run)], out=str(tmp_path / "c.jsonl"), min_score=0.0))
    assert plain.outcomes["lost"] > 0 and generous.outcomes["lost"] == 0
    assert generous.decider_targets > plain.decider_targets and not generous.sources["policy"]

    # a trace whose env answers differently on replay (an env that is not deterministic) is skipped, named
    lines = (expert / "traces.jsonl").read_text().splitlines()
    events = [json.loads(line) for line in lines]
    first_act = next(e for e in events if e["type"] == "act")
    first_act["observation"] = "Something else entirely."
    run = tmp_path / "changed"
    run.mkdir()
    (run / "traces.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    report = harvest(TracesConfig(runs=[str(run)], out=str(tmp_path / "d.jsonl")))
    assert report.skipped["replay_mismatch"] == 1 and report.written == 2
    assert first_act["episode_id"] in report.problems[0] and "not replayable" in report.problems[0]
    assert cli_main(["traces", "--runs", str(tmp_path / "nowhere"), "--out", str(tmp_path / "e.jsonl")]) == 2


def test_injected_transient_faults_are_recorded_without_stepping_the_env(tmp_path) -> None:
    run = _eval(tmp_path / "faulty", "expert", faults={"transient": 0.4, "seed": 1})
    report = harvest(TracesConfig(runs=[str(run)], out=str(tmp_path / "t.jsonl")))
    assert report.written == 3 and not report.skipped  # the replay met every traced observation
    steps = [s for r in _records(tmp_path / "t.jsonl") for s in r["steps"]]
    faulted = [i for i, s in enumerate(steps) if s["next_observation"] == TRANSIENT_TEXT]
    assert faulted and all(steps[i]["error"] and steps[i]["source"] == "noise" for i in faulted)
    # the retry sees the fault's text as its observation, and is the recovery the decider learns
    assert all(steps[i + 1]["observation"] == TRANSIENT_TEXT for i in faulted if i + 1 < len(steps))


# ---------------------------------------------------------------------------------------------
# Losing branches
# ---------------------------------------------------------------------------------------------
class TrapToyEnv(ToyEnv):
    """The toy corridor with one irreversible mistake: once the key is held, `throw key` loses the game."""

    def valid_actions(self) -> list[str]:
        acts = super().valid_actions()
        return sorted([*acts, "throw key"]) if self.has_key and not self.door_open else acts

    def step(self, action) -> StepResult:
        thrown = action.kind == "command" and action.text.strip().lower() == "throw key"
        if thrown and "throw key" in self.valid_actions():
            self.has_key = False
            obs = Observation(text=TRAP_TEXT, goal=self.goal, valid_actions=[])
            return StepResult(observation=obs, reward=-self._last_score, score=0.0, done=True, won=False)
        return super().step(action)


def test_losing_branches_record_what_an_irreversible_mistake_leads_to(tmp_path, tokenizer) -> None:
    registry.register("toy-trap", TrapToyEnv)
    out = tmp_path / "trap.jsonl"
    cfg = CollectConfig(env="toy-trap", limit=3, policies=["expert"], losing_branches=1, out=str(out), progress=False)
    report = collect(cfg)
    assert "losing branches: 3/3 lost the game" in report.summary()
    losing = [r for r in _records(out) if r["meta"].get("losing")]
    assert len(losing) == 3
    for r in losing:
        *prefix, last = r["steps"]
        assert r["id"].endswith("/random/lose0") and r["meta"]["branch_step"] == len(prefix)
        assert last["action"]["text"] == "throw key" and last["next_observation"] == TRAP_TEXT
        assert last["done"] and not last["won"] and last["source"] == "noise"
        assert all(s["source"] == "expert" and not s["done"] for s in prefix)  # the expert path up to the mistake

    sim = _trained_completions(_build(tmp_path, "simulator", [out], tokenizer))
    assert TRAP_TEXT in sim  # the simulator learns where the mistake leads ...
    decider = _trained_completions(_build(tmp_path, "decider", [out], tokenizer))
    assert "throw key" not in decider  # ... and the decider never imitates it

    plain = tmp_path / "plain.jsonl"  # the plain toy env has no losing action: an ordinary branch, tries capped
    collect(
        CollectConfig(
            env="toy", limit=1, policies=["expert"], losing_branches=1, losing_tries=2, out=str(plain), progress=False
        )
    )
    (branch,) = [r for r in _records(plain) if r["meta"].get("kind") == "branch"]
    assert branch["meta"]["losing"] is False and branch["meta"]["tries"] == 2 and not branch["steps"][-1]["done"]
    assert not any(r["meta"].get("losing") is not None for r in _records(out) if r["policy"] == "expert")


def _trained_completions(result) -> str:
    from datasets import load_from_disk

    dataset = load_from_disk(str(Path(result.out) / "dataset"))
    return "\n".join(
        m["content"]
        for fold in dataset
        for row in dataset[fold]
        for m, w in zip(row["messages"], row["weights"])  # a weight per message: 1 on a trained assistant turn
        if w
    )


def test_twx_losing_branches_end_the_game_unwon(tmp_path) -> None:
    pytest.importorskip("textworld_express")
    out = tmp_path / "twx.jsonl"
    cfg = CollectConfig(
        env="twx", families=["simonsays", "sorting"], limit=1, policies=["expert"], losing_branches=1, out=str(out)
    )
    collect(cfg)
    losing = [r for r in _records(out) if r["meta"].get("kind") == "branch"]
    assert {r["task"]["family"] for r in losing} == {"simonsays", "sorting"}
    for r in losing:
        last = r["steps"][-1]
        assert r["meta"]["losing"] and last["done"] and not last["won"] and last["score"] == -1.0


def test_twx_traces_replay_and_an_irreversible_loss_is_masked(tmp_path) -> None:
    pytest.importorskip("textworld_express")
    import yaml

    suite = tmp_path / "twx-train.yaml"
    entry = {"env": "twx", "fold": "train", "families": ["sorting", "arithmetic"], "tasks_per_family": 2}
    suite.write_text(yaml.safe_dump({"name": "twx-train", "max_steps": 10, "entries": [entry]}))
    runs = [_eval(tmp_path / kind, kind, suite=str(suite), episodes=0, max_steps=0) for kind in ("expert", "random")]
    report = harvest(TracesConfig(runs=[str(r) for r in runs], out=str(tmp_path / "t.jsonl")))
    assert report.written == report.episodes == 8 and not report.skipped  # TWX replays exactly
    records = _records(tmp_path / "t.jsonl")
    assert sum(r["success"] for r in records) == 4 == report.outcomes["won"]  # the expert's
    irreversible = [r for r in records if r["meta"]["loss"] == "irreversible"]
    assert irreversible  # a random wrong item in the box, or a wrong answer, ends the game at -1
    for r in irreversible:
        last = r["steps"][-1]
        assert last["done"] and not last["won"] and last["score"] == -1.0 and last["source"] == "noise"


# ---------------------------------------------------------------------------------------------
# One round
# ---------------------------------------------------------------------------------------------
def _tiny_adapter(out: Path, seed: int) -> Path:
    """A LoRA on the tiny llama with random non-zero B (peft starts B at zero, the base model's outputs)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from simplan.models.tiny import tiny_model

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(tiny_model("llama"), dtype=torch.float32)
    peft_model = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.3)
    peft_model.save_pretrained(str(out))
    return out


def test_flywheel_round_converts_merges_and_rebuilds(tmp_path, monkeypatch) -> None:
    from simplan.evaluation.paired import mcnemar_exact
    from simplan.workflows.flywheel import Flywheel, FlywheelConfig, SimulatorCheck, run_report

    monkeypatch.chdir(REPO)
    data = [tmp_path / "train.jsonl", tmp_path / "dev.jsonl"]
    for fold, path in zip(("train", "dev"), data):
        collect(CollectConfig(env="toy", fold=fold, limit=2, policies=["expert"], out=str(path), progress=False))
    harvested = _eval(tmp_path / "harvested", "random", suite="toy-train")
    before = _eval(tmp_path / "before", "random")  # stands in for the old adapters' run on the dev suite
    old_simulator = _tiny_adapter(tmp_path / "old-simulator", seed=1)
    cfg = FlywheelConfig(
        out=str(tmp_path / "round"),
        data=[str(p) for p in data],
        decider="runs/old/decider/adapter",
        simulator=str(old_simulator),
        eval_runs=[str(harvested)],
        before=str(before),
        model="tiny-llama",
        build={"max_prompt_tokens": 384, "progress": False},
        simulator_check={"limit": 0, "max_new_tokens": 4, "dtype": "float32", "num_threads": 1},
        stages=["model", "harvest", "traces", "build-decider", "build-simulator"],
    )
    flywheel = Flywheel(cfg)
    flywheel.run()
    traces = _records(tmp_path / "round" / "data" / "traces.jsonl")
    assert len(traces) == 3 and all(r["task"]["fold"] == "train" for r in traces)
    stats = json.loads((tmp_path / "round" / "datasets" / "simulator" / "stats.json").read_text())
    assert stats["trajectories"]["used"] == 2 + 2 + 3  # the old train and dev episodes, and the harvested ones
    assert stats["inputs"][-1] == str(tmp_path / "round" / "data" / "traces.jsonl")
    assert re.search(r"traces\s+ran\s+[\d.]+\s+[\d.]+\s+3 episodes", flywheel.summary())  # seconds, peak GB

    # the adapters are continued, not started afresh, and the next eval is of the new ones
    assert flywheel.stage("train-decider").config["LoraArguments"]["lora_init"] == "runs/old/decider/adapter"
    assert f"--lora_init {old_simulator}" in flywheel.stage("train-simulator").command
    assert f"decider={tmp_path / 'round' / 'train' / 'decider' / 'adapter'}" in flywheel.stage("eval").command

    # the simulator check: the old and the new simulator on the same rows, the states of the `before` run
    _tiny_adapter(tmp_path / "round" / "train" / "simulator" / "adapter", seed=2)  # as train-simulator leaves it
    check_stage = flywheel.stage("simulator-check")
    assert check_stage.depends == ["train-simulator", "model"] and "eval-model --role simulator" in check_stage.command
    result = check_stage.run()
    out = tmp_path / "round" / "simulator-check"
    check = SimulatorCheck.read(out / "summary.json")
    trajectories = _records(out / "traces.jsonl")
    assert len(trajectories) == 3 and {r["task"]["fold"] for r in trajectories} == {"dev"}  # every episode of it
    assert check.rows == _trained(out / "dataset")["count"] > 0  # every step of them, all in the dev fold
    assert check.both + check.only_before + check.only_after + check.neither == check.rows
    assert check.both + check.only_before == round(check.exact_before * check.rows)
    assert check.both + check.only_after == round(check.exact_after * check.rows)
    assert check.p_value == mcnemar_exact(check.only_before, check.only_after)
    assert 0.0 <= check.token_f1_before <= 1.0 and 0.0 <= check.token_f1_after <= 1.0
    gold = [[r["gold"] for r in _records(out / name / "predictions.jsonl")] for name in ("before", "after")]
    assert gold[0] == gold[1] and len(gold[0]) == check.rows  # paired: the same rows, in the same order
    outputs = [[r["adapter"] for r in _records(out / name / "predictions.jsonl")] for name in ("before", "after")]
    assert outputs[0] != outputs[1]  # each adapter decoded its own predictions
    assert result == check.line() and check.line() in flywheel.summary()
    run_report([before], tmp_path / "report", "round", out / "summary.json")
    report = (tmp_path / "report" / "report.md").read_text()
    assert "### Simulator on the agent's own dev states (paired)" in report
    assert f"| after the round | {check.rows} | " in report


def test_simulator_check_pairs_rows_and_counts_the_discordant_ones(tmp_path) -> None:
    from simplan.workflows.flywheel import SimulatorCheck, paired_exact
    from simplan.workflows.pipeline import StageFailed

    def eval_model_run(name: str, exact: list[bool], golds: list[str]) -> Path:  # what eval-model writes
        run = tmp_path / name
        run.mkdir()
        lines = [json.dumps({"gold": g, "adapter": "x", "adapter_exact": e}) for g, e in zip(golds, exact)]
        (run / "predictions.jsonl").write_text("\n".join(lines) + "\n")
        (run / "metrics.json").write_text(json.dumps({"results": {"adapter": {"token_f1": 0.25}}}))
        return run

    golds = [f"room {i}" for i in range(7)]
    before = eval_model_run("before", [True, True, False, False, False, True, False], golds)
    after = eval_model_run("after", [True, False, True, True, True, True, False], golds)
    check = paired_exact(before, after)
    assert (check.rows, check.both, check.only_before, check.only_after, check.neither) == (7, 2, 1, 3, 1)
    assert check.exact_before == 3 / 7 and check.exact_after == 5 / 7
    assert check.p_value == 2 * (1 + 4) / 2**4  # exact McNemar, two-sided, on 1 vs 3 discordant rows
    assert check.token_f1_before == check.token_f1_after == 0.25
    (tmp_path / "summary.json").write_text(json.dumps(dataclasses.asdict(check)))
    assert SimulatorCheck.read(tmp_path / "summary.json") == check
    assert "42.9% -> 71.4% on 7 rows" in check.line() and "only before 1, only after 3" in check.line()
    table = check.table()
    assert [row[-1] for row in table.rows] == ["1", "3"] and "p = 0.625" in table.note

    other = eval_model_run("other", [True] * 7, [*golds[:6], "room 99"])
    with pytest.raises(StageFailed, match="scored different rows"):
        paired_exact(before, other)


def test_simulator_check_is_skipped_without_before_and_refuses_another_prompt_layout(tmp_path, monkeypatch) -> None:
    from simplan.workflows.flywheel import Flywheel, FlywheelConfig

    monkeypatch.chdir(REPO)
    old = tmp_path / "old-simulator"
    old.mkdir()
    (old / "prompt_settings.json").write_text(json.dumps({"format": "conversation", "budget": 640}))
    keys = {"data": ["d.jsonl"], "decider": "d", "simulator": str(old), "harvest_suite": "toy-train"}
    keys |= {"model": "tiny-llama", "out": str(tmp_path / "round")}
    stage = Flywheel(FlywheelConfig(**keys)).stage("simulator-check")
    assert stage.run().startswith("skipped (no `before` eval run") and not stage.outputs
    flywheel = Flywheel(FlywheelConfig(**keys, before="runs/nowhere", build={"max_prompt_tokens": 384}))
    with pytest.raises(ValueError, match=r"budget: 640 there, 384 here.*set the round's `build` keys"):
        flywheel.stage("simulator-check")
    # An adapter from before verdicts travelled learned none: the round inherits that (both its builds), and a
    # round that asks for verdict lines anyway is refused.
    given = FlywheelConfig(**keys, before="runs/nowhere", build={"max_prompt_tokens": 640})
    same = Flywheel(given)
    assert same.stage("simulator-check").config["contents"] == {"runs/nowhere": "missing"}
    assert same.cfg.build["verdicts"] is False
    assert given.build == {"max_prompt_tokens": 640}  # the caller's config is not written to
    (old / "prompt_settings.json").write_text(json.dumps({"format": "conversation", "budget": 640, "verdicts": True}))
    learned = Flywheel(FlywheelConfig(**keys, before="runs/nowhere", build={"max_prompt_tokens": 640}))
    assert learned.stage("build-simulator").config["build"]["verdicts"] is True  # off by default, on as it learned
    (old / "prompt_settings.json").write_text(json.dumps({"format": "conversation", "budget": 640}))
    verdicts = Flywheel(
        FlywheelConfig(**keys, before="runs/nowhere", build={"max_prompt_tokens": 640, "verdicts": True})
    )
    with pytest.raises(ValueError, match=r"verdicts: False there, True here"):
        verdicts.stage("simulator-check")
    with pytest.raises(ValueError, match=r"simulator_check: \['adapter'\] are set by the flywheel"):
        FlywheelConfig(**keys, simulator_check={"adapter": "x"})


def test_flywheel_toy_recipe_configures_every_stage(monkeypatch) -> None:
    from simplan.core.config import load_configs
    from simplan.workflows.flywheel import FLYWHEEL_STAGES, Flywheel, FlywheelConfig

    monkeypatch.chdir(REPO)
    (cfg,) = load_configs([FlywheelConfig], "recipes/pipeline/flywheel-toy.yaml")
    flywheel = Flywheel(cfg)
    assert flywheel._expected(list(FLYWHEEL_STAGES), list(FLYWHEEL_STAGES)) == list(FLYWHEEL_STAGES)  # all hash
    stages = {name: flywheel.stage(name) for name in FLYWHEEL_STAGES}
    assert "--suite toy-train" in stages["harvest"].command and cfg.decider in stages["harvest"].command
    assert stages["harvest"].depends == ["model"]  # the harvest plays the current adapters on the base model
    assert stages["traces"].depends == ["harvest"] and stages["build-decider"].depends == ["traces", "model"]
    assert f"--dataset {cfg.out}/simulator-check/dataset" in stages["simulator-check"].command
    assert f"--adapter {cfg.simulator}" in stages["simulator-check"].command  # the old simulator, then the new
    assert stages["report"].depends == ["eval", "simulator-check"]
    with pytest.raises(ValueError, match="decider: required"):
        FlywheelConfig(data=["x.jsonl"], simulator="s", harvest_suite="toy-train")


def test_flywheel_twx_recipe_continues_the_demo(monkeypatch) -> None:
    from simplan.core.config import load_configs
    from simplan.workflows.flywheel import FLYWHEEL_STAGES, Flywheel, FlywheelConfig
    from simplan.workflows.pipeline import Pipeline, PipelineConfig

    monkeypatch.chdir(REPO)
    (demo_cfg,) = load_configs([PipelineConfig], "recipes/pipeline/twx-smollm2.yaml")
    (cfg,) = load_configs([FlywheelConfig], "recipes/pipeline/flywheel-twx.yaml")
    demo, flywheel = Pipeline(demo_cfg), Flywheel(cfg)
    # the demo's outputs, by the pipeline's own paths
    assert cfg.data == [str(demo.data("train")), str(demo.data("dev"))] and cfg.before == str(demo.out / "eval")
    assert (cfg.decider, cfg.simulator) == tuple(str(demo.train_dir(r) / "adapter") for r in ("decider", "simulator"))
    # the demo's eval, engine, model and prompt window; 40 more steps with its other train keys
    for key in ("eval", "engine", "model", "suite", "decider_recipe", "simulator_recipe"):
        assert getattr(cfg, key) == getattr(demo_cfg, key), key
    assert {k: v for k, v in cfg.build.items() if k != "oversample"} == demo_cfg.build
    assert set(cfg.build["oversample"]) == set(cfg.harvest_arms)  # the traces' policies: every harvested arm weighed
    assert cfg.arms == ["reactive", "simplan"]
    assert cfg.train["max_steps"] == 40 and set(cfg.train) == set(demo_cfg.train)
    assert set(cfg.estimates) == set(FLYWHEEL_STAGES)
    assert flywheel._expected(list(FLYWHEEL_STAGES), list(FLYWHEEL_STAGES)) == list(FLYWHEEL_STAGES)  # all hash
    harvest = flywheel.stage("harvest").command
    assert "--suite twx-train-small" in harvest and "--episodes 0" in harvest  # all 32 tasks
    assert "--max_steps" not in harvest  # each under its own cap, like the eval
    assert "--suite twx-dev --arms reactive,simplan --episodes 5 " in flywheel.stage("eval").command
    check = flywheel.stage("simulator-check").command
    assert f"--runs {cfg.before}" in check and "--max_prompt_tokens 640" in check and "--limit 120" in check
    assert "--oversample" in flywheel.stage("build-simulator").command and "--oversample" not in check
