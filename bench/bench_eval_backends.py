"""Evaluation episodes per hour by backend: `simplan eval` of each arm on hf and vLLM, multi-LoRA vs merged adapters.

    .venv/bin/python bench/bench_eval_backends.py --adapters decider=runs/d/adapter,simulator=runs/s/adapter
    .venv/bin/python bench/bench_eval_backends.py --adapters ... --configs hf-lora,hf-merged --arms reactive --limit 4
    .venv/bin/python bench/bench_eval_backends.py --model DIR --adapters ... --suite toy-dev --limit 1 --max-steps 2 \
        --planner '{decider_max_tokens: 4, simulator_max_tokens: 4}'                                         # smoke

What runs: for each config of `--configs` (hf-lora, hf-merged, vllm-lora, vllm-merged; engine options as in
bench/bench_merged.py), one engine is built, then each arm of `--arms` is evaluated on it alone with the
library call of `simplan eval` (evaluation/runner.py) into OUT/CONFIG/ARM (fresh each time), and the engine
is closed before the next config starts: one job at a time, so run it on an otherwise idle machine. The
tasks are the suite's first `--tasks-per-family` per game, at most `--limit` of them (twx-dev-small, 1 per
game, 8: one task of every TextWorld-Express game).

Columns per (config, arm), every token count from the run's traces (evaluation/metrics.py): episodes,
success, wall_s (the evaluate call; engine start-up and merges are reported apart, as startup_s and
merge_s), episodes_per_hour = 3600 * episodes / wall_s, steps (real actions), decisions (decider calls from
the real state), imagined_steps, prompt and prefilled tokens per decision / imagined step / real step
(prefilled = not reused from the prefix cache; '-' where the traces cannot split a decision's tokens from its
imagination's), the same prefilled tokens split into context prefilled and scored candidate tokens (each valid
action + EOS, in full; context prefilled = prefilled - candidates) per decision / imagined step / real step,
and the cache hit share. The machine's load (os.getloadavg) before the first config and after
the last goes into OUT/bench_eval_backends.json beside the rows; the table goes to OUT/bench_eval_backends.md
and stdout. A config that fails to build or run is recorded with its error and the others still run.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import yaml
from bench_merged import CONFIGS, build  # this folder is on sys.path when a bench script runs

ARMS = ("reactive", "simplan")
COLUMNS = [  # (markdown header, row key or a pair of keys shown as "a / b")
    ("config", "config"),
    ("arm", "arm"),
    ("episodes", "episodes"),
    ("success", "success"),
    ("wall s", "wall_s"),
    ("episodes/hour", "episodes_per_hour"),
    ("steps", "steps"),
    ("decisions", "decisions"),
    ("imagined steps", "imagined_steps"),
    ("per decision: prompt / prefilled", ("prompt_per_decision", "prefilled_per_decision")),
    ("per imagined step: prompt / prefilled", ("prompt_per_imagined_step", "prefilled_per_imagined_step")),
    ("per real step: prompt / prefilled", ("prompt_per_real_step", "prefilled_per_real_step")),
    (
        "per decision: context prefilled / candidates",
        ("context_prefilled_per_decision", "candidate_tokens_per_decision"),
    ),
    (
        "per imagined step: context prefilled / candidates",
        ("context_prefilled_per_imagined_step", "candidate_tokens_per_imagined_step"),
    ),
    (
        "per real step: context prefilled / candidates",
        ("context_prefilled_per_real_step", "candidate_tokens_per_real_step"),
    ),
    ("cache hit share", "prompt_cache_share"),
    ("startup s", "startup_s"),
    ("merge s", "merge_s"),
]


def _list(text: str, allowed: tuple[str, ...], flag: str) -> list[str]:
    items = [x.strip() for x in text.split(",") if x.strip()]
    unknown = [x for x in items if x not in allowed]
    if unknown or not items:
        raise SystemExit(f"{flag}: {', '.join(unknown) or 'nothing given'}; choose from {', '.join(allowed)}")
    return items


def eval_config(args: argparse.Namespace, arm: str, out: Path) -> Any:
    from simplan.evaluation.runner import EvalConfig

    return EvalConfig(
        suite=args.suite,
        arms=[arm],
        episodes=args.tasks_per_family,
        limit=args.limit,
        max_steps=args.max_steps,
        planner=args.planner,
        out=str(out),
        fresh=True,
        progress=False,
    )


def arm_row(out: Path, arm: str, wall: float) -> dict[str, Any]:
    """The arm's numbers from the traces of its eval folder (evaluation/metrics.py)."""
    from simplan.evaluation.metrics import aggregate, load_run

    metrics = [m for m in aggregate(load_run(out)) if m.arm == arm]
    if not metrics:
        raise RuntimeError(f"{out}: no finished episode of arm {arm!r} in traces.jsonl")
    m = metrics[0]
    keys = ["decisions", "imagined_steps", "unsplit_decisions", "uncounted_candidates", "prompt_cache_share"]
    keys += [f"{kind}_per_{unit}" for kind in ("prompt", "prefilled") for unit in ("decision", "imagined_step")]
    keys += ["prompt_per_real_step", "prefilled_per_real_step"]
    kinds = ("context_prefilled", "candidate_tokens")
    keys += [f"{kind}_per_{unit}" for kind in kinds for unit in ("decision", "imagined_step", "real_step")]
    return {
        "episodes": m.episodes,
        "successes": m.successes,
        "success": round(m.success_rate, 4),
        "errored": m.errored,
        "wall_s": round(wall, 2),
        "episodes_per_hour": round(3600 * m.episodes / wall, 2) if wall > 0 else None,
        "steps": m.real_steps,
        **{k: getattr(m, k) for k in keys},
    }


