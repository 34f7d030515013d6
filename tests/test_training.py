"""LoRA training on a tiny random model: loss, labels, adapter, EOS, resume, packing, peft loading.

.venv/bin/pytest -q tests/test_training.py
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
from pathlib import Path

import pytest
import yaml

torch = pytest.importorskip("torch")
pytest.importorskip("peft")
datasets = pytest.importorskip("datasets")

from simplan.data.format import decider_messages, state_from_steps  # noqa: E402
from simplan.models.tiny import tiny_model  # noqa: E402
from simplan.training.checkpoints import checkpoint_problem, last_checkpoint  # noqa: E402
from simplan.training.completion_trainer import completion_loss  # noqa: E402
from simplan.training.config import DataArguments, LoraArguments, ModelArguments, TrainArguments  # noqa: E402
from simplan.training.examples import (  # noqa: E402
    IGNORE_INDEX,
    PackingCollator,
    PaddingCollator,
    tokenize_dataset,
    tokenize_example,
)
from simplan.training.trainer import train  # noqa: E402

torch.set_num_threads(1)

ROWS = [
    ("You are in room 1 of 3. A key lies on the floor.", "take key"),
    ("You take the key.", "go east"),
    ("You are in room 3 of 3. There is a locked door here.", "open door"),
    ("You are in room 2 of 3.", "go east"),
]


def _rows(n_repeat: int = 1) -> list[dict]:
    rows = []
    for _ in range(n_repeat):
        for obs, action in ROWS:
            state = state_from_steps("Open the door.", obs, valid_actions=["go east", "take key", "open door"])
            rows.append(
                {
                    "prompt": decider_messages(state),
                    "completion": action,
                    "task_id": obs[:8],
                    "valid_actions": state.valid_actions,
                }
            )
    return rows


@pytest.fixture(scope="module")
def tiny() -> Path:
    return tiny_model("llama")


@pytest.fixture(scope="module")
def dataset_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("ds") / "decider"
    dd = datasets.DatasetDict(
        {"train": datasets.Dataset.from_list(_rows(4)), "dev": datasets.Dataset.from_list(_rows(1))}
    )
    dd.save_to_disk(str(out))
    return out


def _args(tiny: Path, dataset_dir: Path, out: Path, **train_kw) -> tuple:
    kw = dict(
        output_dir=str(out),
        max_steps=8,
        learning_rate=3e-3,
        warmup_ratio=0.0,
        lr_scheduler_type="constant",
        per_device_train_batch_size=4,
        logging_steps=1,
        eval_steps=4,
        save_steps=4,
        bf16="false",
        report_to="none",
        seed=0,
    )
    kw.update(train_kw)
    return (
        ModelArguments(model=str(tiny)),
        LoraArguments(lora_r=8, lora_alpha=16, lora_dropout=0.0),
        DataArguments(dataset=str(dataset_dir), max_length=512),
        TrainArguments(**kw),
    )


def _tokenizer(tiny: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny)


def test_labels_mask_prompt_and_keep_completion_with_eos(tiny: Path) -> None:
    tok = _tokenizer(tiny)
    row = _rows()[0]
    ex = tokenize_example(tok, row["prompt"], row["completion"])
    labels, ids = ex["labels"], ex["input_ids"]
    n_prompt = sum(1 for x in labels if x == IGNORE_INDEX)
    prompt_ids = tok.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=True)
    prompt_ids = prompt_ids["input_ids"] if hasattr(prompt_ids, "keys") else prompt_ids
    assert ids[:n_prompt] == list(prompt_ids)  # the prompt is exactly the chat template's
    assert all(x == IGNORE_INDEX for x in labels[:n_prompt])
    assert labels[n_prompt:] == ids[n_prompt:]  # every completion token carries loss...
    assert labels[-1] == tok.eos_token_id  # ...including the EOS that teaches stopping
    assert tok.decode(labels[n_prompt:-1]).strip() == "take key"


def test_over_long_examples_are_dropped_not_cut(tiny: Path) -> None:
    tok = _tokenizer(tiny)
    ds = datasets.Dataset.from_list(_rows())
    full, dropped = tokenize_dataset(ds, tok, max_length=4096)
    assert dropped == 0
    limit = sorted(full["length"])[1]
    short, dropped = tokenize_dataset(ds, tok, max_length=limit)
    assert dropped == sum(n > limit for n in full["length"]) > 0
    assert all(lab[-1] == tok.eos_token_id for lab in short["labels"])


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_completion_only_logits_and_packing_give_the_full_loss(arch: str) -> None:
    """The fast paths compute the same loss as the model's own full-logits loss, with no leakage."""
    from transformers import AutoModelForCausalLM

    folder = tiny_model(arch)
    tok = _tokenizer(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    feats = [tokenize_example(tok, r["prompt"], r["completion"] + " now" * i) for i, r in enumerate(_rows())]
    padded = PaddingCollator(tok.pad_token_id)(feats)
    with torch.no_grad():
        reference = model(**padded).loss  # full logits, mean over labelled tokens
        fast = completion_loss(model, padded)
        packed = completion_loss(model, PackingCollator()(feats))
    assert torch.allclose(fast, reference, atol=1e-5), (fast, reference)
    assert torch.allclose(packed, reference, atol=1e-4), (packed, reference)


@pytest.fixture(scope="module")
def trained(tiny: Path, dataset_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    out = tmp_path_factory.mktemp("run") / "decider"
    return train(*_args(tiny, dataset_dir, out, max_steps=80, save_steps=40, eval_steps=20)), out


def test_training_lowers_loss_and_writes_outputs(trained) -> None:
    result, out = trained
    logs = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in logs if "loss" in r]
    assert len(losses) >= 10 and losses[-1] < 0.5 * losses[0], losses
    evals = [r["eval_loss"] for r in logs if "eval_loss" in r]
    assert len(evals) >= 2 and evals[-1] < evals[0]
    assert all(r["tokens_per_s"] > 0 for r in logs if "loss" in r)
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["global_step"] == 80 and metrics["train_examples"] == 16 and "eval_loss" in metrics
    assert (out / "config.yaml").exists() and "lora_r: 8" in (out / "config.yaml").read_text()
    for name in ("adapter_config.json", "adapter_model.safetensors", "tokenizer.json"):
        assert (result.adapter_dir / name).exists(), name


def test_adapter_weights_changed_and_load_in_peft(trained, tiny: Path) -> None:
    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    result, _ = trained
    weights = load_file(str(result.adapter_dir / "adapter_model.safetensors"))
    lora_b = [v for k, v in weights.items() if "lora_B" in k]
    assert lora_b and all(v.abs().sum() > 0 for v in lora_b)  # lora_B starts at zero
    config = json.loads((result.adapter_dir / "adapter_config.json").read_text())
    assert {"q_proj", "v_proj", "down_proj"} <= set(config["target_modules"])

    base = AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32)
    model = PeftModel.from_pretrained(base, str(result.adapter_dir)).eval()
    tok = _tokenizer(tiny)
    # Greedy generation reproduces a memorised completion and stops with EOS.
    for row in _rows()[:3]:
        enc = tok(
            tok.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=False),
            return_tensors="pt",
            add_special_tokens=False,
        )
        with torch.no_grad():
            out = model.generate(**enc, max_new_tokens=10, do_sample=False, pad_token_id=tok.pad_token_id)
        new = out[0, enc["input_ids"].shape[1] :].tolist()
        assert tok.eos_token_id in new, tok.decode(new)
        assert new[new.index(tok.eos_token_id) - 1] != tok.eos_token_id
        assert tok.decode(new[: new.index(tok.eos_token_id)]).strip() == row["completion"]
        with model.disable_adapter(), torch.no_grad():
            base_out = model.generate(**enc, max_new_tokens=10, do_sample=False, pad_token_id=tok.pad_token_id)
        assert base_out[0].tolist() != out[0].tolist()


