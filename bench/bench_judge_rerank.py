"""What would the outcome judge pick, state by state, if it re-ranked the decider's candidates? From fit-judge rows.

    .venv/bin/python bench/bench_judge_rerank.py --fits runs/judge/expert-200,runs/judge/agent-100 \
        --out runs/bench/judge-rerank

Each `simplan fit-judge --out` folder holds rows.jsonl (every candidate of every sampled state with its real
outcome, the decider's log-probability and the simulator's outcome probabilities) and metrics.json (the fitted
judge). Offline, with no model: for each state the action each rule picks, and how often that action's real
outcome was bad (lost or error), good (progress or won) or the expert's recorded action (on expert paths).
Rules: the decider's first choice; the fitted judge as the planner applies it (`OutcomeJudge.choose`: the veto,
then the value); the fitted value's best among the decider's top k (k = 2, 3, every candidate), which overrides
the decider whenever the value prefers another action, with no veto.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

from simplan.core.io import write_json, write_text
from simplan.evaluation.judge_fit import Row, read_rows
from simplan.inference.planning.outcomes import BAD, GOOD, OutcomeJudge


def picks(rows: list[Row], judge: OutcomeJudge) -> dict[str, list[Row]]:
    """The row each rule picks in each state (states in order)."""
    by_state: dict[int, list[Row]] = defaultdict(list)
    for r in rows:
        by_state[r.state].append(r)
    out: dict[str, list[Row]] = defaultdict(list)
    for state in sorted(by_state):
        ranked = sorted(by_state[state], key=lambda r: -r.logprob)  # the decider's order
        out["decider's first choice"].append(ranked[0])
        i, _ = judge.choose([r.logprob for r in ranked], [r.probs for r in ranked])
        out[f"fitted judge (veto {judge.veto:.3f})"].append(ranked[i])
        for name, k in (("value, best of top 2", 2), ("value, best of top 3", 3), ("value, best of all", None)):
            out[name].append(max(ranked[:k], key=lambda r: judge.value(r.logprob, r.probs)))
    return out


def table(rows: list[Row], judge: OutcomeJudge) -> list[dict[str, Any]]:
    has_expert = {r.state for r in rows if r.expert}
    lines = []
    for rule, chosen in picks(rows, judge).items():
        on_expert = [r for r in chosen if r.state in has_expert]
        lines.append(
            {
                "rule": rule,
                "states": len(chosen),
                "bad": sum(r.outcome in BAD for r in chosen),
                "good": sum(r.outcome in GOOD for r in chosen),
                "expert": sum(r.expert for r in on_expert),
                "expert_states": len(on_expert),
            }
        )
    return lines


def markdown(name: str, lines: list[dict[str, Any]]) -> str:
    out = [f"### {name}", "", "| rule | states | bad | good | the expert's action |", "|---|---:|---:|---:|---:|"]
    for x in lines:
        n = x["states"]
        expert = f"{x['expert']}/{x['expert_states']}" if x["expert_states"] else "-"
        out.append(
            f"| {x['rule']} | {n} | {x['bad']} ({x['bad'] / n:.1%}) | {x['good']} ({x['good'] / n:.1%}) | {expert} |"
        )
    return "\n".join(out) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--fits", required=True, help="fit-judge --out folders, comma-separated")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    results, parts = {}, []
    for folder in [Path(f) for f in args.fits.split(",") if f]:
        metrics = json.loads((folder / "metrics.json").read_text())
        judge = OutcomeJudge(**metrics["judge"])
        lines = table(read_rows(folder / "rows.jsonl"), judge)
        results[str(folder)] = lines
        parts.append(markdown(str(folder), lines))
    out = Path(args.out)
    write_json(out / "rerank.json", results)
    write_text(out / "rerank.md", "\n".join(parts))
    print("\n".join(parts))


if __name__ == "__main__":
    main()
