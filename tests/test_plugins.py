"""Plug-in environments: a package simplan has never seen goes through collect -> validate -> build -> eval -> report.

The plugin is examples/simplan-shop (a tool-calling shop with a seeded 503 and sell-outs). The fast tests put
its folder on sys.path and name it `simplan_shop.env:ShopEnv`, or fake its entry point; the slow one installs
it into the venv as a user would (`pip install -e`) and finds it as `shop` from a fresh `simplan` process.
Evaluation uses the model-free engines (`--engine expert` / `random`), so no model is loaded.
"""

from __future__ import annotations

import importlib.metadata
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from simplan.envs import registry
from simplan.envs.base import Action, Task, env_extra
from simplan.envs.check import check_env
from simplan.envs.registry import UnknownEnvError, make_env
from simplan.inference.planning.router import BudgetConfig
from simplan.inference.planning.trace import ActEvent

REPO = Path(__file__).resolve().parents[1]
SHOP = REPO / "examples" / "simplan-shop"
SPEC = "simplan_shop.env:ShopEnv"


def _suite(tmp_path: Path, env: str) -> Path:
    path = tmp_path / "shop-dev.yaml"
    path.write_text(
        f"name: shop-dev\nmax_steps: 12\nentries:\n  - env: '{env}'\n    fold: dev\n    tasks_per_family: 2\n"
    )
    return path


# ---------------------------------------------------------------------------------------------
# Resolving names
# ---------------------------------------------------------------------------------------------
def test_module_class_spec_builds_the_plugin_and_passes_the_check(shop_on_path: None) -> None:
    env = make_env(SPEC)
    assert env.name == "shop" and type(env.unwrapped).__name__ == "ShopEnv"
    assert env_extra(env, "families") == ("kitchen", "office", "outdoor")
    report = check_env(env, fold_sample=5, progress=False)
    assert report.ok, report.table()


def test_unknown_names_say_what_to_do(shop_on_path: None) -> None:
    with pytest.raises(UnknownEnvError, match=r"unknown environment 'shopp'.*toy.*package\.module:Class"):
        make_env("shopp")
    with pytest.raises(UnknownEnvError, match=r"no module 'no_such_pkg'.*pip install -e"):
        make_env("no_such_pkg.env:Env")
    with pytest.raises(UnknownEnvError, match=r"has no attribute 'Shop'; its classes: ShopEnv"):
        make_env("simplan_shop.env:Shop")
    with pytest.raises(UnknownEnvError, match=r"not an environment: it lacks tasks, reset, step"):
        make_env("simplan_shop.env:EnvDefaults")  # imported there: a class, but no Env


