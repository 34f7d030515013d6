"""Dataset building: decider/simulator examples from toy-env trajectories, folds, budget, exports.

.venv/bin/pytest -q tests/test_build.py
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest

from simplan.core.io import write_jsonl
from simplan.data import format as fmt
from simplan.data.build import BuildConfig, build
from simplan.data.build_inputs import FoldLeakError, MalformedInputError
from simplan.data.trajectory import Step, Trajectory
from simplan.envs.actions import render_action
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

    from simplan.models.tiny import tiny_model

    return AutoTokenizer.from_pretrained(tiny_model("llama"))


@pytest.fixture(scope="module")
def model_dir():
    from simplan.models.tiny import tiny_model

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
        assert r["completion"] == render_action(step.action)  # the action, no EOS
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
    res = build(_cfg(tmp_path, [src], model_dir, role="simulator", dedupe=False, verdicts=True), tokenizer=tokenizer)
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
        step = by_traj[r["trajectory_id"]].steps[r["step"]]
        verdict = ("\n[episode over: won]" if step.won else "\n[episode over: lost]") if step.done else ""
        assert r["completion"] == step.next_observation + verdict  # the episode's end says how it ended
    assert sum(r["completion"].endswith("[episode over: won]") for r in train) == sum(t.success for t in trajs) > 0


def test_dedupe_counts_identical_pairs_within_a_fold(tmp_path, tokenizer, model_dir):
    src = tmp_path / "toy.jsonl"
    trajs = write_toy(src, {"train": 2}, noisy=False)
    copy = tmp_path / "copy.jsonl"  # the same episodes under other ids: every example is a duplicate
    write_jsonl(copy, ({**t.to_dict(), "id": t.id + "-again"} for t in trajs))
    res = build(_cfg(tmp_path, [src, copy], model_dir, role="decider"), tokenizer=tokenizer)
    n = sum(len(t.steps) for t in trajs)
    assert res.stats["examples"]["total"] == n
    assert res.stats["dedup"] == {"total": n, "by_fold": {"train": n}}


@pytest.mark.parametrize("fmt_name", ["step", "conversation"])
def test_oversample_repeats_a_policys_train_rows_after_dedupe(fmt_name, tmp_path, tokenizer, model_dir):
    """A flywheel weighs its harvested traces (policy = the arm) against the expert data: each train row of the
    named policy appears that many times; dev rows and other policies are left alone."""
    src = tmp_path / "toy.jsonl"
    write_toy(src, {"train": 2, "dev": 1})
    plain = build(_cfg(tmp_path / "a", [src], model_dir, role="simulator", format=fmt_name), tokenizer=tokenizer)
    cfg = _cfg(tmp_path / "b", [src], model_dir, role="simulator", format=fmt_name, oversample={"noisy_expert": 3})
    weighted = build(cfg, tokenizer=tokenizer)

    def count(res, fold):
        rows = [json.loads(line) for line in Path(res.paths[fold]).read_text().splitlines()]
        return len(rows)

    def by_policy(res, fold):
        from datasets import load_from_disk

        return Counter(load_from_disk(res.paths["dataset"])[fold]["policy"])

    before, after = by_policy(plain, "train"), by_policy(weighted, "train")
    assert before["noisy_expert"] > 0 and after["noisy_expert"] == 3 * before["noisy_expert"]
    assert after["expert"] == before["expert"]
    assert by_policy(weighted, "dev") == by_policy(plain, "dev")
    assert count(weighted, "train") == count(plain, "train") + 2 * before["noisy_expert"]
    assert weighted.stats["oversampled"] == {
        "copies": {"noisy_expert": 3},
        "rows_added": {"noisy_expert": 2 * before["noisy_expert"]},
    }
    assert "noisy_expert x3" in Path(weighted.paths["stats_md"]).read_text()
    with pytest.raises(ValueError, match="oversample"):
        replace(cfg, oversample={"noisy_expert": 0})


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
        assert fmt.split_verdict(r["completion"])[0] == step.next_observation  # whole, never cut
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
    # Bad lines stop the build (nothing written) unless keep_going.
    with pytest.raises(MalformedInputError, match=rf"(?s)2 bad input line.*{src}:2: .*{src}:3: .*--keep_going true"):
        build(_cfg(tmp_path, [src], model_dir, role="decider"), tokenizer=tokenizer)
    assert not (tmp_path / "out").exists()
    res = build(_cfg(tmp_path, [src], model_dir, role="decider", keep_going=True), tokenizer=tokenizer)
    assert res.stats["malformed_lines"] == 2
    assert res.stats["problems"][0].startswith(f"{src}:2: (json): not valid JSON")
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
    flags = ["--config", str(recipe), "--out", str(out), "--progress", "false", "--max-prompt-tokens", "800"]
    assert main(flags) == 2 and not out.exists()
    assert f"{src}:2: (json): not valid JSON" in capsys.readouterr().err
    rc = main([*flags, "--keep-going"])
    printed = capsys.readouterr()
    assert rc == 0
    assert f"{src}:2: (json): not valid JSON" in printed.err
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


# ---------------------------------------------------------------------------------------------
# validate and build agree: each corruption is named at its FILE:LINE by both; good lines survive.
# ---------------------------------------------------------------------------------------------
def _edit(fn):
    def corrupt(raw: bytes, first: bytes) -> bytes:
        rec = json.loads(raw)
        fn(rec)
        return json.dumps(rec).encode() + b"\n"

    return corrupt


def _set_action(rec, **fields):
    rec["steps"][0]["action"] = {**rec["steps"][0]["action"], **fields}


CORRUPTIONS = {
    "non_utf8_byte": (
        lambda raw, first: raw.replace(b'"goal": "', b'"goal": "\xff', 1),
        "(encoding): not UTF-8 at byte",
    ),
    "torn_json": (lambda raw, first: raw[: len(raw) // 2] + b"\n", "(json): not valid JSON"),
    "deep_nesting": (lambda raw, first: b"[" * 100_000 + b"\n", "(json): not readable (nested deeper than 100 levels"),
    "int_action_text": (_edit(lambda r: _set_action(r, text=7)), "steps[0].action.text: expected a string or null"),
    "argument_list": (
        _edit(lambda r: _set_action(r, kind="tool_call", name="go", arguments=["east"])),
        "steps[0].action.arguments: expected an object",
    ),
    "nan_score": (_edit(lambda r: r["steps"][0].update(score=float("nan"))), "steps[0].score: nan is not a finite"),
    "inf_final_score": (_edit(lambda r: r.update(final_score=float("inf"))), "final_score: inf is not a finite"),
    "lone_surrogate": (_edit(lambda r: r.update(goal="\udc80")), "goal: not valid Unicode"),
    "unknown_step_field": (_edit(lambda r: r["steps"][0].update(mood="good")), "steps[0].mood: not a step field"),
    "same_id_other_content": (
        lambda raw, first: json.dumps({**json.loads(first), "final_score": 0.25}).encode() + b"\n",
        "with different content",
    ),
}


@pytest.mark.parametrize("name", sorted(CORRUPTIONS))
def test_validate_and_build_name_each_corruption_at_its_line(name, tmp_path, tokenizer, model_dir):
    from simplan.data.validate import validate_file

    corrupt, expected = CORRUPTIONS[name]
    src = tmp_path / "toy.jsonl"
    trajs = write_toy(src, {"train": 3}, noisy=False)
    lines = src.read_bytes().splitlines(keepends=True)
    lines[1] = corrupt(lines[1], lines[0])
    src.write_bytes(b"".join(lines))
    where = f"{src}:2: "

    report = validate_file(src, keep_going=True)
    assert report.bad_lines == [where[:-2]] and report.good == 2
    assert any(p.startswith(where) and expected in p for p in report.problems), report.problems
    if name == "same_id_other_content":  # both places are named
        assert f"(first at {src}:1)" in report.problems[0]
    assert Path(report.rejects_path).read_bytes() == lines[1]  # byte for byte, bad bytes included
    assert Path(report.out_path).read_bytes() == lines[0] + lines[2]

    with pytest.raises(MalformedInputError) as refused:
        build(_cfg(tmp_path, [src], model_dir), tokenizer=tokenizer)
    assert any(line.startswith(where) and expected in line for line in str(refused.value).splitlines())
    res = build(_cfg(tmp_path, [src], model_dir, keep_going=True), tokenizer=tokenizer)
    assert res.stats["malformed_lines"] == 1
    assert any(p.startswith(where) and expected in p for p in res.stats["problems"]), res.stats["problems"]
    used = sorted({r["trajectory_id"] for r in _rows(res)})
    assert used == [trajs[0].id, trajs[2].id]  # line 2 is out, whatever its corruption, and its neighbours in


def _rows(res) -> list[dict]:
    from datasets import load_from_disk

    return list(load_from_disk(res.paths["dataset"])["train"])


def test_the_same_record_twice_is_counted_not_refused(tmp_path, tokenizer, model_dir):
    from simplan.data.validate import validate_file

    src = tmp_path / "toy.jsonl"
    write_toy(src, {"train": 2}, noisy=False)
    lines = src.read_text().splitlines(keepends=True)
    src.write_text("".join(lines) + json.dumps(json.loads(lines[0]), indent=None, separators=(",", ":")) + "\n")
    res = build(_cfg(tmp_path, [src], model_dir), tokenizer=tokenizer)  # no keep_going needed
    assert res.stats["malformed_lines"] == 0 and res.stats["skipped"]["duplicate_trajectory_id"] == 1
    report = validate_file(src)  # validate still names it, so a --keep-going split holds each episode once
    assert report.bad_lines == [f"{src}:3"] and f"(first at {src}:1, the same record)" in report.problems[0]


def test_the_same_episode_collected_twice_is_the_same_record(tmp_path, tokenizer, model_dir):
    """Collection times each episode (meta.elapsed_s): a second collection of it differs only there."""
    src = tmp_path / "toy.jsonl"
    write_toy(src, {"train": 2}, noisy=False)
    lines = src.read_text().splitlines(keepends=True)
    first, again = json.loads(lines[0]), json.loads(lines[0])
    first["meta"], again["meta"] = (
        {**first.get("meta", {}), "elapsed_s": 1.25},
        {**again.get("meta", {}), "elapsed_s": 3.5},
    )
    src.write_text(json.dumps(first) + "\n" + lines[1] + json.dumps(again) + "\n")
    res = build(_cfg(tmp_path, [src], model_dir), tokenizer=tokenizer)
    assert res.stats["malformed_lines"] == 0 and res.stats["skipped"]["duplicate_trajectory_id"] == 1
    again["meta"]["expert"] = "other"  # anything else in meta is content
    src.write_text(json.dumps(first) + "\n" + lines[1] + json.dumps(again) + "\n")
    with pytest.raises(MalformedInputError, match="with different content"):
        build(_cfg(tmp_path, [src], model_dir), tokenizer=tokenizer)


def test_a_huge_observation_is_capped_at_read_time_in_bounded_memory(tmp_path, model_dir):
    """A 50 MB observation (an imported transcript, a hand-written record) is cut to a character budget derived
    from the token budgets before anything tokenizes it, counted in stats, and the build's peak memory stays far
    from the 3 GB that tokenizing it took. Measured in a child process, so the test process's own peak is apart."""
    import subprocess
    import sys

    src = tmp_path / "huge.jsonl"
    trajs = write_toy(src, {"train": 2}, noisy=False)
    huge = trajs[0].to_dict()
    huge["id"] += "-huge"
    huge["steps"][0]["observation"] = "word " * 10_000_000  # 50 MB
    with src.open("a", encoding="utf-8") as f:
        f.write(json.dumps(huge) + "\n")
    del huge
    script = f"""
import json, resource
from simplan.data.build import BuildConfig, build
res = build(BuildConfig(inputs=[{str(src)!r}], out={str(tmp_path / "out")!r}, model={model_dir!r},
                        role="decider", format="step", progress=False))
peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({{"capped": res.stats["capped"], "peak_mb": peak_mb}}))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["capped"] == {"max_chars": 1024 * 8, "steps": 1}
    assert report["peak_mb"] < 1000, report  # 630 MB measured (imports included); 3 GB before the cap
    md = (tmp_path / "out" / "stats.md").read_text()
    assert "cut at read time to 8,192 characters: 1" in md


@pytest.mark.parametrize("fmt_name", ["step", "conversation"])
def test_the_same_records_in_another_order_build_the_same_dataset(fmt_name, tmp_path, tokenizer, model_dir):
    # collection workers write records in the order they finish; the build must not depend on it
    from datasets import load_from_disk

    trajs = write_toy(tmp_path / "toy.jsonl", {"train": 3, "dev": 1})
    built = []
    for name, order in (("forward", trajs), ("backward", trajs[::-1])):
        src = tmp_path / f"{name}.jsonl"
        write_jsonl(src, (t.to_dict() for t in order))
        cfg = replace(_cfg(tmp_path, [src], model_dir, role="decider", format=fmt_name), out=str(tmp_path / name))
        res = build(cfg, tokenizer=tokenizer)
        built.append({f: load_from_disk(res.paths["dataset"])[f].to_list() for f in ("train", "dev")})
    assert built[0] == built[1]
