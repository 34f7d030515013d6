"""How well each similarity tells a failing course from a good one: the expectation-mismatch pivot's measure.

    pairs = expectation_pairs(["runs/eval/twx-dev"])                 # every real step that had an expectation
    sims = {"token_f1": text_similarities(pairs, "token_f1"),
            "embedding": embedding_similarities(pairs, engine)}      # engine: an EmbeddingEngine (hf)
    table = mismatch_table(pairs, sims, {"token_f1": 0.75})

The pivot fires when similarity(expected, observed) falls below its threshold (inference/planning/pivots.py
ExpectationMismatch). A good similarity fires where the course is failing and stays quiet where it is not.
Each (expected, observed) pair from the traces is labelled twice: `episode_failed` (the episode was not
won: what the issue's measurement asks for) and `step_failed` (the real step itself failed or lost the
episode: the env flagged an error, or it ended the episode unwon). The table gives each similarity's AUROC
of `1 - similarity` for each label, and, at each threshold given (or at the one that fires as often as
token F1 at its own threshold, so the methods are compared at equal cost), how often it fires and how many
of those firings were on a failing episode.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from simplan.core.text import normalize, similarity
from simplan.evaluation.metrics import trace_files
from simplan.evaluation.outcome_metrics import auroc
from simplan.inference.engines.base import EmbedRequest, cosine
from simplan.inference.planning.trace import ActEvent, read_traces


@dataclass
class ExpectationPair:
    """One real step whose action was planned with an expected observation."""

    episode_id: str
    arm: str
    family: str
    step: int
    expected: str
    observed: str
    episode_failed: bool
    step_failed: bool


def expectation_pairs(runs: Iterable[str | Path], arms: Sequence[str] | None = None) -> list[ExpectationPair]:
    """Every act event with an expectation, of finished episodes of `arms` (None: all), in trace order."""
    pairs = []
    for run in runs:
        for path in trace_files(run):
            for trace in read_traces(path):
                end = trace.end
                if end is None or (arms is not None and trace.arm not in arms):
                    continue
                family = str(trace.task.get("family") or "")
                for i, act in enumerate(trace.of_type("act")):
                    assert isinstance(act, ActEvent)
                    if act.expectation is None:
                        continue
                    pairs.append(
                        ExpectationPair(
                            episode_id=trace.episode_id,
                            arm=trace.arm,
                            family=family,
                            step=i,
                            expected=act.expectation,
                            observed=act.observation,
                            episode_failed=not end.success,
                            step_failed=bool(act.error) or (bool(act.done) and not act.won),
                        )
                    )
    return pairs


def text_similarities(pairs: Sequence[ExpectationPair], method: str) -> np.ndarray:
    """core/text.py `similarity` of each pair (the pivot's text methods)."""
    return np.array([similarity(p.expected, p.observed, method) for p in pairs], dtype=float)


def embedding_similarities(
    pairs: Sequence[ExpectationPair], engine: Any, adapter: str | None = None, batch: int = 64
) -> np.ndarray:
    """Cosine of the two texts' embeddings (`engine.embed`, the model of `adapter`); 1.0 where the texts are the
    same after `normalize`, as for the text methods."""
    texts = sorted({normalize(t) for p in pairs for t in (p.expected, p.observed)})
    vectors: dict[str, list[float]] = {}
    for start in range(0, len(texts), batch):
        chunk = texts[start : start + batch]
        for text, res in zip(chunk, engine.embed([EmbedRequest(t, adapter=adapter) for t in chunk])):
            vectors[text] = res.vector
    out = []
    for p in pairs:
        a, b = normalize(p.expected), normalize(p.observed)
        out.append(1.0 if a == b else cosine(vectors[a], vectors[b]))
    return np.array(out, dtype=float)


def matched_threshold(sims: np.ndarray, rate: float) -> float:
    """The threshold under which `sims` fires on (about) `rate` of the pairs: the methods compared at equal cost."""
    if rate <= 0 or not len(sims):
        return float(sims.min(initial=0.0))
    return float(np.quantile(sims, rate, method="higher"))


def mismatch_row(pairs: Sequence[ExpectationPair], sims: np.ndarray, threshold: float) -> dict[str, Any]:
    """One similarity's numbers (module docstring) at `threshold`."""
    episode = np.array([p.episode_failed for p in pairs], dtype=bool)
    step = np.array([p.step_failed for p in pairs], dtype=bool)
    fires = sims < threshold
    fired = int(fires.sum())
    return {
        "pairs": len(pairs),
        "auroc_episode_failed": auroc(1.0 - sims, episode),
        "auroc_step_failed": auroc(1.0 - sims, step),
        "threshold": round(threshold, 4),
        "fires": fired,
        "fire_rate": round(fired / len(pairs), 4) if pairs else 0.0,
        "fired_on_failing_episode": round(float(episode[fires].mean()), 4) if fired else None,
        "fired_on_failed_step": round(float(step[fires].mean()), 4) if fired else None,
        "quiet_on_failed_step": int((~fires & step).sum()),
    }


def mismatch_table(
    pairs: Sequence[ExpectationPair],
    sims: dict[str, np.ndarray],
    thresholds: dict[str, float],
    reference: str = "token_f1",
) -> dict[str, dict[str, Any]]:
    """Each method's row at its own threshold (`thresholds`) and, for every method, at the threshold that fires as
    often as `reference` does at its own ("METHOD@matched")."""
    table = {name: mismatch_row(pairs, s, thresholds[name]) for name, s in sims.items() if name in thresholds}
    if reference in sims and reference in thresholds:
        rate = float((sims[reference] < thresholds[reference]).mean()) if len(pairs) else 0.0
        for name, s in sims.items():
            if name != reference:
                table[f"{name}@matched"] = mismatch_row(pairs, s, matched_threshold(s, rate))
    return table
