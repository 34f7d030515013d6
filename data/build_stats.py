"""A built dataset's statistics: stats.json (`dataset_stats`) and its readable summary stats.md (`stats_markdown`).

    from simplan.data.build_stats import stats_markdown
    print(stats_markdown(json.loads(Path("runs/datasets/twx-decider/stats.json").read_text())))

Examples by fold, env, family and source; what was dropped (over budget, failed actions) or skipped;
deduplicated examples; history truncation; token percentiles of prompts and completions; the time each
phase of `simplan build` (data/build.py) took.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from simplan.data.build_inputs import MAX_REPORTED_PROBLEMS, Loaded

if TYPE_CHECKING:  # the config module writes the stats: a type-only import, no cycle at run time
    from simplan.data.build import BuildConfig


def _percentiles(values: list[int]) -> dict[str, float]:
    import numpy as np

    if not values:
        return {"n": 0, "p50": 0, "p90": 0, "p99": 0, "max": 0, "mean": 0.0}
    a = np.asarray(values)
    pct = {f"p{q}": int(np.percentile(a, q, method="higher")) for q in (50, 90, 99)}
    return {"n": len(values), **pct, "max": int(a.max()), "mean": round(float(a.mean()), 1)}


def stats_markdown(stats: dict[str, Any]) -> str:
    """A readable summary of stats.json (also what `simplan build` prints)."""
    ex = stats["examples"]
    lines = [
        f"# {stats['role']} dataset: {ex['total']} examples"
        + (" (episode windows, loss on every trained turn)" if stats.get("format") == "conversation" else ""),
        "",
        f"- tokenizer: `{stats['model']}`; prompt budget {stats['budget']['max_prompt_tokens']}, "
        f"completion budget {stats['budget']['max_completion_tokens']} tokens",
        f"- trajectories used: {stats['trajectories']['used']} (read {stats['trajectories']['read']}); "
        f"malformed lines skipped: {stats['malformed_lines']}",
        f"- built in {stats['seconds']['total']:.1f} s (tokenizing and fitting {stats['seconds']['tokenize']:.1f} s; "
        f"loading the tokenizer took {stats['seconds']['tokenizer']:.1f} s more)",
        *_oversample_line(stats.get("oversampled")),
        *_capped_line(stats.get("capped")),
        "",
        "| fold | examples | deduplicated | prompt p50 / p90 / p99 / max | completion p50 / p90 / p99 / max |",
        "|---|---:|---:|---|---|",
    ]
    for fold, n in ex["by_fold"].items():
        p, c = stats["tokens"]["by_fold"][fold]["prompt"], stats["tokens"]["by_fold"][fold]["completion"]
        lines.append(
            f"| {fold} | {n} | {stats['dedup']['by_fold'].get(fold, 0)} | "
            f"{p['p50']} / {p['p90']} / {p['p99']} / {p['max']} | {c['p50']} / {c['p90']} / {c['p99']} / {c['max']} |"
        )
    for title, key in (("env", "by_env"), ("env / family", "by_family"), ("source", "by_source")):
        lines += ["", f"| {title} | examples |", "|---|---:|"]
        lines += [f"| {k} | {v} |" for k, v in ex[key].items()]
    lines += ["", "| dropped or skipped | count |", "|---|---:|"]
    dropped = {**stats["dropped"], **{f"skipped: {k}": v for k, v in stats["skipped"].items()}}
    lines += [f"| {k} | {v} |" for k, v in dropped.items()] or ["| (none) | 0 |"]
    lines += _branch_lines(stats.get("branches"))
    h = stats["history"]
    lines += [
        "",
        f"History truncated to fit the budget in {h['examples_truncated']} examples "
        f"({h['steps_dropped']} steps dropped, oldest first).",
    ]
    if stats["problems"]:
        lines += ["", "Malformed input (first ones):", ""] + [f"- `{p}`" for p in stats["problems"][:10]]
    return "\n".join(lines) + "\n"


def _capped_line(capped: dict[str, int] | None) -> list[str]:
    if not capped or not capped["steps"]:
        return []
    return [f"- steps whose text was cut at read time to {capped['max_chars']:,} characters: {capped['steps']}"]


def _oversample_line(oversampled: dict[str, Any] | None) -> list[str]:
    if not oversampled or not oversampled["copies"]:
        return []
    parts = [
        f"{policy} x{n} (+{oversampled['rows_added'].get(policy, 0)})" for policy, n in oversampled["copies"].items()
    ]
    return [f"- train examples repeated by policy (oversample; rows added): {', '.join(parts)}"]


def _branch_stats(rows: list[dict[str, Any]], counts: Counter) -> dict[str, Any] | None:
    """Counterfactual branch rows (data/build_branches.py): rows, branches, branches by outcome and by fold."""
    with_branches = [r for r in rows if r.get("branches")]
    if not with_branches and not counts.get("branch_over_budget"):
        return None
    by_outcome = Counter(b["outcome"] for r in with_branches for b in r["branches"])
    return {
        "rows": len(with_branches),
        "branches": sum(by_outcome.values()),
        "by_outcome": dict(sorted(by_outcome.items())),
        "by_fold": dict(sorted(Counter(r["fold"] for r in with_branches for _ in r["branches"]).items())),
        "over_budget": counts.get("branch_over_budget", 0),
    }


def _branch_lines(branches: dict[str, Any] | None) -> list[str]:
    if not branches:
        return []
    lines = [
        "",
        f"Counterfactual branches: {branches['branches']} in {branches['rows']} rows behind shared prefixes "
        f"({branches['over_budget']} dropped over the budget).",
        "",
        "| outcome | branches |",
        "|---|---:|",
    ]
    return lines + [f"| {k} | {v} |" for k, v in branches["by_outcome"].items()]


def _trained_by_source(rows: list[dict[str, Any]]) -> dict[str, int]:
    """Conversation rows: trained turns by the source of their step."""
    counts = Counter(src for r in rows for src, w in zip(r["sources"], r["weights"]) if w)
    return dict(sorted(counts.items()))


def dataset_stats(
    cfg: BuildConfig,
    files: list[Path],
    loaded: Loaded,
    rows: dict[str, list[dict[str, Any]]],
    dedup: dict[str, int],
    counts: Counter,
    seconds: dict[str, float],
) -> dict[str, Any]:
    all_rows = [r for fold in rows for r in rows[fold]]

    def by(key: Callable[[dict[str, Any]], str]) -> dict[str, int]:
        return dict(sorted(Counter(key(r) for r in all_rows).items()))

    dropped_keys = ("prompt_over_budget", "completion_over_budget", "failed_action")
    return {
        "role": cfg.role,
        "format": cfg.format,
        "model": cfg.model,
        "inputs": [str(p) for p in files],
        "budget": {"max_prompt_tokens": cfg.max_prompt_tokens, "max_completion_tokens": cfg.max_completion_tokens},
        "trajectories": {
            "read": len(loaded.trajectories) + sum(loaded.skipped.values()),
            "used": len(loaded.trajectories),
        },
        "malformed_lines": loaded.malformed_lines,
        "capped": {"max_chars": loaded.max_chars, "steps": loaded.capped_steps},
        "problems": loaded.problems[:MAX_REPORTED_PROBLEMS],
        "examples": {
            "total": len(all_rows),
            "by_fold": {f: len(rows[f]) for f in rows},
            "by_env": by(lambda r: r["env"]),
            "by_family": by(lambda r: f"{r['env']}/{r['family'] or '-'}"),
            "by_source": by(lambda r: r["source"]) if cfg.format == "step" else _trained_by_source(all_rows),
        },
        "dropped": {k: counts.get(k, 0) for k in dropped_keys},
        "skipped": {
            **dict(loaded.skipped),
            **{k: v for k, v in sorted(counts.items()) if k.startswith("source_")},
        },
        "dedup": {"total": sum(dedup.values()), "by_fold": dedup},
        "branches": _branch_stats(all_rows, counts),
        "history": {
            "examples_truncated": sum(1 for r in all_rows if r["history_dropped"]),
            "steps_dropped": sum(r["history_dropped"] for r in all_rows),
        },
        "tokens": {
            "prompt": _percentiles([r["prompt_tokens"] for r in all_rows]),
            "completion": _percentiles([r["completion_tokens"] for r in all_rows]),
            "by_fold": {
                f: {
                    "prompt": _percentiles([r["prompt_tokens"] for r in rows[f]]),
                    "completion": _percentiles([r["completion_tokens"] for r in rows[f]]),
                }
                for f in rows
            },
        },
        "seconds": {k: round(v, 3) for k, v in seconds.items()},
    }