def run_config(config: str, model_path: str, adapters: dict[str, str], args: argparse.Namespace) -> list[dict]:
    """Every arm of `args.arms` on one engine of `config`, one after another; the engine is closed at the end.
    An arm that fails is recorded with its error and the next arm still runs."""
    from simplan.evaluation.runner import evaluate

    t0 = time.perf_counter()
    engine, merge_s = build(config, model_path, adapters, args)
    started = {"startup_s": round(time.perf_counter() - t0 - merge_s, 1), "merge_s": round(merge_s, 1)}
    info = {"engine": config, "model": args.model, "adapters": args.adapters}
    rows = []
    try:
        for arm in args.arms:
            out = Path(args.out) / config / arm
            print(f"bench: {config} {arm} -> {out}", file=sys.stderr, flush=True)
            try:
                outcome = evaluate(eval_config(args, arm, out), engine, args.concurrency, engine_info=info)
                rows.append({"config": config, "arm": arm, **arm_row(out, arm, outcome.seconds), **started})
            except Exception as e:
                print(traceback.format_exc(), file=sys.stderr, flush=True)
                rows.append({"config": config, "arm": arm, "error": f"{type(e).__name__}: {str(e)[:300]}"})
            rows[-1]["out"] = str(out)
            print(rows[-1], file=sys.stderr, flush=True)
    finally:
        engine.close()
    return rows


def cell(row: dict[str, Any], key: str | tuple[str, str]) -> str:
    if isinstance(key, tuple):
        a, b = (row.get(k) for k in key)
        return "-" if a is None or b is None else f"{a:.1f} / {b:.1f}"
    value = row.get(key)
    if value is None:
        return "-"
    if key == "success":
        return f"{100 * value:.1f}% ({row['successes']}/{row['episodes']})"
    if key == "prompt_cache_share":
        return f"{100 * value:.1f}%"
    return f"{value:.1f}" if isinstance(value, float) else str(value)


