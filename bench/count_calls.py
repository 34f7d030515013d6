"""Tool calls per task family, counted from evaluation traces: how far an agent gets in a tool env when no
episode is solved.

    .venv/bin/python bench/count_calls.py runs/pipeline/bfcl-smollm2/eval-base runs/pipeline/bfcl-smollm2/eval

Per run folder (its traces.jsonl) and family: episodes, decider outputs that did not parse (parse_failure
events of the decider), real calls other than `finish()` (act events), those the env answered without an
error (the act event's `error`), and `finish()` calls.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter, defaultdict
from pathlib import Path

COLUMNS = ("episodes", "unparseable", "calls", "calls_ok", "finish")


def family_of(episode_id: str) -> str:
    """`{suite}/{env}/{task_id}/{arm}/{repeat}` -> the task id less its trailing index (BFCL: the category)."""
    return episode_id.split("/")[2].rsplit("_", 1)[0]


def count(run: Path) -> dict[str, Counter]:
    counts: dict[str, Counter] = defaultdict(Counter)
    with open(run / "traces.jsonl", encoding="utf-8") as f:
        for line in f:
            event = json.loads(line)
            kind, episode = event.get("type"), event.get("episode_id")
            if not episode:
                continue
            c = counts[family_of(episode)]
            if kind == "start":
                c["episodes"] += 1
            elif kind == "parse_failure" and event.get("role") == "decider":
                c["unparseable"] += 1
            elif kind == "act":
                if str(event.get("action")).startswith("finish("):
                    c["finish"] += 1
                else:
                    c["calls"] += 1
                    c["calls_ok"] += not event.get("error")
    return counts


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="+", type=Path, help="evaluation run folders (each with traces.jsonl)")
    args = p.parse_args(argv)
    print("| run | family | " + " | ".join(COLUMNS) + " |")
    print("|---|---|" + "---:|" * len(COLUMNS))
    for run in args.runs:
        for family, c in sorted(count(run).items()):
            print(f"| {run.name} | {family} | " + " | ".join(str(c[k]) for k in COLUMNS) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
