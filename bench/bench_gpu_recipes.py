"""GPU recipes for SmolLM2 on TWX: train the decider (three variants) and the simulator side by side
on one GPU, then evaluate every adapter on the whole dev fold, the base model beside the first of
each role.

    python bench/bench_gpu_recipes.py --out runs/bench/gpu-recipes
    python bench/bench_gpu_recipes.py --allow-cpu --model /tmp/tiny --set max_steps=2 --eval-limit 8   # dry run

Needs the two datasets (`simplan build --role decider|simulator ... --out runs/datasets/twx-<role>`)
and a CUDA GPU (`--allow-cpu` for a dry run of the plumbing). The runs are processes started
together: a 135M model leaves a large GPU mostly idle, so one at a time would waste it, and each
run's time is wall-clock under that sharing (so are its tokens/s). The decider variants differ from
the recipe in one setting each (epochs, LoRA rank) and are all reported; they are evaluated on the
same dev fold they could be chosen on, so a choice among them is a choice on dev. On one H200 the
four trainings share the GPU at 93-100% utilisation: ~4 min for the 6-epoch runs, ~5 min for the
simulator, ~8 min expected for decider-12ep; evaluation ~3 min (bench/RESULTS.md).

Writes OUT/train/<run>/ (adapter, metrics), OUT/eval/<run>/ (eval-model output), OUT/logs/ and
OUT/summary.md + summary.json.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
RECIPES = ROOT / "recipes" / "smollm2-135m-instruct" / "twx-gpu"


@dataclass
class Run:
    name: str
    role: str
    recipe: Path
    overrides: dict[str, str] = field(default_factory=dict)
    compare_base: bool = False


RUNS = [
    Run("decider", "decider", RECIPES / "decider.yaml", compare_base=True),
    Run("decider-12ep", "decider", RECIPES / "decider.yaml", {"num_train_epochs": "12"}),
    Run("decider-r64", "decider", RECIPES / "decider.yaml", {"lora_r": "64", "lora_alpha": "128"}),
    Run("simulator", "simulator", RECIPES / "simulator.yaml", compare_base=True),
]


def _start(cmd: list[str], log: Path) -> subprocess.Popen:
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as handle:  # the child keeps its own copy of the descriptor
        return subprocess.Popen(cmd, stdout=handle, stderr=subprocess.STDOUT, cwd=ROOT)


def _wait_all(procs: dict[str, tuple[subprocess.Popen, Path]], what: str) -> dict[str, float]:
    """Wait for every process; the wall seconds each took. Failures are printed with their log tail."""
    started = time.perf_counter()
    seconds: dict[str, float] = {}
    pending = dict(procs)
    while pending:
        for name, (proc, log) in list(pending.items()):
            if proc.poll() is None:
                continue
            seconds[name] = round(time.perf_counter() - started, 1)
            del pending[name]
            status = "ok" if proc.returncode == 0 else f"FAILED (exit {proc.returncode}); log {log}"
            print(f"{what} {name}: {status} after {seconds[name]:.0f} s", flush=True)
            if proc.returncode != 0:
                print("\n".join(log.read_text(errors="replace").splitlines()[-25:]), flush=True)
        time.sleep(2)
    return {n: s for n, s in seconds.items() if procs[n][0].returncode == 0}


def _read(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.exists() else {}


def summarize(runs: list[Run], out: Path, train_s: dict[str, float], eval_s: dict[str, float]) -> dict[str, Any]:
    from simplan.evaluation.metrics import wilson_interval

    rows: dict[str, Any] = {}
    for run in runs:
        trained = _read(out / "train" / run.name / "metrics.json")
        evaluated = _read(out / "eval" / run.name / "metrics.json").get("results", {})
        row: dict[str, Any] = {"role": run.role, "overrides": run.overrides, "train_s": train_s.get(run.name)}
        row.update({k: trained.get(k) for k in ("global_step", "epoch", "eval_loss", "tokens_per_s", "train_loss")})
        row["eval_s"] = eval_s.get(run.name)
        for variant, m in evaluated.items():
            m = {k: v for k, v in m.items() if k != "by_family"} | {"by_family": m.get("by_family", {})}
            if m.get("n"):
                m["exact_ci95"] = wilson_interval(round(m["exact"] * m["n"]), m["n"])
            row[variant] = m
        rows[run.name] = row
    return rows


def _pct(v: Any) -> str:
    return "n/a" if v is None else f"{v:.1%}"


def markdown(rows: dict[str, Any], device: str) -> str:
    lines = [
        f"# GPU recipes: SmolLM2-135M-Instruct on TWX ({device})",
        "",
        "| run | changed | train min | steps | epochs | train tok/s (shared) | eval loss | variant | n | exact "
        "[95% CI] | parse / token F1 | valid |",
        "|---" * 12 + "|",
    ]
    for name, r in rows.items():
        changed = ", ".join(f"{k}={v}" for k, v in r["overrides"].items()) or "recipe"
        head = [
            name,
            changed,
            "n/a" if r["train_s"] is None else f"{r['train_s'] / 60:.1f}",
            str(r.get("global_step")),
            "n/a" if r.get("epoch") is None else f"{r['epoch']:.1f}",
            str(r.get("tokens_per_s")),
            "n/a" if r.get("eval_loss") is None else f"{r['eval_loss']:.3f}",
        ]
        for variant in ("base", "adapter"):
            m = r.get(variant)
            if not m:
                continue
            lo, hi = m.get("exact_ci95", (None, None))
            ci = "" if lo is None else f" [{lo:.1%}, {hi:.1%}]"
            second = _pct(m.get("parse")) if r["role"] == "decider" else _pct(m.get("token_f1"))
            cells = head + [variant, str(m["n"]), _pct(m["exact"]) + ci, second, _pct(m.get("valid"))]
            lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "Exact match by task family (adapter):", ""]
    families = sorted({f for r in rows.values() for f in (r.get("adapter") or {}).get("by_family", {})})
    lines += ["| run | " + " | ".join(families) + " |", "|---" * (len(families) + 1) + "|"]
    for name, r in rows.items():
        fam = (r.get("adapter") or {}).get("by_family", {})
        lines.append(f"| {name} | " + " | ".join(_pct(fam.get(f, {}).get("exact")) for f in families) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="runs/bench/gpu-recipes")
    p.add_argument("--decider-data", default="runs/datasets/twx-decider")
    p.add_argument("--simulator-data", default="runs/datasets/twx-simulator")
    p.add_argument("--model", default="", help="base model for every run (default: the recipes')")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="train override for every run")
    p.add_argument("--only", default="", help="comma-separated run names (default: all)")
    p.add_argument("--eval-limit", type=int, default=0, help="dev rows per eval (0: the whole fold)")
    p.add_argument("--eval-batch", type=int, default=64)
    p.add_argument("--allow-cpu", action="store_true", help="run without a GPU (a dry run of the plumbing)")
    args = p.parse_args(argv)

    import torch

    if not torch.cuda.is_available() and not args.allow_cpu:
        print("bench_gpu_recipes: torch sees no CUDA GPU; pass --allow-cpu for a dry run", file=sys.stderr)
        return 2
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    out = Path(args.out).resolve()
    runs = [r for r in RUNS if not args.only or r.name in args.only.split(",")]
    data = {"decider": args.decider_data, "simulator": args.simulator_data}
    cli = [sys.executable, "-m", "simplan.scripts.cli"]
    common = dict(kv.split("=", 1) for kv in args.set) | ({"model": args.model} if args.model else {})

    procs = {}
    for run in runs:
        keys = {"dataset": data[run.role], "output_dir": str(out / "train" / run.name)} | run.overrides | common
        cmd = cli + ["train", "--config", str(run.recipe)] + [a for k, v in keys.items() for a in (f"--{k}", v)]
        log = out / "logs" / f"{run.name}.train.log"
        procs[run.name] = (_start(cmd, log), log)
    train_s = _wait_all(procs, "train")

    procs = {}
    for run in runs:
        if run.name not in train_s:
            continue
        cmd = cli + ["eval-model", "--role", run.role, "--dataset", data[run.role], "--fold", "dev"]
        model = common.get("model") or yaml.safe_load(run.recipe.read_text())["model"]
        cmd += ["--model", model, "--limit", str(args.eval_limit), "--num_threads", "4"]
        cmd += ["--adapter", str(out / "train" / run.name / "adapter"), "--batch_size", str(args.eval_batch)]
        cmd += ["--compare_base", str(run.compare_base).lower(), "--out", str(out / "eval" / run.name)]
        log = out / "logs" / f"{run.name}.eval.log"
        procs[run.name] = (_start(cmd, log), log)
    eval_s = _wait_all(procs, "eval")

    rows = summarize(runs, out, train_s, eval_s)
    text = markdown(rows, device)
    (out / "summary.md").write_text(text)
    (out / "summary.json").write_text(json.dumps({"device": device, "runs": rows}, indent=2))
    print(text)
    return 0 if len(eval_s) == len(runs) else 1


if __name__ == "__main__":
    sys.exit(main())
