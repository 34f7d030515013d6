"""How well predicted outcome probabilities foresee real outcomes: AUROC, recall at a precision, calibration.

    from simplan.evaluation.outcome_metrics import binary_metrics, calibration, fit_logistic, veto_threshold
    m = binary_metrics(scores, labels, precision=0.8)   # auroc, best recall at precision >= 0.8 and its threshold
    c = calibration(probs, labels, bins=10)             # expected calibration error and the reliability bins
    w, b = fit_logistic(X, y)                           # L2-regularised logistic regression (Newton steps)

Pure functions over numpy arrays, shared by `simplan fit-judge` (evaluation/judge_fit.py) and its tests.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def auroc(scores: np.ndarray, labels: np.ndarray) -> float | None:
    """Area under the ROC curve (ties count half); None when one class is absent."""
    pos, neg = scores[labels], scores[~labels]
    if not len(pos) or not len(neg):
        return None
    order = np.argsort(np.concatenate([pos, neg]), kind="mergesort")
    ranks = np.empty(len(order))
    values = np.concatenate([pos, neg])[order]
    i = 0
    while i < len(values):  # average ranks of ties
        j = i
        while j + 1 < len(values) and values[j + 1] == values[i]:
            j += 1
        ranks[order[i : j + 1]] = (i + j) / 2 + 1
        i = j + 1
    return float((ranks[: len(pos)].sum() - len(pos) * (len(pos) + 1) / 2) / (len(pos) * len(neg)))


def precision_recall_at(scores: np.ndarray, labels: np.ndarray, threshold: float) -> tuple[float | None, float]:
    """(precision, recall) of calling `score > threshold` positive; precision None when nothing is called."""
    called = scores > threshold
    hits = int((called & labels).sum())
    precision = hits / int(called.sum()) if called.any() else None
    recall = hits / int(labels.sum()) if labels.any() else 0.0
    return precision, recall


def veto_threshold(scores: np.ndarray, labels: np.ndarray, precision: float) -> tuple[float, float, float | None]:
    """The lowest threshold t (over the scores seen) at which calling `score > t` positive has precision at least
    `precision`, with its recall and precision: (t, recall, precision). (1.0, 0.0, None) when no threshold reaches
    the precision: nothing is ever called positive."""
    best = (1.0, 0.0, None)
    for t in sorted(set(np.round(scores, 6).tolist()) - {1.0}):
        p, r = precision_recall_at(scores, labels, t)
        if p is not None and p >= precision and r > best[1]:
            best = (float(t), r, p)
    return best


def calibration(probs: np.ndarray, labels: np.ndarray, bins: int = 10) -> dict[str, Any]:
    """Expected calibration error of `probs` for `labels` and the reliability table (equal-width bins)."""
    edges = np.linspace(0.0, 1.0, bins + 1)
    idx = np.clip(np.digitize(probs, edges[1:-1]), 0, bins - 1)
    table, ece = [], 0.0
    for b in range(bins):
        sel = idx == b
        if not sel.any():
            continue
        mean_p, freq = float(probs[sel].mean()), float(labels[sel].mean())
        ece += sel.mean() * abs(mean_p - freq)
        table.append(
            {
                "bin": [round(edges[b], 2), round(edges[b + 1], 2)],
                "n": int(sel.sum()),
                "predicted": mean_p,
                "observed": freq,
            }
        )
    return {"ece": float(ece), "bins": table}


def binary_metrics(scores: np.ndarray, labels: np.ndarray, precision: float) -> dict[str, Any]:
    """One outcome as a yes/no prediction: positives, AUROC, the best recall at `precision`, and at 0.5."""
    t, recall, p = veto_threshold(scores, labels, precision)
    p50, r50 = precision_recall_at(scores, labels, 0.5)
    return {
        "n": int(len(labels)),
        "positives": int(labels.sum()),
        "auroc": auroc(scores, labels),
        f"recall_at_precision_{precision:g}": recall,
        "threshold": t,
        "precision_at_threshold": p,
        "precision_at_0.5": p50,
        "recall_at_0.5": r50,
    }


def fit_logistic(x: np.ndarray, y: np.ndarray, l2: float = 1e-3, steps: int = 50) -> tuple[np.ndarray, float]:
    """Weights and bias of logistic regression of y (0/1) on x by Newton's method with an L2 penalty on the
    weights (not the bias); deterministic, no library beyond numpy."""
    n, d = x.shape
    xb = np.hstack([x, np.ones((n, 1))])
    w = np.zeros(d + 1)
    reg = np.diag([l2] * d + [0.0])
    for _ in range(steps):
        z = np.clip(xb @ w, -30, 30)
        p = 1.0 / (1.0 + np.exp(-z))
        grad = xb.T @ (p - y) / n + reg @ w
        hess = (xb.T * (p * (1 - p))) @ xb / n + reg + 1e-9 * np.eye(d + 1)
        step = np.linalg.solve(hess, grad)
        w -= step
        if np.abs(step).max() < 1e-8:
            break
    return w[:-1], float(w[-1])
