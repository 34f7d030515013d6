"""Where a perfect simulator's gain comes from: why the planner overrode the decider, from an eval run's traces.

    .venv/bin/python bench/oracle_overrides.py --runs runs/eval/twx-dev-oracle --arm simplan-oracle \
        --baseline reactive --out runs/bench/oracle-overrides

Each imagine event lists the candidates in the decider's order (index 0: its first choice), with the judge's
parts of each and the one taken (`chosen`). An override is a simulated decision whose chosen candidate is not
the first choice. Its cause is the first of these that holds, comparing the first choice's parts with the
chosen one's (inference/planning/judge.py defines the parts):
    lost        the first choice's rollout is predicted to lose the game (its `lost` part < 0)
    won         the chosen rollout wins where the first choice's does not win as much (`won` part)
    error       the first choice's first action is predicted to fail (`error` part < 0)
    progress    the chosen rollout shows more progress (`progress` part)
    repeat      the first choice repeats a real (action, observation) pair or a failed action more
    other       none of these (likelihood, length, premature)
Counted over every episode of the arm, per game, and over the tasks the arm won and the baseline lost (the
discordant pairs that make the arm's gain): what made the difference there. No model is run.
"""

from __future__ import annotations

import argparse
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from simplan.core.io import write_json, write_text
from simplan.evaluation.paired import pair_key
from simplan.inference.planning.trace import read_traces, summarize
from simplan.inference.planning.trace_events import ImagineEvent

CAUSES = ("lost", "won", "error", "progress", "repeat", "other")


def cause(top: dict[str, float], chosen: dict[str, float]) -> str:
    """Why the chosen candidate beat the decider's first choice (module docstring), from their judge parts."""

    def part(parts: dict[str, float], name: str) -> float:
        return float(parts.get(name, 0.0))

    if part(top, "lost") < 0:
        return "lost"
    if part(chosen, "won") > part(top, "won"):
        return "won"
    if part(top, "error") < 0:
        return "error"
    if part(chosen, "progress") > part(top, "progress"):
        return "progress"
    if part(top, "repeat") + part(top, "failed") < part(chosen, "repeat") + part(chosen, "failed"):
        return "repeat"
    return "other"


def overrides(trace: Any) -> list[str]:
    """The cause of each override in one episode's trace, in order."""
    found = []
    for e in trace.events:
        if not isinstance(e, ImagineEvent) or e.skipped_simulation or len(e.candidates) < 2:
            continue
        chosen = next((c for c in e.candidates if c.chosen), None)
        top = e.candidates[0]
        if chosen is None or chosen.index == top.index:
            continue
        found.append(cause(top.parts, chosen.parts))
    return found


def analyse(traces_path: Path, arm: str, baseline: str) -> dict[str, Any]:
    traces = read_traces(traces_path)
    outcome: dict[tuple[str, str], bool] = {}  # (arm, pair key) -> won
    causes: dict[str, list[str]] = {}  # pair key -> the arm's override causes
    game: dict[str, str] = {}
    decisions: Counter[str] = Counter()
    for t in traces:
        s = summarize(t)
        key = pair_key(s)
        outcome[(s.arm, key)] = bool(s.success)
        if s.arm == arm:
            causes[key] = overrides(t)
            game[key] = (t.task or {}).get("family", "")
            decisions[game[key]] += sum(
                isinstance(e, ImagineEvent) and not e.skipped_simulation and len(e.candidates) > 1 for e in t.events
            )
    per_game: dict[str, Counter[str]] = defaultdict(Counter)
    for key, found in causes.items():
        per_game[game[key]].update(found)
    gained = [k for k in causes if outcome.get((arm, k)) and outcome.get((baseline, k)) is False]
    lost = [k for k in causes if outcome.get((arm, k)) is False and outcome.get((baseline, k))]
    return {
        "arm": arm,
        "baseline": baseline,
        "episodes": len(causes),
        "won": sum(outcome.get((arm, k), False) for k in causes),
        "baseline_won": sum(outcome.get((baseline, k), False) for k in causes),
        "simulated_decisions": sum(decisions.values()),
        "overrides": dict(Counter(c for found in causes.values() for c in found)),
        "per_game": {g: {"decisions": decisions[g], **dict(per_game[g])} for g in sorted(decisions)},
        "won_only_by_arm": {k: dict(Counter(causes[k])) for k in sorted(gained)},
        "won_only_by_baseline": {k: dict(Counter(causes[k])) for k in sorted(lost)},
    }


def markdown(result: dict[str, Any]) -> str:
    arm, base = result["arm"], result["baseline"]
    lines = [
        f"# Why {arm} overrode the decider",
        "",
        f"{result['episodes']} episodes: {arm} won {result['won']}, {base} {result['baseline_won']} on the same "
        f"tasks; {result['simulated_decisions']} simulated decisions with 2+ candidates.",
        "",
        "| game | decisions | " + " | ".join(CAUSES) + " |",
        "|---|---:|" + "---:|" * len(CAUSES),
    ]
    for g, counts in result["per_game"].items():
        lines.append(f"| {g} | {counts['decisions']} | " + " | ".join(str(counts.get(c, 0)) for c in CAUSES) + " |")
    total = result["overrides"]
    lines.append(
        f"| all | {result['simulated_decisions']} | " + " | ".join(str(total.get(c, 0)) for c in CAUSES) + " |"
    )
    for title, rows in (
        (f"Tasks won by {arm} only", result["won_only_by_arm"]),
        (f"Tasks won by {base} only", result["won_only_by_baseline"]),
    ):
        lines += ["", f"{title} ({len(rows)}), the overrides in {arm}'s episode:", ""]
        lines += [f"- {k}: {', '.join(f'{c} {n}' for c, n in v.items()) or 'none'}" for k, v in rows.items()]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", required=True, help="an eval run folder (its traces.jsonl)")
    ap.add_argument("--arm", default="simplan-oracle", help="the planning arm whose overrides are counted")
    ap.add_argument("--baseline", default="reactive", help="the arm it is paired with")
    ap.add_argument("--out", required=True, help="folder for overrides.json and overrides.md")
    args = ap.parse_args()
    result = analyse(Path(args.runs) / "traces.jsonl", args.arm, args.baseline)
    out = Path(args.out)
    write_json(out / "overrides.json", result)
    text = markdown(result)
    write_text(out / "overrides.md", text)
    print(text)


if __name__ == "__main__":
    main()