def test_rerun_resumes_from_last_checkpoint(tiny: Path, dataset_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    first = train(*_args(tiny, dataset_dir, out, max_steps=4, save_steps=4, eval_steps=0))
    assert first.metrics["global_step"] == 4 and (out / "checkpoint-4").is_dir()
    # Same command with a larger budget (as after an interruption): continues at step 4.
    second = train(*_args(tiny, dataset_dir, out, max_steps=8, save_steps=4, eval_steps=0))
    assert second.metrics["resumed_from"].endswith("checkpoint-4")
    assert second.metrics["global_step"] == 8
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    loss_steps = [r["step"] for r in records if "loss" in r]
    assert loss_steps == list(range(1, 9)), loss_steps  # steps 5-8 follow 1-4; no restart from step 1
    # 4 optimizer steps of batch 4 = one pass; the resumed run trained only the remaining ones.
    assert second.metrics["tokens_seen_this_run"] < first.metrics["tokens_seen_this_run"] * 1.5
    # A changed recipe does not silently continue someone else's checkpoint.
    with pytest.raises(ValueError, match=r"learning_rate: 0.003 -> 0.001.*--resume false"):
        train(*_args(tiny, dataset_dir, out, max_steps=12, save_steps=4, eval_steps=0, learning_rate=1e-3))


def test_lora_init_continues_an_earlier_adapter(trained, tiny: Path, dataset_dir: Path, tmp_path: Path) -> None:
    from safetensors.torch import load_file

    result, _ = trained
    model_args, _, data_args, train_args = _args(
        tiny, dataset_dir, tmp_path / "more", max_steps=2, eval_steps=0, learning_rate=1e-12
    )
    lora = LoraArguments(lora_r=8, lora_alpha=16, lora_dropout=0.0, lora_init=str(result.adapter_dir))
    more = train(model_args, lora, data_args, train_args)
    # Learning rate ~0: the run ends where it started, i.e. on the earlier adapter's weights, trainable.
    assert more.metrics["trainable_params"] > 0 and more.metrics["train_loss"] < 0.5
    before = load_file(str(result.adapter_dir / "adapter_model.safetensors"))
    after = load_file(str(more.adapter_dir / "adapter_model.safetensors"))
    assert before.keys() == after.keys() and all(torch.allclose(before[k], after[k], atol=1e-9) for k in before)
    fresh = dataclasses.replace(train_args, output_dir=str(tmp_path / "other"))
    with pytest.raises(ValueError, match=r"lora_init: .* lora_r 8 \(given 16\)"):
        train(model_args, LoraArguments(lora_r=16, lora_init=str(result.adapter_dir)), data_args, fresh)
    with pytest.raises(ValueError, match=r"lora_init: .* target modules"):
        train(model_args, dataclasses.replace(lora, lora_target_modules="q_proj,v_proj"), data_args, fresh)
    # A wrong folder fails before the dataset is even read (here: a missing one).
    nowhere = dataclasses.replace(data_args, dataset=str(tmp_path / "no-dataset"))
    with pytest.raises(FileNotFoundError, match="lora_init"):
        train(model_args, LoraArguments(lora_init=str(tmp_path)), nowhere, fresh)


def test_config_validation_names_the_field() -> None:
    with pytest.raises(ValueError, match="lora_r"):
        LoraArguments(lora_r=0)
    with pytest.raises(ValueError, match="batching"):
        TrainArguments(batching="zigzag")
    with pytest.raises(ValueError, match="dataset"):
        DataArguments(dataset="")
    with pytest.raises(ValueError, match="bf16"):
        TrainArguments(bf16="maybe")


def _eval_config(adapter: Path, tiny: Path, dataset_dir: Path, **kw):
    """eval-model of the trained tiny adapter (and its base) on the dev fold, in float32."""
    from simplan.evaluation.offline import EvalModelConfig

    return EvalModelConfig(
        role="decider",
        dataset=str(dataset_dir),
        fold="dev",
        model=str(tiny),
        adapter=str(adapter),
        dtype="float32",
        **kw,
    )


def test_eval_model_reports_base_and_adapter_side_by_side(trained, tiny: Path, dataset_dir: Path, tmp_path: Path):
    from simplan.evaluation.offline import EvalModelConfig, evaluate

    result, _ = trained
    report = evaluate(_eval_config(result.adapter_dir, tiny, dataset_dir, out=str(tmp_path / "eval")))
    adapter, base = report["results"]["adapter"], report["results"]["base"]
    assert adapter["n"] == 4 and adapter["exact"] == 1.0 and adapter["parse"] == 1.0 and adapter["valid"] == 1.0
    assert base["exact"] < 1.0
    assert "| adapter |" in (tmp_path / "eval" / "metrics.md").read_text()
    lines = (tmp_path / "eval" / "predictions.jsonl").read_text().splitlines()
    assert len(lines) == 4 and json.loads(lines[0])["adapter"] == json.loads(lines[0])["gold"]
    assert json.loads(lines[0])["adapter_exact"] is True
    by_family = adapter["by_family"]  # the rows carry no family column: one group
    assert list(by_family) == ["?"] and by_family["?"]["exact"] == 1.0

    # Scoring the saved outputs again needs no model and gives the same numbers.
    predictions = str(tmp_path / "eval" / "predictions.jsonl")
    again = evaluate(EvalModelConfig(role="decider", dataset=str(dataset_dir), fold="dev", predictions=predictions))
    assert again["out"] == str(tmp_path / "eval" / "rescored")
    for variant in ("adapter", "base"):
        for key in ("n", "exact", "parse", "stopped", "valid"):
            assert again["results"][variant][key] == report["results"][variant][key]
    with pytest.raises(ValueError, match="--limit"):
        evaluate(
            EvalModelConfig(role="decider", dataset=str(dataset_dir), fold="dev", predictions=predictions, limit=2)
        )


def test_eval_model_decode_choices_picks_a_valid_action(trained, tiny: Path, dataset_dir: Path, tmp_path: Path):
    from simplan.evaluation.offline import EvalModelConfig, evaluate

    result, _ = trained
    cfg = _eval_config(result.adapter_dir, tiny, dataset_dir, decode="choices")
    assert cfg.out_dir() == result.adapter_dir.parent / "eval-dev-choices"  # beside, not over, the free run
    report = evaluate(_eval_config(result.adapter_dir, tiny, dataset_dir, decode="choices", out=str(tmp_path / "c")))
    adapter, base = report["results"]["adapter"], report["results"]["base"]
    # The random base model rarely writes a valid action on its own; constrained, every output is one.
    assert base["valid"] == 1.0 and base["parse"] == 1.0 and base["stopped"] == 1.0
    assert adapter["exact"] == 1.0 and adapter["valid"] == 1.0
    rows = [json.loads(line) for line in (tmp_path / "c" / "predictions.jsonl").read_text().splitlines()]
    valid = {"go east", "take key", "open door"}
    assert all(r["base"] in valid for r in rows)
    assert "--decode choices" in (tmp_path / "c" / "metrics.md").read_text()
    with pytest.raises(ValueError, match="simulator"):
        EvalModelConfig(role="simulator", dataset="x", decode="choices")
    with pytest.raises(ValueError, match="decode"):
        EvalModelConfig(role="decider", dataset="x", decode="beam")


def test_pick_device_takes_the_gpu_only_when_there_is_one() -> None:
    import torch

    from simplan.models.registry import pick_device

    assert pick_device("auto") == ("cuda" if torch.cuda.is_available() else "cpu")
    assert pick_device("cpu") == "cpu"
    with pytest.raises(ValueError, match="not a torch device"):
        pick_device("tpu-please")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no CUDA GPU"):
            pick_device("cuda:0")


@pytest.mark.parametrize("native", [True, False])
def test_auto_dtype_never_emulates_bf16_on_a_cpu(native, monkeypatch) -> None:
    """Emulated bf16 made a CPU prefill 7x slower than float32 (AMD Zen 3): a bf16 checkpoint runs in float32 on
    a CPU without native bf16, in its own dtype elsewhere."""
    from simplan.core import cpu
    from simplan.models.registry import resolve_dtype

    monkeypatch.setattr(cpu, "native_bf16", lambda: native)
    assert resolve_dtype("auto", "cpu", "bfloat16") == ("auto" if native else "float32")
    assert resolve_dtype("auto", "cpu", "float32") == "auto"  # the checkpoint's own float32
    assert resolve_dtype("auto", "cpu", None) == "auto"  # unknown: as transformers loads it
    assert resolve_dtype("auto", "cuda:0", "bfloat16") == "auto"  # the checkpoint's own dtype on a GPU
    assert resolve_dtype("bfloat16", "cpu", "bfloat16") == "bfloat16"  # asked for by name: kept


def test_native_bf16_reads_the_cpu_flags(tmp_path) -> None:
    from simplan.core.cpu import native_bf16

    info = tmp_path / "cpuinfo"
    for flags, expected in (("fpu avx2 avx512f", False), ("fpu avx512_bf16", True), ("fpu amx_bf16 amx_tile", True)):
        info.write_text(f"processor : 0\nflags : {flags}\n")
        assert native_bf16(info) is expected
    assert native_bf16(tmp_path / "missing") is False


def test_special_tokens_follow_the_model_config(tiny: Path) -> None:
    """transformers 5.17 converted SmolLM2's GGUF tokenizer with eos = <|im_start|>; the conversion now
    takes bos/eos/pad from the config (the GGUF metadata), and training notices such a tokenizer."""
    from types import SimpleNamespace

    from simplan.data.format import eos_ends_assistant_turn
    from simplan.models.registry import align_special_tokens, load_tokenizer

    tok = load_tokenizer(str(tiny))
    assert eos_ends_assistant_turn(tok) == (True, "<|im_end|>\n")
    tok.eos_token = tok.pad_token = "<|im_start|>"  # what the broken conversion saved
    ok, after = eos_ends_assistant_turn(tok)
    assert not ok and after.startswith("<|im_end|>")
    config = SimpleNamespace(bos_token_id=1, eos_token_id=2, pad_token_id=2)
    assert align_special_tokens(tok, config) == {
        "eos": ["<|im_start|>", "<|im_end|>"],
        "pad": ["<|im_start|>", "<|im_end|>"],
    }
    assert tok.eos_token_id == 2 and tok.pad_token_id == 2 and tok.bos_token == "<|im_start|>"
    assert eos_ends_assistant_turn(tok)[0] and align_special_tokens(tok, config) == {}


def test_eval_model_limit_spreads_over_families() -> None:
    from simplan.evaluation.offline import spread_sample

    families = ["cook"] * 6 + ["coin"] * 2 + ["twc"] * 4
    assert spread_sample(families, 6) == [0, 1, 6, 7, 8, 9]
    assert spread_sample(families, 9) == [0, 1, 2, 3, 6, 7, 8, 9, 10]
    assert spread_sample(families, 50) == list(range(12))
    assert spread_sample(families, 1) == [0]


def test_simulator_metrics() -> None:
    from simplan.core.text import token_f1
    from simplan.evaluation.offline import simulator_metrics

    assert token_f1("You take the key.", "you take the key.") == 1.0
    assert token_f1("a b", "c d") == 0.0 and 0 < token_f1("a b c", "a b d") < 1
    rows = [
        {"completion": "You can't do that.", "error": True},
        {"completion": "You take the key.", "error": False},
        {"completion": "You can't do that.", "error": True},
    ]
    preds = ["You can't do that.", "You can't  do that.", "You take the key."]
    m = simulator_metrics(preds, [True] * 3, rows, {"you can't do that."})
    assert m["exact"] == 1 / 3 and m["error_precision"] == 0.5 and m["error_recall"] == 0.5


RECIPES = sorted(p for p in (Path(__file__).parent.parent / "recipes").glob("*/*/*.yaml"))


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: str(p.relative_to(p.parents[2])))
def test_recipes_parse_and_open_with_their_command(recipe: Path) -> None:
    from simplan.core.config import parse_config

    if recipe.parts[-3] == "pipeline":
        pytest.skip("pipeline recipes belong to `simplan pipeline`")
    first = recipe.read_text().splitlines()[0]
    assert first == f"# simplan train --config recipes/{recipe.relative_to(recipe.parents[2])}"
    model, lora, data, train_args = parse_config(
        [ModelArguments, LoraArguments, DataArguments, TrainArguments], ["--config", str(recipe)]
    )
    assert lora.lora_r in (8, 16, 32, 64) and data.dataset and train_args.output_dir.startswith("runs/train/")
    assert recipe.stem in train_args.output_dir and recipe.stem in data.dataset