def test_entry_point_names_the_env_and_list_shows_its_package(
    shop_on_path: None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from simplan.scripts.envs_cmd import main as envs_main

    ep = importlib.metadata.EntryPoint(name="shop", value=SPEC, group=registry.ENTRY_POINT_GROUP)
    monkeypatch.setattr(registry, "_entry_points", lambda: [ep])
    assert make_env("shop").name == "shop"
    assert envs_main(["list"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^shop +A tool-calling shop", out, re.M) and f"from plugin: unknown package ({SPEC})" in out
    assert "families: kitchen, office, outdoor" in out
    assert envs_main(["check", "shop", "--sample", "2", "--progress", "false"]) == 0
    assert "shop: all checks passed" in capsys.readouterr().out
    assert envs_main(["check", "nope"]) == 2  # an error line, no traceback
    assert "unknown environment 'nope'" in capsys.readouterr().err


def test_shop_503_is_transient_and_stock_can_sell_out(shop_on_path: None) -> None:
    from simplan_shop.env import SERVICE_UNAVAILABLE, ShopEnv, scenario

    env = ShopEnv()
    flaky = next(t for t in env.tasks("train") if scenario(t.params["seed"])["flaky"] == "check_stock")
    env.reset(flaky)
    item = env.expert_plan()[1].arguments["item"]
    first = env.step(Action.tool_call("check_stock", {"item": item}))
    again = env.step(Action.tool_call("check_stock", {"item": item}))
    assert first.observation.error and SERVICE_UNAVAILABLE in first.observation.text
    assert not again.observation.error and json.loads(again.observation.text)["in_stock"] >= 1

    sells = next(t for t in env.tasks("train") if scenario(t.params["seed"])["sellout"])
    s = scenario(sells.params["seed"])
    env.reset(sells)
    calls = [a for a in env.expert_plan() if a.name in ("check_stock", "order")]
    item = calls[0].arguments["item"]
    for _ in range(2):  # past a possible 503 on either tool
        seen = env.step(Action.tool_call("check_stock", {"item": item}))
    assert json.loads(seen.observation.text)["in_stock"] >= s["qty"]  # in stock when checked ...
    for _ in range(2):
        ordered = env.step(Action.tool_call("order", {"item": item, "qty": s["qty"]}))
    assert ordered.observation.error and "sold out" in ordered.observation.text  # ... gone when ordered


def test_shop_without_acceptance_declarations_leaves_finish_unjudged(shop_on_path: None) -> None:
    """`declare_acceptance: false` (a suite's env_kwargs) removes the verdicts the judge reads on a finish."""
    from simplan_shop.env import ShopEnv

    from simplan.envs.failures import env_patterns

    env = make_env(SPEC, declare_acceptance=False)
    assert env_extra(env, "accepts") is None and env_patterns(env, "accept_patterns", ()) == []
    declared = make_env(SPEC)
    assert callable(env_extra(declared, "accepts")) and env_patterns(declared, "accept_patterns", ())
    assert ShopEnv.accept_patterns  # the class keeps its declarations
    task = env.tasks("dev")[0]
    env.reset(task)
    assert env.step(Action(kind="finish")).done and not env.unwrapped._won  # finish() still ends it as it stands


# ---------------------------------------------------------------------------------------------
# Model-free engines and the eval start-up
# ---------------------------------------------------------------------------------------------
def test_expert_engine_wins_reactive_and_random_is_seeded(shop_on_path: None) -> None:
    from simplan.inference.engines import make_engine
    from simplan.inference.planning.planner import Planner, PlannerConfig

    env = make_env(SPEC)
    tasks = env.tasks("dev", limit=6)
    expert = make_engine("expert", "unused")
    results = [
        Planner(expert, env, PlannerConfig(arm="reactive", budgets=BudgetConfig(max_steps=12))).run(t).summary
        for t in tasks
    ]
    assert all(r.success for r in results)
    assert sum(r.invalid_actions for r in results) > 0  # the 503s and sell-outs were met and got past

    def random_actions(task: Task) -> list[str]:
        engine = make_engine("random", "unused")
        trace = Planner(engine, env, PlannerConfig(arm="reactive", budgets=BudgetConfig(max_steps=6))).run(task).trace
        return [e.action for e in trace.events if isinstance(e, ActEvent)]

    runs = [random_actions(t) for t in tasks]
    assert runs == [random_actions(t) for t in tasks]  # seeded: the same actions again
    assert len({tuple(r) for r in runs}) > 1  # ... and seeded per task
    calls = [a for r in runs for a in r]
    assert all(re.fullmatch(r"(search|check_stock|order|ship|finish)\(.*\)", a) for a in calls), calls
    with pytest.raises(ValueError, match="no adapter 'simulator'.*serve only the reactive arm"):
        Planner(expert, env, PlannerConfig(arm="simplan"))


def test_failed_eval_start_writes_nothing_and_the_fix_needs_no_fresh(
    shop_on_path: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from simplan.scripts.eval import main as eval_main

    out = tmp_path / "eval"
    common = ["--suite", str(_suite(tmp_path, SPEC)), "--out", str(out), "--engine", "expert", "--progress", "false"]
    assert eval_main([*common, "--arms", "reactive,simplan"]) == 2
    assert "no adapter 'simulator'" in capsys.readouterr().err
    assert not (out / "eval_config.json").exists() and not (out / "traces.jsonl").exists()
    assert eval_main([*common, "--arms", "reactive"]) == 0  # the corrected command, no --fresh
    results = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert len(results) == 6 and all(r["success"] for r in results)


def test_run_accepts_env_options_as_a_deprecated_alias(shop_on_path: None, tmp_path: Path) -> None:
    from simplan.scripts.run import main as run_main

    trace = tmp_path / "t.jsonl"
    argv = ["--env", "toy", "--engine", "random", "--arm", "reactive", "--view", "none", "--trace", str(trace)]
    with pytest.warns(FutureWarning, match="--env-kwargs"):
        assert run_main([*argv, "--env-options", "{max_rooms: 3}"]) == 0
    assert run_main([*argv, "--env-kwargs", "{max_rooms: 3}"]) == 0
    assert (
        run_main(["--env", SPEC, "--engine", "expert", "--arm", "reactive", "--view", "none", "--trace", str(trace)])
        == 0
    )
    assert run_main(["--env", "nope", "--engine", "expert", "--view", "none"]) == 2


# ---------------------------------------------------------------------------------------------
# The whole path through the CLI mains
# ---------------------------------------------------------------------------------------------
def _pipeline(tmp_path: Path, env: str, capsys: pytest.CaptureFixture[str]) -> None:
    from simplan.models.tiny import tiny_model
    from simplan.scripts.build import main as build_main
    from simplan.scripts.collect import main as collect_main
    from simplan.scripts.eval import main as eval_main
    from simplan.scripts.report import main as report_main
    from simplan.scripts.validate import main as validate_main

    data = tmp_path / "shop.jsonl"
    for fold in ("train", "dev"):
        argv = ["--env", env, "--fold", fold, "--policies", "expert,random", "--limit", "4", "--out", str(data)]
        assert collect_main([*argv, "--progress", "false"]) == 0
    assert validate_main([str(data)]) == 0
    lines = [json.loads(line) for line in data.read_text().splitlines()]
    assert {r["task"]["env"] for r in lines} == {"shop"} and len(lines) == 48  # 4 per family
    assert not [r["error"] for r in lines if r["status"] == "errored"]
    assert all(r["success"] for r in lines if r["policy"] == "expert")

    built = tmp_path / "built"
    flags = ["--inputs", str(data), "--out", str(built), "--model", str(tiny_model("llama")), "--progress", "false"]
    assert build_main(flags) == 0
    stats = json.loads((built / "stats.json").read_text())
    assert stats["role"] == "decider" and (built / "train.jsonl").read_text().strip()

    out = tmp_path / "eval"
    argv = ["--suite", str(_suite(tmp_path, env)), "--arms", "reactive", "--engine", "expert", "--out", str(out)]
    assert eval_main([*argv, "--progress", "false"]) == 0
    assert report_main([str(out), "--out", str(tmp_path / "report")]) == 0
    assert "reactive" in (tmp_path / "report" / "report.md").read_text()
    capsys.readouterr()


def test_plugin_by_module_class_through_the_whole_pipeline(
    shop_on_path: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _pipeline(tmp_path, SPEC, capsys)


def _installed() -> bool:
    return any(ep.name == "shop" for ep in importlib.metadata.entry_points(group=registry.ENTRY_POINT_GROUP))


@pytest.mark.slow
def test_installed_plugin_is_found_by_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """pip install -e examples/simplan-shop (once, into this venv), then `shop` works in a fresh process."""
    if not _installed():
        pip = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", "-e", str(SHOP)]
        subprocess.run(pip, check=True, timeout=300, capture_output=True)
    cli = [sys.executable, "-m", "simplan.scripts.cli", "envs"]
    listed = subprocess.run([*cli, "list"], capture_output=True, text=True, timeout=120)
    assert listed.returncode == 0, listed.stderr
    assert "from plugin: simplan-shop 0.1.0 (simplan_shop.env:ShopEnv)" in listed.stdout
    checked = subprocess.run(
        [*cli, "check", "shop", "--progress", "false"], capture_output=True, text=True, timeout=120
    )
    assert checked.returncode == 0 and "shop: all checks passed" in checked.stdout, checked.stdout + checked.stderr
    # This process read the venv's .pth files before the install: it sees the entry point, not yet the module.
    importlib.invalidate_caches()
    monkeypatch.syspath_prepend(str(SHOP))
    _pipeline(tmp_path, "shop", capsys)
