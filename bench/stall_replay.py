"""Ending a stalled episode (budgets.stall_steps), replayed on recorded eval runs: what each value would have
saved and cost, and the value the fitting runs give.

    .venv/bin/python bench/stall_replay.py --fit runs/eval/twx-devfit --runs runs/eval/twx-dev,runs/eval/shop \
        --out runs/bench/stall

An episode's steps up to the one where a value ends it are the recorded ones (nothing before it is decided
differently), so the replay is exact for what it counts: a won episode the value ends is a success lost; a lost
one ended early keeps its outcome and saves the model tokens it spent afterwards (its end event's total less
what its acts up to that step carry: each act event holds the tokens spent since the previous one). Progress is
inference/planning/episode_run.py `Progress`, the planner's own definition, with a met sub-goal read from the
trace's subgoal events (check "step"). A run recorded with a stall budget is replayed only for smaller values
(its episodes were already ended at its own). An episode whose trace has no end event (a run interrupted while
it played) is left out and counted as incomplete. The fitted value is twice the smallest value that ends no won
episode of the fitting runs; the held-out runs say what that margin is worth. No model is run.
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from pathlib import Path
from typing import Any

from simplan.core.io import write_json, write_text
from simplan.inference.planning.episode_run import Progress
from simplan.inference.planning.trace import EpisodeTrace, read_traces
from simplan.inference.planning.trace_events import ActEvent, EndEvent, StartEvent, SubgoalEvent

VALUES = (4, 6, 8, 10, 12, 16, 20)


def ended_at(trace: EpisodeTrace, stall_steps: int) -> int | None:
    """The step after which `stall_steps` would have ended the episode (None: it would not have)."""
    start = trace.of_type("start")[0]
    progress = Progress.start(start.observation if isinstance(start, StartEvent) else "")
    met = {e.step for e in trace.of_type("subgoal") if isinstance(e, SubgoalEvent) and e.check == "step"}
    for act in trace.of_type("act"):
        if not isinstance(act, ActEvent):
            continue
        if progress.stalled(act.step - 1) >= stall_steps:
            return act.step - 1  # the loop's check before deciding this step
        progress.step(act.step, act.score, act.observation, met_subgoal=act.step in met)
        if act.done:
            return None
    return None  # (after the last step the step budget, checked first, ended it)


def tokens_saved(trace: EpisodeTrace, at: int) -> int:
    """Model tokens the episode spent after step `at`."""
    end = trace.of_type("end")[0]
    total = end.prompt_tokens + end.completion_tokens if isinstance(end, EndEvent) else 0
    kept = sum(a.prompt_tokens + a.completion_tokens for a in trace.of_type("act") if a.step <= at)
    return max(0, total - kept)


def recorded_value(trace: EpisodeTrace) -> int:
    """The stall budget the run had (0: none; traces before version 6 had none)."""
    start = trace.of_type("start")[0]
    budgets = start.budgets if isinstance(start, StartEvent) else {}
    return int(budgets.get("stall_steps", 0) or 0)


def replay(traces: list[EpisodeTrace], values: tuple[int, ...] = VALUES) -> dict[str, Any]:
    """Per arm: episodes, won, tokens, and per value the winners it ends, the losers it ends early, tokens saved."""
    by_arm: dict[str, list[EpisodeTrace]] = defaultdict(list)
    incomplete: dict[str, int] = defaultdict(int)
    for t in traces:
        if t.of_type("end"):
            by_arm[t.arm].append(t)
        else:
            incomplete[t.arm] += 1
    out: dict[str, Any] = {}
    for arm, eps in sorted(by_arm.items()):
        ends = [e.of_type("end")[0] for e in eps]
        total = sum(e.prompt_tokens + e.completion_tokens for e in ends if isinstance(e, EndEvent))
        recorded = max(recorded_value(t) for t in eps)
        rows = {}
        for n in values:
            if recorded and n >= recorded:
                continue
            cut = early = saved = 0
            for t, end in zip(eps, ends):
                at = ended_at(t, n)
                if at is None:
                    continue
                if isinstance(end, EndEvent) and end.success:
                    cut += 1
                else:
                    early += 1
                    saved += tokens_saved(t, at)
            rows[n] = {"winners_ended": cut, "losers_ended_early": early, "tokens_saved": saved}
        won = sum(1 for e in ends if isinstance(e, EndEvent) and e.success)
        out[arm] = {
            "episodes": len(eps),
            "incomplete": incomplete[arm],
            "won": won,
            "tokens": total,
            "recorded_stall_steps": recorded,
            "values": rows,
        }
    return out


def fitted(results: list[dict[str, Any]], values: tuple[int, ...] = VALUES) -> int | None:
    """Twice the smallest value that ends no won episode in any of `results` (None: every value ends one)."""
    safe = [
        n
        for n in values
        if all(arm["values"].get(n, {}).get("winners_ended", 1) == 0 for r in results for arm in r.values())
    ]
    return 2 * min(safe) if safe else None


def table(name: str, result: dict[str, Any]) -> list[str]:
    lines = []
    for arm, r in result.items():
        left = f" ({r['incomplete']} incomplete, left out)" if r.get("incomplete") else ""
        lines.append(f"\n{name}, {arm}: {r['won']}/{r['episodes']} won, {r['tokens']:,} tokens{left}")
        lines.append("| stall_steps | won episodes ended | lost episodes ended early | tokens saved |")
        lines.append("|---:|---:|---:|---:|")
        for n, v in r["values"].items():
            share = v["tokens_saved"] / r["tokens"] if r["tokens"] else 0.0
            lines.append(
                f"| {n} | {v['winners_ended']} | {v['losers_ended_early']} | {v['tokens_saved']:,} ({share:.0%}) |"
            )
    return lines


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--fit", required=True, help="comma-separated eval run folders the value is fitted on")
    ap.add_argument("--runs", default="", help="comma-separated eval run folders held out")
    ap.add_argument("--out", required=True, help="folder for stall_replay.json and stall_replay.md")
    args = ap.parse_args(argv)
    fit = {p: replay(read_traces(Path(p) / "traces.jsonl")) for p in args.fit.split(",") if p}
    held = {p: replay(read_traces(Path(p) / "traces.jsonl")) for p in args.runs.split(",") if p}
    value = fitted(list(fit.values()))
    lines = [f"# Stall budget replayed on recorded runs\n\nfitted on {', '.join(fit)}: stall_steps = {value}"]
    for name, r in {**fit, **held}.items():
        lines += table(name + (" (fit)" if name in fit else " (held out)"), r)
    out = Path(args.out)
    write_json(out / "stall_replay.json", {"fit": fit, "held_out": held, "fitted": value})
    write_text(out / "stall_replay.md", "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