def test_train_and_models_cli(tiny: Path, dataset_dir: Path, tmp_path: Path, capsys) -> None:
    from simplan.scripts import models
    from simplan.scripts import train as train_cmd

    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"model: {tiny}\ndataset: {dataset_dir}\nbf16: 'false'\nreport_to: none\nlora_r: 8\n")
    out = tmp_path / "cli-run"
    assert train_cmd.main(["--config", str(recipe), "--max_steps", "2", "--output_dir", str(out)]) == 0
    assert (out / "adapter" / "adapter_config.json").exists()
    assert "max_steps: 2" in (out / "config.yaml").read_text()
    assert train_cmd.main(["--config", str(recipe), "--dataset", str(tmp_path / "missing")]) == 2
    assert models.main(["list"]) == 0 and "smollm2-135m-instruct" in capsys.readouterr().out
    assert models.main(["fetch", str(tiny)]) == 0 and str(tiny) in capsys.readouterr().out
    assert models.main(["fetch", "no-such-model"]) == 2


def test_packed_batches_with_gradient_checkpointing_train(tiny: Path, dataset_dir: Path, tmp_path: Path) -> None:
    result = train(
        *_args(tiny, dataset_dir, tmp_path / "packed", max_steps=6, batching="packed", gradient_checkpointing=True)
    )
    logs = [json.loads(line) for line in (tmp_path / "packed" / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in logs if "loss" in r]
    assert len(losses) == 6 and all(math.isfinite(x) for x in losses) and losses[-1] < losses[0]
    assert result.metrics["global_step"] == 6 and math.isfinite(result.metrics["eval_loss"])


@pytest.mark.parametrize("launcher", ["torchrun", "accelerate"])
def test_two_process_ddp_matches_one_process(tiny: Path, tmp_path: Path, launcher: str) -> None:
    """torchrun with 2 CPU processes (gloo) trains the same step as one process on the whole batch:
    the loss is a token mean over both processes' examples, and one adapter is written. So does `accelerate
    launch` with the shipped multi-GPU config (recipes/accelerate/ddp.yaml): without GPUs its two processes run on
    the CPU over gloo (its bf16 autocast off here, for an exact comparison; `--cpu` would run one process)."""
    import subprocess
    import sys

    from safetensors.torch import load_file

    from simplan.training.processes import free_port, process_environment, torchrun_command

    data = tmp_path / "ds"
    datasets.DatasetDict({"train": datasets.Dataset.from_list(_rows(1))}).save_to_disk(str(data))  # 4 rows
    one = train(*_args(tiny, data, tmp_path / "one", max_steps=1, eval_steps=0, save_steps=1))
    flags = {
        "model": tiny,
        "dataset": data,
        "output_dir": tmp_path / "ddp",
        "max_length": 512,
        "lora_r": 8,
        "lora_alpha": 16,
        "lora_dropout": 0.0,
        "max_steps": 1,
        "learning_rate": 3e-3,
        "warmup_ratio": 0.0,
        "lr_scheduler_type": "constant",
        "per_device_train_batch_size": 2,
        "logging_steps": 1,
        "eval_steps": 0,
        "save_steps": 1,
        "bf16": "false",
        "report_to": "none",
        "seed": 0,
        "num_threads": 1,
    }
    program = ["-m", "simplan.scripts.cli", "train", *(x for k, v in flags.items() for x in (f"--{k}", str(v)))]
    if launcher == "torchrun":
        cmd = torchrun_command(2, free_port(), program)
    else:
        config = Path(__file__).resolve().parents[1] / "recipes" / "accelerate" / "ddp.yaml"
        cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(config)]
        cmd += ["--mixed_precision", "no", "--num_processes", "2", "--main_process_port", str(free_port()), *program]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=process_environment(1))
    assert proc.returncode == 0, proc.stderr[-3000:]

    def first_loss(out: Path) -> float:
        records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        return next(r["loss"] for r in records if "loss" in r)

    assert first_loss(tmp_path / "ddp") == pytest.approx(first_loss(tmp_path / "one"), rel=1e-4)
    assert json.loads((tmp_path / "ddp" / "metrics.json").read_text())["global_step"] == 1
    want = load_file(str(one.adapter_dir / "adapter_model.safetensors"))
    got = load_file(str(tmp_path / "ddp" / "adapter" / "adapter_model.safetensors"))
    assert want.keys() == got.keys()
    for k in want:
        assert torch.allclose(got[k], want[k], atol=1e-5), k


