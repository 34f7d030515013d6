"""Outcomes as a first-class prediction: outcome lines in simulator replies, counterfactual branches behind a shared
prefix in the dataset, and their packed tokenization for training.

    OMP_NUM_THREADS=1 .venv/bin/pytest -q tests/test_outcomes.py
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from simplan.data import format as fmt
from simplan.data.build import BuildConfig, build
from simplan.data.build_branches import branch_messages, kept_alternatives
from simplan.data.collect import CollectConfig, collect
from simplan.data.counterfactual import CounterfactualConfig, collect_counterfactuals
from simplan.data.outcomes import OUTCOMES
from simplan.data.trajectory import Alternative, Trajectory
from simplan.envs.base import Action


@pytest.fixture(scope="module")
def tok():
    from simplan.models.registry import load_tokenizer
    from simplan.models.tiny import tiny_model

    return load_tokenizer(str(tiny_model("llama")))


@pytest.fixture(scope="module")
def counterfactuals(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("cf")
    for fold, limit in (("train", 3), ("dev", 1)):
        collect(
            CollectConfig(
                env="toy",
                fold=fold,
                limit=limit,
                policies=["expert", "noisy_expert"],
                branches=0,
                out=str(tmp / f"{fold}.jsonl"),
                progress=False,
            )
        )
    out = tmp / "cf.jsonl"
    collect_counterfactuals(
        CounterfactualConfig(inputs=[str(tmp / "train.jsonl"), str(tmp / "dev.jsonl")], out=str(out), progress=False)
    )
    return out


def test_outcome_lines_round_trip_and_are_strict() -> None:
    for outcome in OUTCOMES:
        reply = fmt.observation_completion("You take the key.", outcome=outcome)
        assert reply.startswith(fmt.outcome_line(outcome)) and fmt.split_outcome(reply) == (
            "You take the key.",
            outcome,
        )
    assert fmt.outcome_line("no_change") == "Outcome: no change\n"
    assert fmt.split_outcome("You see Outcome: lost here.") == ("You see Outcome: lost here.", None)
    assert fmt.split_outcome("Outcome: exploded\nboom") == ("Outcome: exploded\nboom", None)
    with pytest.raises(ValueError, match="outcome"):
        fmt.outcome_line("exploded")


def test_balance_keeps_every_rare_outcome_and_few_that_change_nothing() -> None:
    alts = [Alternative(Action.command(f"a{i}"), "x", outcome=o) for i, o in enumerate(["no_change"] * 5 + ["lost"])]
    kept = kept_alternatives(alts, no_change_per_state=2)
    assert [a.action.text for a in kept] == ["a0", "a1", "a5"]


def test_build_with_outcomes_writes_outcome_lines_and_branch_rows(tmp_path, tok, counterfactuals) -> None:
    result = build(
        BuildConfig(role="simulator", inputs=[str(counterfactuals)], outcomes=True, out=str(tmp_path), progress=False),
        tok,
    )
    from datasets import load_from_disk

    data = load_from_disk(str(tmp_path / "dataset"))
    windows = [r for fold in data for r in data[fold] if not r["branches"]]
    branches = [r for fold in data for r in data[fold] if r["branches"]]
    assert windows and branches
    replies = [m["content"] for r in windows for m, w in zip(r["messages"], r["weights"]) if w]
    assert all(fmt.split_outcome(r)[1] in OUTCOMES for r in replies)
    assert "Outcome:" in windows[0]["messages"][0]["content"]  # the system prompt says what the first line is
    trajs = [Trajectory.from_dict(json.loads(line)) for line in counterfactuals.read_text().splitlines()]
    recorded = {(a.action.text, a.next_observation) for t in trajs for s in t.steps for a in s.alternatives}
    for row in branches:
        assert all(w == 0 for w in row["weights"])  # the prefix's own turns train in the windows
        for b in row["branches"]:
            obs, outcome = fmt.split_outcome(b["reply"])
            assert (b["action"], obs) in recorded and outcome == b["outcome"]
    stats = result.stats["branches"]
    assert stats["branches"] == sum(len(r["branches"]) for r in branches)
    # Expert and noisy paths share their first states: each alternative of a state is trained once.
    keys = [(r["fold"], json.dumps(r["messages"]), b["action"]) for r in branches for b in r["branches"]]
    assert len(keys) == len(set(keys))
    exported = [json.loads(line) for line in Path(result.paths["train"]).read_text().splitlines()]
    weighted = [m for e in exported for m in e["messages"] if m.get("weight")]
    assert len(weighted) >= sum(len(r["branches"]) for r in data["train"] if r["branches"])


def test_outcomes_need_the_conversation_format_and_exclude_verdicts() -> None:
    with pytest.raises(ValueError, match="conversation"):
        BuildConfig(role="simulator", inputs=["x"], out="o", outcomes=True, format="step")
    with pytest.raises(ValueError, match="choose one"):
        BuildConfig(role="simulator", inputs=["x"], out="o", outcomes=True, verdicts=True)


def test_a_branch_row_packs_each_branch_as_its_own_conversation_tokenizes(tok) -> None:
    from simplan.training.examples import IGNORE_INDEX, tokenize_branches, tokenize_conversation
    from simplan.training.packing import PREFIX

    prefix = [
        {"role": "system", "content": "Goal: open the door."},
        {"role": "user", "content": "look"},
        {"role": "assistant", "content": "Outcome: no change\nYou are in room 1."},
    ]
    branches = [
        {"action": "go east", "reply": "Outcome: no change\nRoom 2."},
        {"action": "open door", "reply": "Outcome: lost\nThe door explodes."},
    ]
    packed = tokenize_branches(tok, prefix, branches)
    n = len(tokenize_conversation(tok, prefix, [0] * 3)["input_ids"])
    assert packed["segment_ids"][:n] == [PREFIX] * n and set(packed["labels"][:n]) == {IGNORE_INDEX}
    for i, b in enumerate(branches, start=1):
        messages = branch_messages(prefix, b)
        alone = tokenize_conversation(tok, messages, [0] * 4 + [1])
        idx = [k for k, s in enumerate(packed["segment_ids"]) if s == i]
        assert [packed["input_ids"][k] for k in idx] == alone["input_ids"][n:]
        assert [packed["labels"][k] for k in idx] == alone["labels"][n:]
        assert [packed["position_ids"][k] for k in idx] == list(range(n, len(alone["input_ids"])))


def test_training_on_branch_rows_runs_with_the_tree_mask(tmp_path, tok, counterfactuals) -> None:
    from simplan.models.tiny import tiny_model
    from simplan.training.config import DataArguments, LoraArguments, ModelArguments, TrainArguments
    from simplan.training.trainer import train

    build(
        BuildConfig(
            role="simulator", inputs=[str(counterfactuals)], outcomes=True, out=str(tmp_path / "ds"), progress=False
        ),
        tok,
    )
    result = train(
        ModelArguments(model=str(tiny_model("llama")), dtype="float32"),
        LoraArguments(lora_r=4, lora_alpha=8),
        DataArguments(dataset=str(tmp_path / "ds"), max_length=1024, max_eval_examples=4),
        TrainArguments(
            output_dir=str(tmp_path / "run"),
            max_steps=2,
            per_device_train_batch_size=4,
            eval_steps=0,
            save_steps=100,
            logging_steps=1,
            bf16="false",
            num_threads=1,
        ),
    )
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    losses = [m["loss"] for m in metrics if "loss" in m]
    assert losses and all(0 < float(x) < 100 for x in losses)
    assert all(int(m["tokens_seen"]) > 0 for m in metrics if "tokens_seen" in m)
    assert result.adapter_dir.exists()
