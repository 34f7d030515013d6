"""Offline metrics of model outputs against a dataset fold's targets: pure functions of texts and rows.

    from simplan.evaluation.offline_metrics import decider_metrics, simulator_metrics
    simulator_metrics(["You see a key."], [True], [{"completion": "You see a key."}], error_texts=set())

`matches` is the one exact rule (a decider's action with white space collapsed, a simulator's observation as
core/text.py `exact`, the rule the traces use online); evaluation/offline.py defines every metric in its
docstring and computes them per variant and task family.
"""

from __future__ import annotations

from typing import Any

from simplan.core.text import collapse, exact, normalize, token_f1
from simplan.data.format import split_verdict
from simplan.inference.planning.sim_accuracy import SimulatorAccuracy, simulator_prompt_action


def matches(role: str, prediction: str, gold: str) -> bool:
    """Whether a prediction is exact: a decider's action text equals the gold one with white space collapsed (case
    kept: tool-call arguments are case-sensitive), a simulator's observation is the gold one as core.text.exact
    says (lower-cased too), the rule the traces' simulator accuracy uses online."""
    return exact(prediction, gold) if role == "simulator" else collapse(prediction) == collapse(gold)


def decider_metrics(
    preds: list[str],
    stopped: list[bool] | None,
    rows: list[dict[str, Any]],
    verdicts: list[str | None] | None = None,
) -> dict[str, Any]:
    """`stopped`: None when unknown (outputs read back from a predictions file without it: no parse/stopped);
    `verdicts` (with --replay): per row, None for an exact match, else a `simplan.data.replay` verdict."""
    n = max(len(rows), 1)
    hits = sum(matches("decider", p, r["completion"]) for p, r in zip(preds, rows))
    out: dict[str, Any] = {"n": len(rows), "exact": hits / n, "parse": None, "stopped": None}
    if stopped is not None:
        out["parse"] = sum(bool(p.strip()) and "\n" not in p.strip() and s for p, s in zip(preds, stopped)) / n
        out["stopped"] = sum(stopped) / n
    with_valid = [(p, r["valid_actions"]) for p, r in zip(preds, rows) if r.get("valid_actions")]
    if with_valid:
        ok = sum(normalize(p) in {normalize(v) for v in va} for p, va in with_valid)
        out["valid"] = ok / len(with_valid)
    else:
        out["valid"] = None  # the dataset has no valid_actions column
    if verdicts is not None:
        out["equivalent"] = sum(v == "equivalent" for v in verdicts) / n
        out["exact_or_equivalent"] = out["exact"] + out["equivalent"]
        out["replay_unknown"] = sum(v == "unknown" for v in verdicts) / n
    return out


def simulator_metrics(
    preds: list[str],
    stopped: list[bool] | None,
    rows: list[dict[str, Any]],
    error_texts: set[str],
    verdicts: bool = False,
) -> dict[str, Any]:
    """`verdicts`: the dataset was built with verdict lines (its PromptSettings.verdicts); adds `verdict_metrics`."""
    n = max(len(rows), 1)
    hits = sum(matches("simulator", p, r["completion"]) for p, r in zip(preds, rows))
    f1 = sum(token_f1(p, r["completion"]) for p, r in zip(preds, rows))
    out: dict[str, Any] = {
        "n": len(rows),
        "exact": hits / n,
        "token_f1": f1 / n,
        "stopped": None if stopped is None else sum(stopped) / n,
    }
    if rows and "error" in rows[0]:
        gold = [bool(r["error"]) for r in rows]
        guess = [normalize(p) in error_texts for p in preds]
        tp = sum(g and h for g, h in zip(gold, guess))
        out["error_precision"] = tp / sum(guess) if sum(guess) else None
        out["error_recall"] = tp / sum(gold) if sum(gold) else None
        out["error_rows"] = sum(gold)
    if verdicts:
        out |= verdict_metrics(preds, rows)
    return out


def verdict_metrics(preds: list[str], rows: list[dict[str, Any]]) -> dict[str, Any]:
    """How well predictions say when a step ends the episode (data/format.py split_verdict, the planner's reading):
    `verdict_recall`, of the rows whose target ends with a verdict, the share predicted with the same verdict;
    `verdict_precision`, of the predictions with a verdict, the share whose target has it; `verdict_rows`, the
    targets with one. None where nothing is counted."""
    gold = [split_verdict(r["completion"])[1] for r in rows]
    guess = [split_verdict(p)[1] for p in preds]
    same = sum(g is not None and g == h for g, h in zip(gold, guess))
    ended, said = sum(g is not None for g in gold), sum(h is not None for h in guess)
    return {
        "verdict_recall": same / ended if ended else None,
        "verdict_precision": same / said if said else None,
        "verdict_rows": ended,
    }


def simulator_verb_accuracy(preds: list[str], rows: list[dict[str, Any]]) -> SimulatorAccuracy:
    """Exact predictions per verb of the action each row's prompt asks about (exact as in `simulator_metrics`)."""
    return SimulatorAccuracy.from_pairs(
        (simulator_prompt_action(r["prompt"]), matches("simulator", p, r["completion"])) for p, r in zip(preds, rows)
    )
