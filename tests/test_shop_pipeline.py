"""The tool-calling pipeline of issue 20 on the example plugin shop: its recipes resolve; shop-tiny runs end to end.

    .venv/bin/pytest -q tests/test_shop_pipeline.py     # ~15 s: the recipes, then shop-tiny with a tiny model

The shop is put on sys.path and named `simplan_shop.env:ShopEnv` (as tests/test_plugins.py does), so the tests
need no `pip install -e examples/simplan-shop`; the recipes name it `shop`, as an installed plugin.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from simplan.core.config import parse_config
from simplan.evaluation.suites import load_suite, suite_tasks
from simplan.scripts.pipeline import main
from simplan.workflows import pipeline as pl

REPO = Path(__file__).resolve().parents[1]
SPEC = "simplan_shop.env:ShopEnv"


@pytest.fixture
def shop_on_path(shop_on_path: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """conftest's shop_on_path, run from the repository root (the recipes name repository paths)."""
    monkeypatch.chdir(REPO)


def _suite(tmp_path: Path, families: list[str] | None = None) -> Path:
    """recipes/suites/shop-dev-faults.yaml with the shop named by its class (and fewer families if given)."""
    suite = yaml.safe_load((REPO / "recipes" / "suites" / "shop-dev-faults.yaml").read_text())
    for entry in suite["entries"]:
        entry["env"] = SPEC
        if families:
            entry["families"] = families
    path = tmp_path / "shop-dev-faults.yaml"
    path.write_text(yaml.safe_dump(suite))
    return path


def test_shop_recipes_resolve_to_a_paired_faulty_dev_suite_and_the_shop_adapters(shop_on_path, tmp_path) -> None:
    argv = ["--config", "recipes/pipeline/shop-smollm2.yaml", "--out", str(tmp_path / "p")]
    (cfg,) = parse_config([pl.PipelineConfig], argv)
    pipeline = pl.Pipeline(cfg)
    pipeline.model_path = "/models/smollm2"
    decider = pipeline.stage("train-decider").config["TrainArguments"]
    simulator = pipeline.stage("train-simulator").config["TrainArguments"]
    assert (decider["max_steps"], simulator["max_steps"]) == (80, 100)  # the shop recipes' own sizes
    assert pipeline.stage("train-decider").command.startswith(
        "simplan train --config recipes/smollm2-135m-instruct/shop/decider.yaml "
    )
    train = pipeline.stage("collect-train").config["collect"]
    assert train["policies"] == ["expert", "noisy_expert", "random"] and train["branches"] == 2
    assert "limit" not in train  # every train task
    assert pipeline.stage("eval").config["eval"]["arms"] == ["reactive", "simplan"]  # its keys are checked too

    suite = load_suite(cfg.suite)
    tasks = [t for _, ts in suite_tasks(suite) for t in ts]
    assert len(tasks) >= 40 and {t.fold for t in tasks} == {"dev"}
    assert suite.entries[0].faults.transient > 0 and suite.entries[0].step_cap is not None
    from simplan_shop.env import scenario

    shown = [scenario(t.params["seed"]) for t in tasks]
    assert sum(s["flaky"] is not None for s in shown) >= 30 and sum(s["sellout"] for s in shown) >= 15


def test_shop_tiny_pipeline_end_to_end(shop_on_path, tmp_path) -> None:
    out = tmp_path / "shop-tiny"
    # Two families (2 tasks) keep the run short.
    suite = _suite(tmp_path, families=["kitchen", "office"])
    argv = ["--config", "recipes/pipeline/shop-tiny.yaml", "--out", str(out), "--env", SPEC, "--suite", str(suite)]
    assert main(argv) == 0

    # Collection kept the expert's retry of a 503 and its switch to the other variant after a sell-out.
    expert = [json.loads(line) for line in (out / "data" / "train.jsonl").read_text().splitlines()]
    expert = [t for t in expert if t["policy"] == "expert"]
    pairs = [(a, b) for t in expert for a, b in zip(t["steps"], t["steps"][1:])]
    assert any("503" in a["next_observation"] and a["action"] == b["action"] and not b["error"] for a, b in pairs)
    assert any("sold out" in a["next_observation"] and b["action"]["name"] == "check_stock" for a, b in pairs)

    # The decider trains that retry, and no window remembers the 503 as a failure to avoid.
    rows = [json.loads(line) for line in (out / "datasets" / "decider" / "train.jsonl").read_text().splitlines()]
    retried = 0
    for row in rows:
        msgs = row["messages"]
        assert "503" not in msgs[0]["content"]
        for i in range(3, len(msgs)):
            if msgs[i]["role"] == "assistant" and msgs[i].get("weight") and "503" in msgs[i - 1]["content"]:
                retried += msgs[i]["content"] == msgs[i - 2]["content"]
    assert retried >= 1
    settings = json.loads((out / "train" / "decider" / "adapter" / "prompt_settings.json").read_text())
    assert settings["budget"] == 1024

    # Every arm ran the same 2 tasks under the suite's transient faults, and the report pairs them.
    results = [json.loads(line) for line in (out / "eval" / "results.jsonl").read_text().splitlines()]
    assert len(results) == 6 and {r["arm"] for r in results} == {"reactive", "plan", "simplan"}
    assert json.loads((out / "eval" / "eval_config.json").read_text())["suite"]["entries"][0]["faults"]["transient"]
    report = (out / "report" / "report.md").read_text()
    assert all(f"| {arm} |" in report for arm in ("reactive", "plan", "simplan"))


def test_bfcl_recipes_train_and_evaluate_on_the_same_compact_tools(tmp_path) -> None:
    from simplan.evaluation.runner import EvalConfig
    from simplan.inference.engines.config import EngineConfig

    argv = ["--config", str(REPO / "recipes/pipeline/bfcl-smollm2.yaml"), "--out", str(tmp_path / "p")]
    (cfg,) = parse_config([pl.PipelineConfig], argv)
    pipeline = pl.Pipeline(cfg)
    pipeline.model_path = "/models/smollm2"
    collected = [pipeline.stage(f"collect-{fold}").config["collect"] for fold in ("train", "dev")]
    suite = load_suite(cfg.suite)
    assert all(c["env_kwargs"] == {"compact_tools": True} for c in collected)
    assert [e.env_kwargs for e in suite.entries] == [{"compact_tools": True}]  # rendered as the adapters saw it
    assert len(suite.entries[0].families or []) == 4 and suite.entries[0].tasks_per_family == 3
    decider = pipeline.stage("train-decider").config
    assert decider["TrainArguments"]["max_steps"] == 32 and decider["DataArguments"]["max_length"] == 3584
    assert pipeline.stage("eval").config["eval"]["arms"] == ["reactive"]
    # the base model's run, as the recipe's comment gives it: same suite, no adapters
    base = ["--suite", "bfcl-dev-cpu", "--arms", "reactive", "--engine", "hf", "--model", "smollm2-135m-instruct"]
    eval_cfg, engine_cfg = parse_config([EvalConfig, EngineConfig], [*base, "--out", str(tmp_path / "base")])
    assert eval_cfg.suite == cfg.suite and not engine_cfg.adapters
