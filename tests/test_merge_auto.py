"""`merge_adapters: auto` (inference/engines/config.py resolve_merge): merged adapters on the CPU, else multi-LoRA.

    .venv/bin/pytest -q tests/test_merge_auto.py

The resolution cases use a tiny random model folder and adapter folders that only need an
adapter_config.json; the platform (CUDA, the vLLM build) is monkeypatched. The last test runs
`simplan eval` with the default engine settings on a tiny model with two random adapters: on the CPU
it must serve them merged, into the test session's merge cache (tests/conftest.py), and record it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from simplan.inference.engines import config as engine_config
from simplan.inference.engines.config import EngineConfig, HFOptions, parse_merge, resolve_merge


@pytest.fixture(scope="module")
def base() -> str:
    from simplan.models.tiny import tiny_model

    return str(tiny_model("llama", final_norm=1.0))


@pytest.fixture
def adapters(tmp_path: Path) -> str:
    """Two folders that look like peft adapters to resolve_merge (it reads nothing else)."""
    for name in ("decider", "simulator"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "adapter_config.json").write_text(json.dumps({"r": 8}))
    return f"decider={tmp_path / 'decider'},simulator={tmp_path / 'simulator'}"


@pytest.fixture
def no_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


@pytest.mark.parametrize(
    ("given", "want"),
    [
        ("auto", "auto"),
        ("AUTO", "auto"),
        (True, True),
        (False, False),
        ("true", True),
        ("True", True),
        ("yes", True),
        ("1", True),
        ("false", False),
        ("off", False),
        ("0", False),
    ],
)
def test_parse_merge_reads_auto_and_both_spellings_of_booleans(given, want):
    got = parse_merge(given)
    assert got == want and type(got) is type(want)  # True, not "true" nor 1
    assert EngineConfig(merge_adapters=given).merge_adapters == want


def test_a_bad_merge_value_names_the_field():
    for bad in ("maybe", "none", ""):
        with pytest.raises(ValueError, match=r"merge_adapters: .* is not auto, true or false"):
            EngineConfig(merge_adapters=bad)
    assert EngineConfig().merge_adapters == "auto"


def test_auto_merges_hf_on_the_cpu_with_local_folders(base, adapters, no_cuda):
    for device in ("cpu", "auto"):  # auto: no CUDA here, so the CPU
        choice = resolve_merge(EngineConfig(engine="hf", model=base, adapters=adapters, hf=HFOptions(device=device)))
        assert choice.merge and choice.reason == "CPU, auto"
        assert choice.line() == "engine: merged adapters (CPU, auto)"


def test_auto_keeps_multi_lora_on_a_gpu(base, adapters, monkeypatch):
    import torch

    choice = resolve_merge(EngineConfig(engine="hf", model=base, adapters=adapters, hf=HFOptions(device="cuda:0")))
    assert not choice.merge and "cuda:0" in choice.reason
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert not resolve_merge(
        EngineConfig(engine="hf", model=base, adapters=adapters, hf=HFOptions(device="auto"))
    ).merge


def test_auto_follows_the_vllm_build(base, adapters, monkeypatch):
    cfg = EngineConfig(engine="vllm", model=base, adapters=adapters)
    monkeypatch.setattr(engine_config, "vllm_on_cpu", lambda: True)
    assert resolve_merge(cfg).merge
    monkeypatch.setattr(engine_config, "vllm_on_cpu", lambda: False)
    choice = resolve_merge(cfg)
    assert not choice.merge and "GPU" in choice.reason


def test_auto_does_not_merge_what_it_cannot(base, adapters, tmp_path, no_cuda):
    hub = resolve_merge(
        EngineConfig(engine="hf", model="someorg/not-a-folder", adapters=adapters, hf=HFOptions(device="cpu"))
    )
    assert not hub.merge and "not a local folder" in hub.reason  # no error: multi-LoRA loads it from the hub
    (tmp_path / "bare").mkdir()  # no adapter_config.json: multi-LoRA reports the bad folder itself
    bare = resolve_merge(
        EngineConfig(engine="hf", model=base, adapters=f"decider={tmp_path / 'bare'}", hf=HFOptions(device="cpu"))
    )
    assert not bare.merge and "peft folder" in bare.reason
    assert not resolve_merge(EngineConfig(engine="hf", model=base, hf=HFOptions(device="cpu"))).merge  # no adapters
    served = resolve_merge(EngineConfig(engine="openai", adapters="decider,simulator"))
    assert not served.merge and "openai" in served.reason
    assert not resolve_merge(EngineConfig(engine="expert")).merge


def test_explicit_values_win_over_the_platform(base, adapters, no_cuda):
    on_gpu = EngineConfig(
        engine="hf", model=base, adapters=adapters, hf=HFOptions(device="cuda:0"), merge_adapters="true"
    )
    assert resolve_merge(on_gpu).merge and resolve_merge(on_gpu).reason == "merge_adapters: true"
    on_cpu = EngineConfig(engine="hf", model=base, adapters=adapters, hf=HFOptions(device="cpu"), merge_adapters=False)
    assert not resolve_merge(on_cpu).merge and resolve_merge(on_cpu).reason == "merge_adapters: false"
    with pytest.raises(ValueError, match="merge_adapters: the openai engine cannot merge"):
        EngineConfig(engine="openai", merge_adapters="true")
    assert not resolve_merge(EngineConfig(engine="openai", merge_adapters="false")).merge


def test_recipes_and_flags_give_the_same_values_and_keep_stage_hashes(tmp_path):
    """A recipe's `merge_adapters: true` stays the bool True, as before `auto`: the pipeline hashes the fields
    that differ from their defaults, so a finished eval stage that set it is not run again."""
    from simplan.core.config import parse_config
    from simplan.workflows.pipeline import changed_fields

    recipe = tmp_path / "engine.yaml"
    recipe.write_text("engine: hf\nmerge_adapters: true\n")
    (from_yaml,) = parse_config([EngineConfig], ["--config", str(recipe)])
    assert from_yaml.merge_adapters is True and changed_fields(from_yaml) == {"merge_adapters": True}
    (from_flag,) = parse_config([EngineConfig], ["--config", str(recipe), "--merge_adapters", "false"])
    assert from_flag.merge_adapters is False
    (bare,) = parse_config([EngineConfig], ["--merge_adapters"])  # a bare flag means true, as for a plain bool
    assert bare.merge_adapters is True
    (word,) = parse_config([EngineConfig], ["--merge-adapters", "auto"])
    assert word.merge_adapters == "auto"
    (default,) = parse_config([EngineConfig], [])
    assert default.merge_adapters == "auto" and "merge_adapters" not in changed_fields(default)


def test_simplan_eval_with_default_engine_settings_merges_on_the_cpu(base, tmp_path, merge_cache, capsys, no_cuda):
    from test_merged import SETTINGS, make_adapter  # pytest puts tests/ on sys.path

    from simplan.inference.engines.merged import MANIFEST, merged_folder
    from simplan.models.registry import cache_dir
    from simplan.scripts.eval import main as eval_main

    # seeds of their own: no other test's merge of the same content is in the session's merge cache
    decider = make_adapter(base, tmp_path / "decider", seed=11, settings=SETTINGS)
    simulator = make_adapter(base, tmp_path / "simulator", seed=12, settings=SETTINGS)
    out = tmp_path / "eval"
    argv = ["--suite", "toy-dev", "--arms", "reactive", "--limit", "1", "--max_steps", "1", "--progress", "false"]
    argv += ["--model", base, "--adapters", f"decider={decider},simulator={simulator}", "--out", str(out)]
    argv += ["--dtype", "float32", "--threads", "1", "--planner", "{decider_max_tokens: 4, simulator_max_tokens: 4}"]
    assert eval_main(argv) == 0  # no --engine, no --merge_adapters: the defaults, hf and auto
    assert "engine: merged adapters (CPU, auto)" in capsys.readouterr().out
    assert json.loads((out / "eval_config.json").read_text())["engine"]["merge_adapters"] is True
    (invocation,) = json.loads((out / "run.json").read_text())["invocations"]
    assert invocation["engine"]["merge_adapters"] is True
    for adapter in (decider, simulator):  # merged into the session's cache (tests/conftest.py), not the user's
        folder = merged_folder(base, adapter)
        assert folder.parent == merge_cache and (folder / MANIFEST).is_file()
        assert not (cache_dir() / "merged" / folder.name).exists()
