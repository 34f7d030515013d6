"""Pair two `simplan eval-model` runs row by row: exact match of each, the exact McNemar test, by family.

    .venv/bin/python bench/pair_predictions.py A/predictions.jsonl B/predictions.jsonl

Rows are matched by (trajectory_id, step), so a per-step and a conversation dataset built from the same
trajectories compare on the steps both hold (the conversation view of a dataset has one row per trained turn).
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict

from simplan.evaluation.paired import mcnemar_exact


def load(path: str) -> dict[tuple[str, int], dict]:
    with open(path, encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return {(r["trajectory_id"], r["step"]): r for r in rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("a", help="predictions.jsonl of run A")
    ap.add_argument("b", help="predictions.jsonl of run B")
    ap.add_argument("--variant", default="adapter", help="which variant's exact match to compare (adapter or base)")
    args = ap.parse_args()
    a, b = load(args.a), load(args.b)
    keys = sorted(a.keys() & b.keys())
    if not keys:
        raise SystemExit("no (trajectory_id, step) in common: were both built from the same trajectories?")
    col = f"{args.variant}_exact"
    ea, eb = [bool(a[k][col]) for k in keys], [bool(b[k][col]) for k in keys]
    n = len(keys)
    only_a = sum(x and not y for x, y in zip(ea, eb))
    only_b = sum(y and not x for x, y in zip(ea, eb))
    print(
        f"paired rows {n} (A has {len(a)}, B {len(b)}): A {sum(ea) / n:.1%}, B {sum(eb) / n:.1%}, "
        f"B - A {100 * (sum(eb) - sum(ea)) / n:+.1f} points; right only in A {only_a}, only in B {only_b}; "
        f"exact McNemar p = {mcnemar_exact(only_a, only_b):.3g}"
    )
    by_family: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    for k, x, y in zip(keys, ea, eb):
        cell = by_family[a[k].get("family") or "-"]
        cell[0], cell[1], cell[2] = cell[0] + 1, cell[1] + x, cell[2] + y
    print("| family | rows | A exact | B exact |\n|---|---:|---:|---:|")
    for family, (m, x, y) in sorted(by_family.items()):
        print(f"| {family} | {m} | {x / m:.1%} | {y / m:.1%} |")


if __name__ == "__main__":
    main()
