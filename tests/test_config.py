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