def markdown(rows: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    lines = ["| " + " | ".join(h for h, _ in COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for row in rows:
        if "error" in row:
            lines.append(f"| {row['config']} | {row.get('arm', '-')} | error: {row['error']} |")
        else:
            lines.append("| " + " | ".join(cell(row, k).replace("|", "\\|") for _, k in COLUMNS) + " |")
    load = f"load average (1/5/15 min) before {meta['load_before']}, after {meta['load_after']}"
    note = f"{meta['suite']}, {meta['tasks']}; {meta['cpu_count']} CPUs, {load}; concurrency {meta['concurrency']}"
    return "\n".join(lines) + f"\n\n{note}\n"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="smollm2-135m-instruct", help="base model: registry name or folder")
    p.add_argument("--adapters", required=True, help="decider=DIR,simulator=DIR (the trained adapters)")
    p.add_argument("--configs", default=",".join(CONFIGS), help=f"comma-separated, from {', '.join(CONFIGS)}")
    p.add_argument("--arms", default=",".join(ARMS), help="comma-separated arms (inference/planning/arms.py)")
    p.add_argument("--suite", default="twx-dev-small", help="suite name (recipes/suites) or YAML path")
    p.add_argument("--tasks-per-family", type=int, default=1, help="tasks per game (0: the suite's)")
    p.add_argument("--limit", type=int, default=8, help="at most this many tasks (0: all)")
    p.add_argument("--max-steps", type=int, default=0, help="flat step cap per episode (0: the suite's)")
    p.add_argument(
        "--planner", type=yaml.safe_load, default={}, help="PlannerConfig fields for every arm, e.g. '{horizon: 2}'"
    )
    p.add_argument("--concurrency", type=int, default=8, help="episodes at once (their calls are batched)")
    p.add_argument("--dtype", default="auto", help="weights dtype (auto, as the eval recipes use)")
    p.add_argument("--threads", type=int, default=None, help="CPU threads (default: all cores)")
    p.add_argument("--kv-cache-gib", type=int, default=2, help="vLLM: KV cache per engine (merged: per model)")
    p.add_argument("--enforce-eager", action="store_true", help="vLLM without torch.compile (faster start)")
    p.add_argument("--out", default="runs/bench/eval-backends", help="folder: eval runs, .json and .md results")
    args = p.parse_args(argv)
    if not isinstance(args.planner, dict):
        raise SystemExit(f"--planner: expected a mapping such as '{{horizon: 2}}', got {args.planner!r}")
    args.configs = _list(args.configs, CONFIGS, "--configs")
    from simplan.inference.planning.arms import ARMS as KNOWN_ARMS

    args.arms = _list(args.arms, KNOWN_ARMS, "--arms")
    for name in ("tasks_per_family", "limit", "max_steps"):
        if getattr(args, name) < 0:
            raise SystemExit(f"--{name.replace('_', '-')}: must be >= 0, got {getattr(args, name)}")
    if args.concurrency < 1:
        raise SystemExit(f"--concurrency: must be >= 1, got {args.concurrency}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from simplan.core.io import write_json, write_text
    from simplan.inference.engines import parse_adapters
    from simplan.models.registry import resolve_model

    model_path = str(resolve_model(args.model))
    adapters = parse_adapters(args.adapters)
    meta: dict[str, Any] = {k: v for k, v in vars(args).items() if k != "out"}
    meta.update(
        tasks=f"{args.tasks_per_family or 'all'} per game, at most {args.limit or 'all'}",
        cpu_count=os.cpu_count(),
        load_before=[round(x, 2) for x in os.getloadavg()],
        started=time.strftime("%Y-%m-%dT%H:%M:%S"),
    )
    rows: list[dict[str, Any]] = []
    for config in args.configs:
        try:
            rows += run_config(config, model_path, adapters, args)
        except Exception as e:  # one backend failing (vLLM missing, out of memory) leaves the others' numbers
            print(traceback.format_exc(), file=sys.stderr, flush=True)
            rows.append({"config": config, "error": f"{type(e).__name__}: {str(e)[:300]}"})
    meta.update(load_after=[round(x, 2) for x in os.getloadavg()], finished=time.strftime("%Y-%m-%dT%H:%M:%S"))
    table = markdown(rows, meta)
    print(table)
    out = Path(args.out)
    write_json(out / "bench_eval_backends.json", {"config": meta, "rows": rows})
    write_text(out / "bench_eval_backends.md", table)
    return 1 if any("error" in r for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
