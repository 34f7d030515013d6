"""Markdown + self-contained HTML reports of evaluation runs, side by side, every number from the traces.

    simplan report runs/eval/twx-dev runs/eval/twx-dev-faults --out runs/report
    from simplan.evaluation.report import write_report
    paths = write_report(["runs/eval/twx-dev"], "runs/report")    # {"md": ..., "html": ..., "plots": [...]}

Reads each run's traces.jsonl (evaluation/metrics.py computes every metric from them), names the
files with their size and SHA-256 so each number can be traced back, and writes:
- report.md opening with each arm against the first (reactive) task by task: the paired success
  difference, its interval and the exact McNemar p-value, and the same for the mean final score (the
  partial progress of episodes not won; a sign test); then the tables in the order a reader needs
  them: each pair of arms compared task by task (also tokens and wall seconds per success,
  evaluation/paired.py); with several runs, each later run against the first, arm by arm, on the tasks
  both played (a flywheel round's old and new adapters); success by game; lost episodes by loss class
  (evaluation/losses.py); the arms side by side; prompt tokens per decision, imagined step and real step,
  prefilled vs reused from the prefix cache; the trace files; transient failures that got through and
  premature finishes, for runs that have any; where the judge departed from the decider's most likely
  action (and the judge part that decided), for runs where it did; episode endings foreseen by the
  simulator's verdicts, for runs that have them; pivot and replan reasons), and plots/*.png next to it;
- report.html, the same content with the plots embedded as base64 PNG (one file to share);
- metrics.json, every run's per-arm and per-(arm, game) metrics (GroupMetrics) as numbers.
Plots (matplotlib, Agg backend): success by arm and game (Wilson 95% intervals), tokens per
episode versus success, and pivot reasons by rule.

The parts: evaluation/report_data.py loads the runs, evaluation/report_tables.py makes the tables,
evaluation/report_plots.py the plots; this module lays them out and writes the files.
"""

from __future__ import annotations

import base64
import html
import time
from pathlib import Path
from typing import Any

from simplan.core.errors import InputError
from simplan.core.io import atomic_open, write_json, write_text
from simplan.evaluation.report_data import RunData, load_run_data
from simplan.evaluation.report_plots import PLOTS
from simplan.evaluation.report_tables import (
    Table,
    arm_comparisons,
    arms_table,
    ask_table,
    backtrack_table,
    coverage_lines,
    departure_table,
    family_tables,
    files_table,
    grade_table,
    headline,
    invocations_table,
    loss_table,
    lost_episodes_table,
    paired_table,
    prompt_steps_table,
    reasons_table,
    retry_table,
    runs_table,
    subgoal_table,
    verdict_table,
)

CSS = (
    "body{font-family:system-ui,sans-serif;margin:2em;max-width:1400px}"
    "table{border-collapse:collapse;margin:0.5em 0 1.5em;font-size:13px}"
    "td,th{border:1px solid #ccc;padding:3px 7px;text-align:right}td:first-child,th:first-child{text-align:left}"
    "th{background:#f3f3f3}.note{color:#555;font-size:13px}img{max-width:100%}"
)


def _bold(markdown: str) -> str:
    """A headline line as HTML: escaped, its `**...**` parts bold."""
    parts = html.escape(markdown).split("**")
    return "".join(f"<b>{p}</b>" if i % 2 else p for i, p in enumerate(parts))


def _unique_names(runs: list[str | Path]) -> list[str]:
    names, seen = [], {}
    for r in runs:
        p = Path(r)
        base = p.name if p.is_dir() else p.stem
        seen[base] = seen.get(base, 0) + 1
        names.append(base if seen[base] == 1 else f"{base}#{seen[base]}")
    return names


def metrics_json(runs: list[RunData]) -> dict[str, Any]:
    """Every run's per-arm and per-(arm, game) metrics as plain JSON, with the trace files they come from."""
    return {
        "runs": [
            {
                "name": r.name,
                "path": str(r.path),
                "files": r.files,
                "arms": [m.to_dict() for m in r.arms],
                "families": [m.to_dict() for m in r.families],
            }
            for r in runs
        ]
    }


