"""Suites: every arm runs the same tasks with the same step cap; caps come from the expert's path or stay flat."""

from __future__ import annotations

import json

import pytest
from test_evaluate import greedy_engine  # pytest puts tests/ on sys.path (rootdir-relative imports)

from simplan.core.errors import InputError
from simplan.envs.base import Task
from simplan.envs.toy import ToyEnv
from simplan.evaluation.runner import EvalConfig, evaluate, plan_episodes, resolve_suite
from simplan.evaluation.suites import StepCap, SuiteEntry, entry_tasks_with_caps, load_suite, task_step_caps
from simplan.inference.planning.trace import read_traces

# Toy corridor seed s: 3 + s % 3 rooms; the expert walks east through them, takes the key and opens the
# door: rooms + 1 actions. corridor-100: 4 rooms -> 5 steps; -101: 5 rooms -> 6; -102: 3 rooms -> 4.
EXPERT_STEPS = {"corridor-100": 5, "corridor-101": 6, "corridor-102": 4}


def _suite(tmp_path, extra: str) -> str:
    path = tmp_path / "capped.yaml"
    path.write_text(f"name: capped\nmax_steps: 7\n{extra}\nentries:\n  - env: toy\n    tasks_per_family: 3\n")
    return str(path)


def test_step_cap_is_twice_the_expert_path_plus_ten(tmp_path) -> None:
    suite = load_suite(_suite(tmp_path, "step_cap: {factor: 2, plus: 10}"))
    caps = {t.task_id: cap for t, cap in entry_tasks_with_caps(suite.entries[0])}
    assert caps == {"corridor-100": 2 * 5 + 10, "corridor-101": 2 * 6 + 10, "corridor-102": 2 * 4 + 10}
    assert StepCap(factor=1.5, plus=0).cap(5) == 8  # rounded up: the cap never cuts under factor x expert
    flat = load_suite(_suite(tmp_path, ""))
    assert {cap for _, cap in entry_tasks_with_caps(flat.entries[0])} == {7}


def test_every_arm_runs_the_same_tasks_with_the_same_cap(tmp_path) -> None:
    cfg = EvalConfig(suite=_suite(tmp_path, "step_cap: {factor: 2, plus: 10}"), out=str(tmp_path / "r"))
    specs = plan_episodes(resolve_suite(cfg), ["reactive", "plan", "simplan"], repeats=2)
    by_arm: dict[str, list[tuple[str, int, str, int]]] = {}
    for s in specs:
        by_arm.setdefault(s.arm, []).append((s.task.task_id, s.repeat, s.fault_key, s.max_steps))
    assert len(by_arm) == 3 and len(by_arm["reactive"]) == 3 * 2
    assert by_arm["reactive"] == by_arm["plan"] == by_arm["simplan"]
    assert {(t, cap) for t, _, _, cap in by_arm["plan"]} == {(t, 2 * n + 10) for t, n in EXPERT_STEPS.items()}


def test_eval_runs_each_task_under_its_own_cap(tmp_path) -> None:
    cfg = EvalConfig(
        suite=_suite(tmp_path, "step_cap: {factor: 1, plus: 0}"),  # exactly the expert's length
        arms=["reactive", "simplan"],
        out=str(tmp_path / "run"),
        progress=False,
        planner={"max_history": 50},
    )
    evaluate(cfg, greedy_engine(), concurrency=2)
    traces = read_traces(tmp_path / "run" / "traces.jsonl")
    assert len(traces) == 6
    for t in traces:
        assert t.of_type("start")[0].budgets["max_steps"] == EXPERT_STEPS[t.task["task_id"]]
    recorded = json.loads((tmp_path / "run" / "eval_config.json").read_text())["step_caps"]
    assert recorded == {f"capped/toy/{t}/0": n for t, n in EXPERT_STEPS.items()}


def test_a_flat_max_steps_replaces_the_step_cap(tmp_path) -> None:
    path = _suite(tmp_path, "step_cap: {factor: 2, plus: 10}")
    suite = resolve_suite(EvalConfig(suite=path, max_steps=12, out=str(tmp_path / "r")))
    assert suite.entries[0].step_cap is None
    assert {cap for _, cap in entry_tasks_with_caps(suite.entries[0])} == {12}
    over = resolve_suite(EvalConfig(suite=_suite(tmp_path, ""), step_cap={"factor": 3}, out=str(tmp_path / "r")))
    assert over.entries[0].step_cap == StepCap(factor=3, plus=10)
    with pytest.raises(ValueError, match="give one step cap"):
        EvalConfig(suite=path, max_steps=12, step_cap={"factor": 2})


def test_bad_step_caps_name_the_field(tmp_path) -> None:
    with pytest.raises(ValueError, match=r"capped.yaml: entries\[0\]: step_cap: unknown key\(s\) \['times'\]"):
        load_suite(_suite(tmp_path, "step_cap: {times: 2}"))
    with pytest.raises(ValueError, match="step_cap.factor: must be >= 1"):
        StepCap(factor=0.5)
    with pytest.raises(ValueError, match="step_cap.plus"):
        StepCap(plus=-1)


def test_a_suite_that_is_not_yaml_names_its_file(tmp_path) -> None:
    bad = tmp_path / "vague.yaml"
    bad.write_text("name: vague\ndescription: no one to ask: a guess\nentries: [{env: toy, fold: dev}]\n")
    with pytest.raises(InputError, match=r"vague.yaml: not valid YAML \(.*line 2.*\); fix the suite file"):
        load_suite(str(bad))


class NoExpertEnv(ToyEnv):
    def expert_plan(self):
        raise RuntimeError("no gold path for this seed")


def test_a_task_without_an_expert_plan_keeps_the_flat_cap() -> None:
    entry = SuiteEntry(env="toy", max_steps=9, step_cap=StepCap())
    tasks = [Task(env="toy", task_id="corridor-100", fold="dev", family="corridor", params={"seed": 100})]
    with pytest.warns(UserWarning, match="toy/corridor-100: no expert plan .*no gold path"):
        assert task_step_caps(entry, tasks, NoExpertEnv()) == {"corridor-100": 9}


def test_flat_cap_suites_keep_their_recorded_identity(tmp_path) -> None:
    # eval_config.json of runs made before step_cap existed holds entries without the key: they must still resume
    flat = load_suite(_suite(tmp_path, "")).to_dict()["entries"][0]
    assert "step_cap" not in flat and flat["max_steps"] == 7
    capped = load_suite(_suite(tmp_path, "step_cap: {factor: 2, plus: 10}")).to_dict()["entries"][0]
    assert capped["step_cap"] == {"factor": 2, "plus": 10}