def test_processes_2_trains_the_same_step_in_two_processes(tiny: Path, tmp_path: Path, capsys) -> None:
    """`processes: 2` (what `simplan train --processes 2` and the pipeline's train stage call): train() launches
    two processes of one thread, each taking 2 of the step's 4 micro-batches, and returns process 0's metrics; the
    loss and adapter are one process's with the 4 accumulated. A step that cannot be shared evenly is refused."""
    from safetensors.torch import load_file

    data = tmp_path / "ds"
    datasets.DatasetDict({"train": datasets.Dataset.from_list(_rows(1))}).save_to_disk(str(data))  # 4 rows
    kw = dict(max_steps=1, eval_steps=0, save_steps=1, per_device_train_batch_size=1, gradient_accumulation_steps=4)
    one = train(*_args(tiny, data, tmp_path / "one", **kw, num_threads=1))
    two = train(*_args(tiny, data, tmp_path / "two", **kw, num_threads=2, processes=2))
    assert "train: 2 processes of 1 thread(s)" in capsys.readouterr().out
    share = yaml.safe_load((tmp_path / "two" / "processes.yaml").read_text())
    assert (share["gradient_accumulation_steps"], share["num_threads"], share["processes"]) == (2, 1, 1)
    assert two.metrics["global_step"] == 1 and two.adapter_dir == tmp_path / "two" / "adapter"
    # each process's peak resident memory, gathered by process 0 (what the pipeline adds to its stage's own)
    peaks = two.metrics["peak_rss_mb_per_process"]
    assert len(peaks) == 2 and all(mb > 0 for mb in peaks)
    assert len(one.metrics["peak_rss_mb_per_process"]) == 1
    assert two.metrics["train_loss"] == pytest.approx(one.metrics["train_loss"], rel=1e-4)
    want = load_file(str(one.adapter_dir / "adapter_model.safetensors"))
    got = load_file(str(two.adapter_dir / "adapter_model.safetensors"))
    assert want.keys() == got.keys()
    for k in want:
        assert torch.allclose(got[k], want[k], atol=1e-5), k
    with pytest.raises(ValueError, match="gradient_accumulation_steps: 3 .* a multiple of processes"):
        TrainArguments(gradient_accumulation_steps=3, processes=2)


