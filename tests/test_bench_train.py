"""bench/bench_train.py on a tiny random model: both trainers get the same conversation tokens and supervision.

.venv/bin/python -m pytest -q tests/test_bench_train.py
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("trl")


@pytest.fixture
def bench(bench_script):
    return bench_script("bench_train")


def test_each_labelled_run_is_one_supervised_action(bench) -> None:
    x = bench.IGNORE_INDEX
    labels = torch.tensor(
        [
            [x, x, 5, 6, x, x, 7, x],  # two assistant messages
            [9, x, x, 3, 3, 3, x, x],  # a label at position 0 starts a run too
        ]
    )
    assert bench.supervision(labels) == (4, 7)


def test_trl_and_simplan_supervise_the_same_tokens_of_a_conversation_export(bench, tmp_path: Path) -> None:
    """simplan packed and TRL padding-free draw the same batches (same seed, random order): the same actions and
    tokens are timed, TRL's prepared labels are simplan's, and the first step's loss (LoRA B = 0, so the base
    model's) is the same number on both sides; the toy dataset has weight-0 turns, which neither trains."""
    from datasets import load_from_disk

    from simplan.models.registry import load_tokenizer
    from simplan.models.tiny import tiny_model

    model = str(tiny_model("llama"))
    dataset = bench.synthetic_dataset(tmp_path / "toy", model)
    train_ds, data = bench.load_train(str(dataset), load_tokenizer(model), 1024)
    assert data["rows"] == len(train_ds) > 4 and data["over_max_length"] == 0
    raw = load_from_disk(str(dataset / "dataset"))["train"]
    assistant = [sum(m["role"] == "assistant" for m in r["messages"]) for r in raw]
    assert sum(raw["trained_turns"]) < sum(assistant)  # context turns of weight 0 are there, untrained

    out = tmp_path / "bench.json"
    argv = ["--model", model, "--dataset", str(dataset), "--halves", "simplan-packed,trl-pf", "--out", str(out)]
    assert bench.main(argv + ["--steps", "3", "--warmup", "1", "--threads", "1", "--bf16", "false"]) == 0
    results = json.loads(out.read_text())["results"]
    ours, trl = results["simplan-packed"], results["trl-pf"]
    assert trl["same_labels_as_simplan"] is True
    assert ours["supervised_tokens_per_step"] == trl["supervised_tokens_per_step"]
    assert ours["actions"] == trl["actions"] > 0 and ours["real_tokens"] == trl["real_tokens"]
    assert ours["first_loss"] == pytest.approx(trl["first_loss"], rel=1e-4)
    assert ours["padding_efficiency"] == trl["padding_efficiency"] == 1.0
    assert ours["peak_rss_mb"] > 0 and ours["actions_per_cpu_s"] > 0


def test_same_windows_times_the_same_work_in_each_trainers_own_order(bench, tmp_path: Path) -> None:
    """simplan's length-grouped batches and TRL's random ones over one epoch of the same rows: the same actions,
    supervised and non-padding tokens timed, whatever order each drew them in."""
    from simplan.models.tiny import tiny_model

    model = str(tiny_model("llama"))
    dataset = bench.synthetic_dataset(tmp_path / "toy", model)
    out = tmp_path / "bench.json"
    argv = ["--model", model, "--dataset", str(dataset), "--halves", "simplan,simplan-micro1,trl", "--out", str(out)]
    argv += ["--bf16", "false", "--threads", "1", "--steps", "3", "--warmup", "0", "--batch-size", "2"]
    argv += ["--same-windows"]
    assert bench.main(argv) == 0
    results = json.loads(out.read_text())["results"]
    ours, trl = results["simplan"], results["trl"]
    assert ours["timed_steps"] == trl["timed_steps"] == 3 and ours["data"]["same_windows"] == 6
    assert ours["actions"] == trl["actions"] > 0 and ours["real_tokens"] == trl["real_tokens"]
    assert sum(ours["supervised_tokens_per_step"]) == sum(trl["supervised_tokens_per_step"])
    micro = results["simplan-micro1"]  # one row per micro-batch, two accumulated: the same steps, no padding
    assert micro["timed_steps"] == 3 and micro["padding_efficiency"] == 1.0
    assert micro["supervised_tokens_per_step"] == ours["supervised_tokens_per_step"]
    assert micro["real_tokens"] == micro["padded_tokens"] == ours["real_tokens"]
    # the LM head: TRL at every position of its padded batches, simplan at the union of labelled positions
    # (one row per micro-batch: that row's own labelled tokens)
    assert (trl["head_at"], ours["head_at"]) == ("every", "union")
    assert trl["head_positions"] == trl["padded_tokens"] > ours["head_positions"]
    assert sum(micro["supervised_tokens_per_step"]) <= micro["head_positions"] <= ours["head_positions"]
    with pytest.raises(SystemExit):
        bench.parse(["--same-windows", "--warmup", "1"])


def test_a_half_in_two_processes_times_the_same_work_summed_over_them(bench, tmp_path: Path) -> None:
    """`simplan-micro1-2p`: the recipes' trainer in two data-parallel processes (torchrun, gloo), each taking one of
    a step's two rows: over one epoch of the same rows it supervises what one process does, its counts and CPU
    time summed over the two processes, the first step's loss (LoRA B = 0: the base model's, both processes'
    mean) the same."""
    from simplan.models.tiny import tiny_model

    model = str(tiny_model("llama"))
    dataset = bench.synthetic_dataset(tmp_path / "toy", model)
    out = tmp_path / "bench.json"
    argv = ["--model", model, "--dataset", str(dataset), "--halves", "simplan-micro1,simplan-micro1-2p"]
    argv += ["--out", str(out), "--bf16", "false", "--threads", "2", "--steps", "3", "--warmup", "0"]
    assert bench.main(argv + ["--batch-size", "2", "--same-windows"]) == 0
    results = json.loads(out.read_text())["results"]
    one, two = results["simplan-micro1"], results["simplan-micro1-2p"]
    assert two["processes"] == 2 and len(two["peak_rss_mb_per_process"]) == 2
    assert two["peak_rss_mb"] == sum(two["peak_rss_mb_per_process"])
    assert two["timed_steps"] == one["timed_steps"] == 3
    assert (two["actions"], two["real_tokens"]) == (one["actions"], one["real_tokens"])
    assert sum(two["supervised_tokens_per_step"]) == sum(one["supervised_tokens_per_step"])
    assert two["first_loss"] == pytest.approx(one["first_loss"], rel=1e-3)
    assert bench.half_processes("trl-pf-2p") == ("trl-pf", 2) and bench.half_processes("simplan") == ("simplan", 1)
    with pytest.raises(SystemExit):  # 4 rows do not split into 3 processes
        bench.parse(["--halves", "simplan-3p"])


def test_a_per_step_dataset_is_refused_naming_the_format(bench, tmp_path: Path) -> None:
    from datasets import Dataset, DatasetDict

    from simplan.models.registry import load_tokenizer
    from simplan.models.tiny import tiny_model

    folder = tmp_path / "step"
    rows = [{"prompt": [{"role": "user", "content": "hi"}], "completion": "go east"}]
    DatasetDict({"train": Dataset.from_list(rows)}).save_to_disk(str(folder))
    with pytest.raises(ValueError, match="conversation windows"):
        bench.load_train(str(folder), load_tokenizer(str(tiny_model("llama"))), 1024)
