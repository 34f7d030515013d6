"""The report's plots as PNG bytes (matplotlib, Agg backend): success by arm and game (Wilson 95% intervals),
tokens per episode versus success, and pivot reasons by rule.

    from simplan.evaluation.report_plots import PLOTS
    for name, caption, plot in PLOTS:
        Path(f"{name}.png").write_bytes(plot(runs))      # runs: evaluation/report_data.py RunData

matplotlib is imported on the first plot, so the tables need no plotting library.
"""

from __future__ import annotations

import io
from typing import Any

from simplan.evaluation.metrics import GroupMetrics
from simplan.evaluation.report_data import RunData


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _png(fig: Any) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    _plt().close(fig)
    return buf.getvalue()


def _series(runs: list[RunData]) -> list[tuple[str, RunData, GroupMetrics]]:
    many = len(runs) > 1
    return [(f"{r.name}/{m.arm}" if many else m.arm, r, m) for r in runs for m in r.arms]


def plot_success(runs: list[RunData]) -> bytes:
    plt = _plt()
    series = _series(runs)
    fams = sorted({m.family for r in runs for m in r.families}) + ["all"]
    fig, ax = plt.subplots(figsize=(max(6.0, 1.1 * len(fams) * max(1, len(series)) / 2), 3.8))
    width = 0.8 / max(1, len(series))
    for i, (label, run, arm) in enumerate(series):
        cell = {m.family: m for m in run.families if m.arm == arm.arm}
        cell["all"] = arm
        xs, ys, lo, hi = [], [], [], []
        for j, fam in enumerate(fams):
            m = cell.get(fam)
            if m is None or not m.episodes:
                continue
            xs.append(j + (i - (len(series) - 1) / 2) * width)
            ys.append(m.success_rate)
            lo.append(max(0.0, m.success_rate - m.ci_low))  # matplotlib refuses negative error bars
            hi.append(max(0.0, m.ci_high - m.success_rate))
        ax.bar(xs, ys, width, yerr=[lo, hi], capsize=2, label=label)
    ax.set_xticks(range(len(fams)))
    ax.set_xticklabels(fams, rotation=30, ha="right")
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("success rate (95% CI)")
    ax.set_title("Success by arm and game")
    ax.legend(fontsize=8)
    return _png(fig)


def plot_tokens(runs: list[RunData]) -> bytes:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    for label, _, m in _series(runs):
        ax.errorbar(
            [m.tokens_per_episode],
            [m.success_rate],
            yerr=[[m.success_rate - m.ci_low], [m.ci_high - m.success_rate]],
            fmt="o",
            capsize=3,
            label=label,
        )
    ax.set_xlabel("model tokens per episode (prompt + completion)")
    ax.set_ylabel("success rate (95% CI)")
    ax.set_ylim(0, 1.05)
    ax.set_title("Tokens vs success")
    ax.legend(fontsize=8)
    return _png(fig)


def plot_pivots(runs: list[RunData]) -> bytes:
    plt = _plt()
    series = _series(runs)
    rules = sorted({rule for _, _, m in series for rule in m.pivots_by_rule})
    fig, ax = plt.subplots(figsize=(6.0, 0.5 * len(series) + 1.8))
    left = [0.0] * len(series)
    for rule in rules:
        vals = [float(m.pivots_by_rule.get(rule, 0)) for _, _, m in series]
        ax.barh(range(len(series)), vals, left=left, label=rule)
        left = [a + b for a, b in zip(left, vals)]
    ax.set_yticks(range(len(series)))
    ax.set_yticklabels([label for label, _, _ in series])
    ax.set_xlabel("pivots fired (all episodes)")
    ax.set_title("Pivot reasons" + ("" if rules else " (no pivot fired)"))
    if rules:
        ax.legend(fontsize=8)
    return _png(fig)


PLOTS = (
    ("success_by_arm_and_game", "Success by arm and game", plot_success),
    ("tokens_vs_success", "Tokens per episode vs success", plot_tokens),
    ("pivot_reasons", "Pivot reasons", plot_pivots),
)