def _logged_steps(out: Path) -> tuple[list[int], list[int]]:
    """(steps of the loss records, steps of the end-of-run summaries) in metrics.jsonl."""
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [r["step"] for r in records if "loss" in r], [r["step"] for r in records if "train_runtime" in r]


def test_resume_skips_a_torn_checkpoint_and_logs_no_step_twice(
    tiny: Path, dataset_dir: Path, tmp_path: Path, capsys
) -> None:
    out = tmp_path / "run"
    args = _args(tiny, dataset_dir, out, max_steps=4, save_steps=2, eval_steps=0)
    train(*args)
    # A save cut short: only the adapter files of checkpoint-4 reached the disk; metrics.jsonl has steps
    # 3-4 (logged after checkpoint-2) and a torn last line.
    for f in (out / "checkpoint-4").iterdir():
        if not f.name.startswith("adapter_"):
            f.unlink()
    with (out / "metrics.jsonl").open("a") as f:
        f.write('{"step": 5, "lo')
    capsys.readouterr()
    again = train(*args)
    err = capsys.readouterr().err
    assert (
        "checkpoint-4 is incomplete (no trainer_state.json), moved to torn-checkpoint-4: resuming from checkpoint-2"
        in err
    )
    assert again.metrics["resumed_from"] == str(out / "checkpoint-2") and again.metrics["global_step"] == 4
    assert _logged_steps(out) == ([1, 2, 3, 4], [4])  # each step once; the first run's summary went with its steps
    assert last_checkpoint(out) == str(out / "checkpoint-4")  # written whole this time


