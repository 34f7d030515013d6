"""core/config.py: YAML recipe defaults, command-line overrides, validation errors."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from simplan.core.config import comma_list, parse_config


@dataclass
class Alpha:
    lr: float = field(default=1e-4, metadata={"help": "learning rate"})
    targets: list[str] = field(default_factory=lambda: ["q_proj"], metadata={"help": "modules"})

    def __post_init__(self) -> None:
        if self.lr <= 0:
            raise ValueError(f"lr: must be > 0, got {self.lr}")


@dataclass
class Beta:
    name: str = field(default="x", metadata={"help": "a name"})
    bf16: bool = field(default=False, metadata={"help": "use bf16"})
    limit: int | None = field(default=None, metadata={"help": "cap"})


def test_yaml_defaults_then_flags_win(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("lr: 0.001\nname: from-yaml\nlimit: 5\n")
    a, b = parse_config([Alpha, Beta], ["--config", str(recipe), "--name", "cli", "--bf16", "--targets", "q,v"])
    assert a.lr == 0.001 and a.targets == ["q", "v"]
    assert b.name == "cli" and b.bf16 is True and b.limit == 5
    (_, b2) = parse_config([Alpha, Beta], ["--limit", "none", "--bf16", "false"])
    assert b2.limit is None and b2.bf16 is False


def test_unknown_key_and_bad_value_are_clear_errors(tmp_path, capsys):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("lr: 0.001\nlearning_rate: 3\n")
    with pytest.raises(SystemExit):
        parse_config([Alpha, Beta], ["--config", str(recipe)])
    assert "unknown key 'learning_rate'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse_config([Alpha, Beta], ["--lr", "-1"])
    assert "lr: must be > 0, got -1.0" in capsys.readouterr().err


def test_a_comma_string_is_the_same_list_in_a_recipe_a_python_call_and_on_the_command_line(tmp_path):
    from simplan.data.build import BuildConfig
    from simplan.data.collect import CollectConfig
    from simplan.workflows.harvest import TracesConfig

    assert comma_list("a,,b,") == ["a", "b"] and comma_list("") == []  # empty items dropped
    assert comma_list("a, b") == ["a", " b"]  # not stripped, as the command line reads `--flag "a, b"`
    assert comma_list(["x,y"]) == ["x,y"]  # a list is already the list
    collect = CollectConfig(env="toy", policies="expert,,noisy_expert", families="a,b,")
    assert collect.policies == ["expert", "noisy_expert"] and collect.families == ["a", "b"]
    assert CollectConfig(env="toy").families is None  # unset stays unset (all families)
    assert BuildConfig(inputs="a.jsonl,b.jsonl,", out="x").inputs == ["a.jsonl", "b.jsonl"]
    traces = TracesConfig(runs="r1,,r2", arms="reactive,simplan", out="t.jsonl")
    assert traces.runs == ["r1", "r2"] and traces.arms == ["reactive", "simplan"]
    assert TracesConfig(runs="r1", out="t.jsonl").arms is None  # every arm

    recipe = tmp_path / "r.yaml"
    recipe.write_text("inputs: a.jsonl,b.jsonl,\nout: x\n")  # a YAML string, split by the config itself
    (from_recipe,) = parse_config([BuildConfig], ["--config", str(recipe)])
    (from_flags,) = parse_config([BuildConfig], ["--inputs", "a.jsonl,b.jsonl,", "--out", "x"])
    assert from_recipe.inputs == from_flags.inputs == ["a.jsonl", "b.jsonl"]


# ---------------------------------------------------------------------------------------------
# Sections, dotted flags, typed recipes and the flat keys of before
# ---------------------------------------------------------------------------------------------
def test_sections_take_dotted_flags_and_nested_or_dotted_recipe_keys(tmp_path):
    from simplan.inference.planning.config import PlannerConfig

    recipe = tmp_path / "r.yaml"
    recipe.write_text("arm: plan\njudge: {error: -3}\nbudgets.max_steps: 9\n")
    (cfg,) = parse_config([PlannerConfig], ["--config", str(recipe), "--judge.lost", "-5", "--router.rule", "both"])
    assert (cfg.arm, cfg.judge.error, cfg.judge.lost, cfg.budgets.max_steps) == ("plan", -3.0, -5.0, 9)
    assert cfg.router.rule == "both" and cfg.judge.won == 10.0  # untouched fields keep their defaults
    assert cfg.k == 3 and cfg.horizon == 5  # the arm preset fills what is unset


def test_flat_keys_of_before_are_read_as_their_sections(tmp_path, capsys):
    """Recipes, flags and mappings written before PlannerConfig and EngineConfig had sections still work."""
    from simplan.core.config import upgrade_keys
    from simplan.inference.engines.config import EngineConfig
    from simplan.inference.planning.config import PlannerConfig

    old = {"w_error": -3, "max_steps": 7, "router": "selective", "router_rule": "both", "simulator_max_tokens": 64}
    cfg = PlannerConfig.from_dict(old)
    assert (cfg.judge.error, cfg.budgets.max_steps, cfg.router.mode, cfg.router.rule) == (-3.0, 7, "selective", "both")
    assert cfg.sampling.simulator_max_tokens == 64
    assert upgrade_keys(PlannerConfig, {"family_budgets": {"coin": {"k": 1}}}) == {
        "budgets": {"family": {"coin": {"k": 1}}}
    }
    (flagged,) = parse_config([PlannerConfig], ["--w_error", "-4", "--max_history", "50"])
    assert flagged.judge.error == -4.0 and flagged.prompts.max_history == 50
    (e,) = parse_config([EngineConfig], ["--engine", "vllm", "--kv_cache_gib", "3", "--batch_size", "4"])
    assert e.vllm.kv_cache_gib == 3 and e.hf.batch_size == 4


def test_a_mapping_field_takes_dotted_flags_over_its_yaml_value():
    from simplan.evaluation.runner import EvalConfig

    (cfg,) = parse_config([EvalConfig], ["--planner", "{k: 2, judge: {won: 5}}", "--planner.judge.error", "-3"])
    assert cfg.planner == {"k": 2, "judge": {"won": 5, "error": -3}}
    with pytest.raises(SystemExit):
        parse_config([EvalConfig], ["--nosuch.key", "1"])


def test_recipe_values_are_read_by_the_field_type(tmp_path, capsys):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("lr: 1e-4\ntargets: q_proj\nlimit: none\nbf16: 'yes'\n")  # YAML reads 1e-4 as text
    a, b = parse_config([Alpha, Beta], ["--config", str(recipe)])
    assert a.lr == 1e-4 and isinstance(a.lr, float) and a.targets == ["q_proj"]  # not split into characters
    assert b.limit is None and b.bf16 is True
    recipe.write_text("limit: many\n")
    with pytest.raises(SystemExit):
        parse_config([Alpha, Beta], ["--config", str(recipe)])
    assert "limit: expected an integer" in capsys.readouterr().err


def test_an_eval_folder_written_with_flat_planner_keys_resumes(tmp_path):
    import json

    from simplan.evaluation.runner import canonical_planner_keys, check_identity

    new = canonical_planner_keys({"planner": {"sampling": {"simulator_max_tokens": 64}}, "arm_overrides": {}})
    old = {"planner": {"simulator_max_tokens": 64}, "arm_overrides": {}}
    (tmp_path / "eval_config.json").write_text(json.dumps({"identity": old}))
    check_identity(tmp_path, new)  # the same evaluation under today's keys: no refusal
    with pytest.raises(ValueError, match="different evaluation"):
        check_identity(tmp_path, canonical_planner_keys({"planner": {"k": 5}, "arm_overrides": {}}))


def test_a_finished_pipeline_eval_marker_of_before_is_still_its_stage():
    from simplan.workflows.pipeline import eval_stage_config, upgrade_eval_stage_config

    old = {
        "eval": {"planner": {"simulator_max_tokens": 64}, "max_steps": 25, "out": "x"},
        "engine": {"engine": "hf", "dtype": "bfloat16", "batch_size": 8, "concurrency": 12},
    }
    from simplan.core.config import load_configs
    from simplan.evaluation.runner import EvalConfig
    from simplan.inference.engines.config import EngineConfig

    today = {"planner": {"sampling": {"simulator_max_tokens": 64}}, "max_steps": 25, "out": "x", "concurrency": 12}
    today_engine = {"engine": "hf", "dtype": "bfloat16", "hf": {"batch_size": 8}}
    eval_cfg, engine_cfg = load_configs([EvalConfig, EngineConfig], None, {**today, **today_engine})
    assert upgrade_eval_stage_config(old) == eval_stage_config(eval_cfg, engine_cfg)


def test_each_backends_options_are_declared_once():
    """make_engine accepts exactly a backend's section fields (+ dtype/threads/merge for local ones), and each is a
    parameter of the backend's constructor: the three can no longer drift apart."""
    import inspect

    from simplan.inference.engines import accepted_options
    from simplan.inference.engines.hf_peft import HFPeftEngine
    from simplan.inference.engines.model_free import ModelFreeEngine
    from simplan.inference.engines.openai_client import OpenAIEngine
    from simplan.inference.engines.vllm_local import VLLMEngine

    constructors = {"hf": HFPeftEngine, "vllm": VLLMEngine, "openai": OpenAIEngine, "random": ModelFreeEngine}
    for kind, cls in constructors.items():
        params = set(inspect.signature(cls.__init__).parameters) | {"merge_adapters"}
        assert set(accepted_options(kind)) <= params, kind
    assert accepted_options("expert") == ()
