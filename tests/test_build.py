"""Dataset building: decider/simulator examples from toy-env trajectories, folds, budget, exports.

.venv/bin/pytest -q tests/test_build.py
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from simplan.data import format as fmt
from simplan.data.build import BuildConfig, FoldLeakError, build
from simplan.data.io import write_jsonl
from simplan.data.trajectory import Step, Trajectory
from simplan.envs.base import Action, Task
from simplan.envs.toy import ToyEnv


# ---------------------------------------------------------------------------------------------
# Fixture: toy trajectories with expert steps, real mistakes (noise) and recoveries, by hand.
# ---------------------------------------------------------------------------------------------
def toy_trajectory(task: Task, noisy: bool = False, random_steps: int = 0, long_obs: int = 0) -> Trajectory:
    """Run the toy expert; when `noisy`, insert an invalid action and a wrong move + its recovery.

    `long_obs` pads every observation with that many filler words (to exercise the token budget).
    """
    env = ToyEnv()
    obs = env.reset(task)
    pad = (" " + " ".join(f"filler{i}" for i in range(long_obs))) if long_obs else ""
    traj = Trajectory(
        id=f"toy/{task.task_id}/{'noisy_expert' if noisy else 'expert'}/0",
        env="toy",
        task=task,
        goal=obs.goal,
        policy="noisy_expert" if noisy else "expert",
        initial_observation=obs.text + pad,
    )
    current = obs

    def act(action: Action, source: str) -> None:
        nonlocal current
        res = env.step(action)
        traj.steps.append(
            Step(
                index=len(traj.steps),
                observation=current.text + pad,
                valid_actions=current.valid_actions,
                action=action,
                source=source,
                next_observation=res.observation.text + pad,
                reward=res.reward,
                score=res.score,
                done=res.done,
                won=res.won,
                error=res.observation.error,
            )
        )
        current = res.observation

    for _ in range(random_steps):  # off-path but valid and state-preserving
        act(Action.command("look"), "random")
    for i, action in enumerate(env.expert_plan()):
        if noisy and i == 1:
            act(Action.command("dance wildly"), "noise")  # invalid: error observation
            if env.pos > 0:
                act(Action.command("go west"), "noise")  # valid but wrong ...
                act(Action.command("go east"), "recovery")  # ... and undone
        act(action, "expert")
    traj.success, traj.final_score = traj.steps[-1].won, traj.steps[-1].score
    return traj


def write_toy(path: Path, folds: dict[str, int], noisy: bool = True, **kw) -> list[Trajectory]:
    env, trajs = ToyEnv(), []
    for fold, n in folds.items():
        for task in env.tasks(fold, limit=n):
            trajs.append(toy_trajectory(task, **kw))
            if noisy:
                trajs.append(toy_trajectory(task, noisy=True, **kw))
    write_jsonl(path, (t.to_dict() for t in trajs))
    return trajs


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from simplan.training.tiny import tiny_model

    return AutoTokenizer.from_pretrained(tiny_model("llama"))


@pytest.fixture(scope="module")
def model_dir():
    from simplan.training.tiny import tiny_model

    return str(tiny_model("llama"))


def _cfg(tmp_path: Path, inputs: list[Path], model: str, **kw) -> BuildConfig:
    """The per-step format unless `format` is given (tests/test_episode.py covers conversations)."""
    kw = {"format": "step", **kw}
    return BuildConfig(inputs=[str(p) for p in inputs], out=str(tmp_path / "out"), model=model, progress=False, **kw)


# ---------------------------------------------------------------------------------------------
# Tests
# ---------------------------------------------------------------------------------------------
def test_decider_targets_are_exactly_the_expert_and_recovery_actions(tmp_path, tokenizer, model_dir):
    from datasets import load_from_disk

    src = tmp_path / "toy.jsonl"
    trajs = write_toy(src, {"train": 4, "dev": 2})
    res = build(_cfg(tmp_path, [src], model_dir, role="decider", dedupe=False), tokenizer=tokenizer)
    dd = load_from_disk(res.paths["dataset"])
    assert sorted(dd) == ["dev", "train"]

    by_traj = {t.id: t for t in trajs}
    rows = [r for fold in dd for r in dd[fold]]
    expected = [(t.id, s.index) for t in trajs for s in t.steps if s.source in ("expert", "recovery")]
    assert sorted((r["trajectory_id"], r["step"]) for r in rows) == sorted(expected)
    noise_steps = sum(s.source == "noise" for t in trajs for s in t.steps)
    assert noise_steps > 0 and res.stats["skipped"]["source_noise"] == noise_steps
    for r in rows:
        step = by_traj[r["trajectory_id"]].steps[r["step"]]
        assert r["completion"] == fmt.render_action(step.action)  # the action, no EOS
        assert r["source"] in ("expert", "recovery") and not r["error"]
        assert r["messages"] == r["prompt"] + [{"role": "assistant", "content": r["completion"]}]
        assert [m["role"] for m in r["prompt"]] == ["system", "user"]
        assert r["prompt_tokens"] == fmt.chat_token_counter(tokenizer)(r["prompt"])
        assert r["prompt_tokens"] <= 1024
    # The step after a mistake shows it in the history and the failure memory, so recovery is learned.
    after = next(r for r in rows if r["source"] == "recovery")
    user = after["prompt"][1]["content"]
    assert "> dance wildly [failed]\nYou can't do that." in user
    assert "- dance wildly -> You can't do that." in user
    recoveries = sum(s.source == "recovery" for t in trajs for s in t.steps)
    assert recoveries > 0 and res.stats["examples"]["by_source"]["recovery"] == recoveries


def test_simulator_learns_every_transition_including_errors(tmp_path, tokenizer, model_dir):
    src = tmp_path / "toy.jsonl"
    trajs = write_toy(src, {"train": 3}, random_steps=2)
    res = build(_cfg(tmp_path, [src], model_dir, role="simulator", dedupe=False), tokenizer=tokenizer)
    from datasets import load_from_disk

    train = load_from_disk(res.paths["dataset"])["train"]
    assert len(train) == sum(len(t.steps) for t in trajs)
    assert set(train["source"]) == {"expert", "noise", "recovery", "random"}
    err = [r for r in train if r["error"]]
    assert err and all(r["completion"] == "You can't do that." for r in err)
    assert "Action: dance wildly" in err[0]["prompt"][1]["content"]
    assert err[0]["prompt"][0]["content"] == fmt.SIMULATOR_SYSTEM
    by_traj = {t.id: t for t in trajs}
    for r in train:
        assert r["completion"] == by_traj[r["trajectory_id"]].steps[r["step"]].next_observation


def test_dedupe_counts_identical_pairs_within_a_fold(tmp_path, tokenizer, model_dir):
    src = tmp_path / "toy.jsonl"
    trajs = write_toy(src, {"train": 2}, noisy=False)
    copy = tmp_path / "copy.jsonl"  # the same episodes under other ids: every example is a duplicate
    write_jsonl(copy, ({**t.to_dict(), "id": t.id + "-again"} for t in trajs))
    res = build(_cfg(tmp_path, [src, copy], model_dir, role="decider"), tokenizer=tokenizer)
    n = sum(len(t.steps) for t in trajs)
    assert res.stats["examples"]["total"] == n
    assert res.stats["dedup"] == {"total": n, "by_fold": {"train": n}}


def test_a_task_in_two_folds_is_an_error_naming_it(tmp_path, tokenizer, model_dir):
    src = tmp_path / "toy.jsonl"
    trajs = write_toy(src, {"train": 2, "dev": 1}, noisy=False)
    leaked = trajs[0].to_dict()
    leaked["id"] += "-leak"
    leaked["task"]["fold"] = "test"
    bad = tmp_path / "leak.jsonl"
    write_jsonl(bad, [leaked])
    with pytest.raises(FoldLeakError, match=r"toy/corridor-0 in test\+train"):
        build(_cfg(tmp_path, [src, bad], model_dir), tokenizer=tokenizer)
    res = build(_cfg(tmp_path, [src], model_dir), tokenizer=tokenizer)  # disjoint folds build fine
    folds = {}
    for fold, n in res.stats["examples"]["by_fold"].items():
        assert n > 0
        rows = [json.loads(line) for line in Path(res.paths[fold]).read_text().splitlines()]
        folds[fold] = {t.task.task_id for t in trajs if t.task.fold == fold}
        assert len(rows) == n
    assert not folds["train"] & folds["dev"]


def test_budget_drops_history_never_completions_and_counts_drops(tmp_path, tokenizer, model_dir):
    src = tmp_path / "toy.jsonl"
    trajs = write_toy(src, {"train": 3}, long_obs=40)
    count = fmt.chat_token_counter(tokenizer)
    budget = 420
    res = build(
        _cfg(tmp_path, [src], model_dir, role="simulator", max_prompt_tokens=budget, dedupe=False),
        tokenizer=tokenizer,
    )
    from datasets import load_from_disk

    train = load_from_disk(res.paths["dataset"])["train"]
    by_traj = {t.id: t for t in trajs}
    assert res.stats["history"]["examples_truncated"] > 0
    for r in train:
        traj = by_traj[r["trajectory_id"]]
        step = traj.steps[r["step"]]
        assert r["completion"] == step.next_observation  # whole, never cut
        assert r["prompt_tokens"] == count(r["prompt"]) <= budget
        assert r["history_kept"] + r["history_dropped"] == r["step"]
        if r["history_dropped"]:  # the longest suffix that fits: one more step would not
            state = fmt.trajectory_states(traj)[r["step"]]
            longer = replace(state, history=state.history[-(r["history_kept"] + 1) :])
            assert count(fmt.simulator_messages(longer, step.action)) > budget
            kept_obs = [h.observation for h in state.history[-r["history_kept"] :]] if r["history_kept"] else []
            assert all(o.strip() in r["prompt"][1]["content"] for o in kept_obs)
    # Too small for even a history-free prompt, or a completion over its budget: dropped and counted, never cut.
    n = sum(len(t.steps) for t in trajs)
    for kw, reason in (
        ({"max_prompt_tokens": 60, "max_completion_tokens": 1000}, "prompt_over_budget"),
        ({"max_completion_tokens": 30}, "completion_over_budget"),
    ):
        res = build(_cfg(tmp_path, [src], model_dir, role="simulator", dedupe=False, **kw), tokenizer=tokenizer)
        assert res.stats["examples"]["total"] == 0
        assert res.stats["dropped"][reason] == n


@pytest.mark.parametrize("guided", [True, False])
def test_batched_fit_matches_fit_to_budget(tokenizer, guided):
    env, states = ToyEnv(), []
    for task in env.tasks("train", limit=4):
        states += fmt.trajectory_states(toy_trajectory(task, noisy=True, random_steps=3, long_obs=25))
    count = fmt.chat_token_counter(tokenizer)
    for budget in (150, 300, 600, 5000):
        fits = fmt.fit_batch_to_budget(
            states,
            fmt.decider_messages,
            fmt.chat_batch_token_counter(tokenizer),
            budget,
            count_texts=fmt.text_token_counter(tokenizer) if guided else None,
        )
        for state, fit in zip(states, fits):
            ref, dropped = fmt.fit_to_budget(state, fmt.decider_messages, count, budget)
            assert (fit.state.history, fit.dropped) == (ref.history, dropped)
            assert fit.tokens == count(fmt.decider_messages(fit.state))
            assert fit.messages == fmt.decider_messages(fit.state)


def test_jsonl_export_and_malformed_lines_are_reported_and_skipped(tmp_path, tokenizer, model_dir, capsys):
    src = tmp_path / "toy.jsonl"
    write_toy(src, {"train": 2}, noisy=False)
    lines = src.read_text().splitlines()
    broken = json.loads(lines[0])
    del broken["steps"][0]["action"]
    src.write_text("\n".join([lines[0], "{not json", json.dumps(broken), lines[1]]) + "\n")
    res = build(_cfg(tmp_path, [src], model_dir, role="decider"), tokenizer=tokenizer)
    assert res.stats["malformed_lines"] == 2
    assert res.stats["problems"][0].startswith(f"{src}:2: not valid JSON")
    assert res.stats["problems"][1] == f"{src}:3: steps[0].action: missing"
    rows = [json.loads(line) for line in Path(res.paths["train"]).read_text().splitlines()]
    assert len(rows) == res.stats["examples"]["total"] > 0
    for row in rows:
        assert list(row) == ["messages"]
        assert [m["role"] for m in row["messages"]] == ["system", "user", "assistant"]
    md = Path(res.paths["stats_md"]).read_text()
    assert "| train |" in md and "malformed lines skipped: 2" in md

    from simplan.scripts.build import main

    out = tmp_path / "cli"
    recipe = tmp_path / "sim.yaml"
    recipe.write_text(f"role: simulator\ninputs: [{src}]\nmodel: {model_dir}\nmax_prompt_tokens: 900\n")
    rc = main(["--config", str(recipe), "--out", str(out), "--progress", "false", "--max-prompt-tokens", "800"])
    printed = capsys.readouterr()
    assert rc == 0
    assert f"{src}:2: not valid JSON" in printed.err
    assert str(out / "dataset") in printed.out and "simulator dataset" in printed.out
    stats = json.loads((out / "stats.json").read_text())
    assert stats["role"] == "simulator" and stats["budget"]["max_prompt_tokens"] == 800  # flags beat the recipe


def test_config_validation_names_the_field():
    with pytest.raises(ValueError, match="role"):
        BuildConfig(role="planner", inputs=["a.jsonl"], out="o")
    with pytest.raises(ValueError, match="sources"):
        BuildConfig(inputs=["a.jsonl"], out="o", sources=["expert", "oracle"])
    with pytest.raises(ValueError, match="inputs"):
        BuildConfig(out="o")
    assert BuildConfig(role="simulator", inputs=["a"], out="o").max_completion_tokens == 384
    assert BuildConfig(inputs=["a"], out="o").sources == ["expert", "recovery"]