@pytest.mark.parametrize("torn", ["adapter_model.safetensors", "optimizer.pt"])
def test_resume_falls_back_past_a_checkpoint_file_cut_in_half(
    torn: str, tiny: Path, dataset_dir: Path, tmp_path: Path, capsys
) -> None:
    """What a SIGKILL or a full disk during `torch.save` leaves: every file there, one of them half written. The
    rerun resumed from it and crashed (SafetensorError, PytorchStreamReader failed) on every try."""
    out = tmp_path / "run"
    args = _args(tiny, dataset_dir, out, max_steps=4, save_steps=2, eval_steps=0)
    train(*args)
    path = out / "checkpoint-4" / torn
    os.truncate(path, path.stat().st_size // 2)
    assert checkpoint_problem(out / "checkpoint-2") is None and "is cut short" in checkpoint_problem(path.parent)
    capsys.readouterr()
    again = train(*args)
    err = capsys.readouterr().err
    assert f"checkpoint-4 is incomplete ({torn} is cut short" in err, err
    assert "moved to torn-checkpoint-4: resuming from checkpoint-2" in err
    assert again.metrics["resumed_from"] == str(out / "checkpoint-2") and again.metrics["global_step"] == 4
    assert (out / "torn-checkpoint-4" / torn).is_file()  # kept for a look, out of the way of the new save
    assert _logged_steps(out) == ([1, 2, 3, 4], [4])  # no step logged twice
    assert last_checkpoint(out) == str(out / "checkpoint-4")


def test_a_copied_run_folder_resumes(tiny: Path, dataset_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    train(*_args(tiny, dataset_dir, out, max_steps=2, save_steps=2, eval_steps=0))
    copy = tmp_path / "elsewhere" / "run-copy"
    shutil.copytree(out, copy)
    shutil.rmtree(out)  # nothing in the copy may point back at the original
    result = train(*_args(tiny, dataset_dir, copy, max_steps=4, save_steps=2, eval_steps=0))
    assert result.metrics["resumed_from"] == str(copy / "checkpoint-2") and result.metrics["global_step"] == 4
    assert _logged_steps(copy) == ([1, 2, 3, 4], [2, 4])
    assert not out.exists()


def test_max_minutes_stops_early_and_saves_the_adapter(tiny: Path, dataset_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "timed"
    result = train(*_args(tiny, dataset_dir, out, max_steps=500, eval_steps=0, save_steps=1000, max_minutes=1e-4))
    assert result.metrics["global_step"] == result.metrics["stopped_by_max_minutes_at_step"] == 1
    assert (out / "adapter" / "adapter_config.json").exists() and (out / "checkpoint-1").is_dir()
    with pytest.raises(ValueError, match="max_minutes"):
        TrainArguments(max_minutes=-1)


def test_eval_loss_is_a_token_mean_whatever_the_eval_batch(tiny: Path, tmp_path: Path) -> None:
    """Dev completions of 2 and ~30 tokens: a mean of per-batch means (the Trainer's) would move with the batch."""
    rows = _rows(1)
    long = dict(rows[1], completion="go east, then take the key from the floor and open the door with it " * 2)
    dd = datasets.DatasetDict(
        {"train": datasets.Dataset.from_list(_rows(2)), "dev": datasets.Dataset.from_list([rows[0], long])}
    )
    dd.save_to_disk(str(tmp_path / "ds"))
    losses = []
    for batch in (1, 2):
        kw = dict(max_steps=1, eval_steps=0, save_steps=1000, per_device_eval_batch_size=batch)
        losses.append(train(*_args(tiny, tmp_path / "ds", tmp_path / f"b{batch}", **kw)).metrics["eval_loss"])
    assert losses[0] == pytest.approx(losses[1], rel=1e-5), losses