def write_report(
    run_dirs: list[str | Path],
    out_dir: str | Path,
    title: str = "simplan evaluation report",
    extra: list[Table] | None = None,
) -> dict:
    """Write report.md (+ plots/*.png) and a self-contained report.html; returns their paths. `extra`: tables a
    caller measured beside the runs (the flywheel's simulator check), shown after the main ones."""
    if not run_dirs:
        raise InputError("write_report: give at least one run folder (simplan eval --out) or trace file")
    out = Path(out_dir)
    runs = [load_run_data(r, n) for r, n in zip(run_dirs, _unique_names(run_dirs))]
    empty = [str(r.path) for r in runs if not r.records]
    if len(empty) == len(runs):
        raise InputError(f"write_report: no finished episode in {', '.join(empty)}; run `simplan eval` first")
    by_game = [family_tables(r) for r in runs]
    # The paired comparison first, then per game, then why episodes were lost; the per-arm rates after them.
    comparisons = arm_comparisons(runs)
    main = [paired_table(comparisons)]
    between_runs = runs_table(runs)
    if between_runs is not None:
        main.append(between_runs)
    main += [success for success, _ in by_game]
    main += [loss_table(runs), arms_table(runs), prompt_steps_table(runs), files_table(runs)]
    retries = retry_table(runs)
    if retries is not None:
        main.append(retries)
    goals = subgoal_table(runs)
    if goals is not None:
        main.append(goals)
    main += [t for t in (backtrack_table(runs), ask_table(runs), grade_table(runs)) if t is not None]
    main += [t for t in (departure_table(runs), verdict_table(runs)) if t is not None]
    main += extra or []
    details = [detail for _, detail in by_game]
    details += [reasons_table(runs), lost_episodes_table(runs)]
    inv = invocations_table(runs)
    if inv is not None:
        details.append(inv)

    plots: list[tuple[str, str, bytes]] = [(name, caption, fn(runs)) for name, caption, fn in PLOTS]
    plot_paths = []
    for name, _, png in plots:
        p = out / "plots" / f"{name}.png"
        with atomic_open(p, "wb") as f:
            f.write(png)
        plot_paths.append(p)

    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    intro = (
        f"Generated {stamp} by `simplan report` from {len(runs)} run(s). Every metric is computed from the "
        "trace files listed below (evaluation/metrics.py over inference/trace.summarize); episodes are "
        "deduplicated by episode id. Success intervals are Wilson 95%; arms are compared task by task "
        "(exact McNemar test, paired bootstrap interval)."
    )
    lead = headline(comparisons, runs) + coverage_lines(runs)
    md = [f"# {title}", ""] + [f"- {line}" for line in lead] + ["", intro, ""]
    md += [t.markdown() for t in main]
    md += ["## Plots", ""]
    md += [f"![{caption}](plots/{name}.png)\n" for name, caption, _ in plots]
    md += ["## Details", ""]
    md += [t.markdown() for t in details]
    md_path = out / "report.md"
    write_text(md_path, "\n".join(md))
    json_path = out / "metrics.json"
    write_json(json_path, metrics_json(runs))

    imgs = "".join(
        f"<figure><img alt='{html.escape(caption)}' src='data:image/png;base64,{base64.b64encode(png).decode()}'>"
        f"<figcaption>{html.escape(caption)}</figcaption></figure>"
        for _, caption, png in plots
    )
    body = (
        f"<h1>{html.escape(title)}</h1>"
        + ("<ul>" + "".join(f"<li>{_bold(line)}</li>" for line in lead) + "</ul>" if lead else "")
        + f"<p>{html.escape(intro)}</p>"
        + "".join(t.html() for t in main)
        + f"<h2>Plots</h2>{imgs}<h2>Details</h2>"
        + "".join(t.html() for t in details)
    )
    html_path = out / "report.html"
    write_text(
        html_path,
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>{CSS}</style></head><body>{body}</body></html>\n",
    )
    return {
        "md": md_path,
        "html": html_path,
        "json": json_path,
        "plots": plot_paths,
        "runs": [str(r.path) for r in runs],
    }
