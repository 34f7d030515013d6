"""Training throughput: simplan's trainer against TRL's SFTTrainer, same model, data and LoRA config.

    OMP_NUM_THREADS=1 .venv/bin/python bench/bench_train.py --steps 10
    .venv/bin/python bench/bench_train.py --dataset runs/datasets/twx-decider --steps 20 --model smollm2-135m-instruct

Both run in this one process, one after the other, with the same examples (a dataset built by
`simplan build`, or synthetic toy-env decider/simulator examples rendered by data/format.py when
none is given), batch size, max length, dtype, bf16 autocast and LoRA (r16, all linear layers).
Throughput is non-padding tokens per second over the steps after `--warmup`, counted from the
batches each trainer's own collator produced. Prints a Markdown table and writes JSON with --out.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from transformers import TrainerCallback


def synthetic_dataset(folder: Path, n_tasks: int = 60) -> Path:
    """Decider + simulator examples from the toy env's expert trajectories (history up to 3 steps)."""
    from datasets import Dataset, DatasetDict

    from simplan.data.format import decider_messages, observation_completion, simulator_messages
    from simplan.data.format import state_from_steps as state_of
    from simplan.envs.actions import render_action
    from simplan.envs.toy import ToyEnv

    env = ToyEnv()
    rows: dict[str, list[dict[str, Any]]] = {"train": [], "dev": []}
    for fold, limit in (("train", n_tasks), ("dev", max(4, n_tasks // 10))):
        for task in env.tasks(fold, limit=limit):
            obs = env.reset(task)
            past: list = []
            for action in env.expert_plan():
                state = state_of(obs.goal, obs.text, past[-3:], valid_actions=obs.valid_actions)
                result = env.step(action)
                nxt = result.observation
                rows[fold].append({"prompt": decider_messages(state), "completion": render_action(action)})
                rows[fold].append(
                    {"prompt": simulator_messages(state, action), "completion": observation_completion(nxt.text)}
                )
                past.append((action, nxt.text, nxt.error))
                obs = nxt
    DatasetDict({k: Dataset.from_list(v) for k, v in rows.items()}).save_to_disk(str(folder))
    return folder


class StepTimer(TrainerCallback):
    def __init__(self, warmup: int) -> None:
        self.warmup = warmup
        self.start: float | None = None
        self.end: float | None = None

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step == self.warmup:
            self.start = time.perf_counter()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.end = time.perf_counter()


class CountingCollator:
    """Wraps a collator and records the non-padding tokens and padded size of every batch it makes."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.batches: list[tuple[int, int]] = []

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, Any]:
        batch = self.inner(features)
        ids = batch["input_ids"]
        mask = batch.get("attention_mask")
        real = int(mask.sum()) if mask is not None else ids.numel()
        self.batches.append((real, ids.numel()))
        return batch


def _measure(trainer: Any, steps: int, warmup: int) -> dict[str, float]:
    timer = StepTimer(warmup)
    trainer.add_callback(timer)
    trainer.data_collator = CountingCollator(trainer.data_collator)
    trainer.train()
    measured = trainer.data_collator.batches[warmup:steps]
    real = sum(r for r, _ in measured)
    padded = sum(p for _, p in measured)
    seconds = (timer.end or 0) - (timer.start or 0)
    return {
        "tokens_per_s": round(real / seconds, 1),
        "padding_efficiency": round(real / max(padded, 1), 3),
        "seconds": round(seconds, 1),
        "measured_steps": len(measured),
        "final_loss": round(float(trainer.state.log_history[-2].get("loss", float("nan"))), 4)
        if len(trainer.state.log_history) > 1
        else float("nan"),
    }


def run_simplan(args: argparse.Namespace, dataset: Path, out: Path) -> dict[str, float]:
    from simplan.models.registry import load_tokenizer
    from simplan.training.completion_trainer import SimplanTrainer
    from simplan.training.config import DataArguments, LoraArguments, ModelArguments, TrainArguments
    from simplan.training.examples import PaddingCollator, load_splits, tokenize_dataset
    from simplan.training.lora import load_model_for_training
    from simplan.training.trainer import training_arguments

    margs = ModelArguments(model=args.model, dtype=args.dtype)
    largs = LoraArguments(lora_r=16, lora_alpha=32, lora_dropout=0.05)
    dargs = DataArguments(dataset=str(dataset), max_length=args.max_length, eval_split="")
    targs = TrainArguments(
        output_dir=str(out / "simplan"),
        max_steps=args.steps,
        per_device_train_batch_size=args.batch_size,
        bf16="true" if args.bf16 else "false",
        logging_steps=1,
        save_steps=10**6,
        report_to="none",
        resume=False,
    )
    tok = load_tokenizer(args.model)
    train_raw, _ = load_splits(dargs)
    train_ds, _ = tokenize_dataset(train_raw, tok, args.max_length)
    model, _ = load_model_for_training(margs, largs, args.bf16)
    trainer = SimplanTrainer(
        model=model,
        args=training_arguments(targs, args.bf16, False),
        train_dataset=train_ds,
        data_collator=PaddingCollator(tok.pad_token_id),
        processing_class=tok,
    )
    return _measure(trainer, args.steps, args.warmup)


def run_trl(args: argparse.Namespace, dataset: Path, out: Path, padding_free: bool) -> dict[str, float]:
    from datasets import load_from_disk
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM
    from trl import SFTConfig, SFTTrainer

    from simplan.models.registry import load_tokenizer, resolve_model
    from simplan.training.lora import base_dtype, linear_module_names

    data = load_from_disk(str(dataset))["train"]
    # TRL's conversational prompt-completion format: the completion is an assistant message.
    data = data.map(
        lambda r: {"completion": [{"role": "assistant", "content": r["completion"]}]},
        remove_columns=[c for c in data.column_names if c not in ("prompt", "completion")],
    )
    path = resolve_model(args.model)
    from simplan.training.config import ModelArguments

    model = AutoModelForCausalLM.from_pretrained(
        path, dtype=base_dtype(ModelArguments(model=args.model, dtype=args.dtype), args.bf16)
    )
    lora = LoraConfig(
        r=16, lora_alpha=32, lora_dropout=0.05, target_modules=linear_module_names(model), task_type="CAUSAL_LM"
    )
    config = SFTConfig(
        output_dir=str(out / ("trl-pf" if padding_free else "trl")),
        max_steps=args.steps,
        per_device_train_batch_size=args.batch_size,
        learning_rate=2e-4,
        bf16=args.bf16,
        use_cpu=not torch.cuda.is_available(),
        max_length=args.max_length,
        completion_only_loss=True,
        padding_free=padding_free,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        train_sampling_strategy="group_by_length" if args.trl_group_by_length else "random",
    )
    trainer = SFTTrainer(
        model=model, args=config, train_dataset=data, processing_class=load_tokenizer(args.model), peft_config=lora
    )
    return _measure(trainer, args.steps, args.warmup)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--dataset", default="", help="dataset from `simplan build` (default: synthetic toy examples)")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2, help="steps not timed")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--max-length", type=int, default=1024)
    p.add_argument("--dtype", default="auto", help="base weights dtype for both trainers")
    p.add_argument("--bf16", type=lambda v: v.lower() in ("1", "true", "yes"), default=True)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--trl-padding-free", action="store_true", help="also run TRL with padding_free=True")
    p.add_argument("--trl-group-by-length", action="store_true", help="give TRL length-grouped batches too")
    p.add_argument("--out", default="", help="write the results as JSON here")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    import transformers

    transformers.logging.set_verbosity_error()
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        dataset = Path(args.dataset) if args.dataset else synthetic_dataset(tmp_path / "synthetic")
        if (dataset / "dataset" / "dataset_dict.json").exists():
            dataset = dataset / "dataset"
        results = {"simplan": run_simplan(args, dataset, tmp_path)}
        results["trl"] = run_trl(args, dataset, tmp_path, padding_free=False)
        if args.trl_padding_free:
            results["trl_padding_free"] = run_trl(args, dataset, tmp_path, padding_free=True)
    base = results["trl"]["tokens_per_s"]
    print(
        f"\nmodel {args.model}, data {args.dataset or 'synthetic toy'}, batch {args.batch_size}, "
        f"{args.steps} steps ({args.warmup} warm-up), bf16 {args.bf16}, {args.threads} thread(s)\n"
    )
    print("| trainer | non-pad tokens/s | padding efficiency | vs TRL | final loss |")
    print("|---|---|---|---|---|")
    for name, r in results.items():
        print(
            f"| {name} | {r['tokens_per_s']} | {r['padding_efficiency']} | "
            f"{r['tokens_per_s'] / base:.2f}x | {r['final_loss']} |"
        )
    if args.out:
        Path(args.out).write_text(json.dumps({"args": vars(args), "results": results}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
