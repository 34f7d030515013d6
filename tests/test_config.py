"""scripts/config.py: YAML recipe defaults, command-line overrides, validation errors."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from simplan.scripts.config import parse_config


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
