"""Fit the outcome judge on dev data, and measure how well the simulator's outcome probabilities foresee reality.

    simplan fit-judge --inputs runs/data/twx-dev-cf.jsonl --model smollm2-135m-instruct \\
        --adapters decider=DIR,simulator=DIR --out runs/fit-judge --write_adapter true

Inputs are dev trajectories with counterfactual alternatives (`simplan counterfactuals`): from each sampled
state, the recorded action and its alternatives are candidates whose real outcome is known. The decider scores
the state's valid actions (the log-probability the planner ranks by) and the simulator the five outcome lines of
every candidate (inference/planning/outcomes.py), as the planner asks them. Then:

- metrics: for "lost" and for "bad" (lost or error), the AUROC of the predicted probability, the best recall
  at precision >= `precision` and its threshold, per task family and overall; calibration (expected
  calibration error and the reliability table, plotted); accuracy of the most probable class;
- the veto: the lowest threshold on P(lost or error) whose vetoes are right at least `precision` of the time,
  over the decider's first choice of each state, the actions a veto overrides (`veto_on: first_choices`, the
  default), or over every candidate (`veto_on: candidates`); and what a veto does to those first choices: how many it
  overrides at the fitted veto and at a few other thresholds, and how many of those rightly;
- the learned pivot's threshold: the lowest P(lost) whose "lost" calls are right at least `precision` of the
  time, on the same rows as the veto (inference/planning/outcomes.py);
- the value: logistic regression of "the action was a good one" (it made progress or won, or it is the
  expert's own action) on the decider's log-probability and the outcome probabilities.
Written to `out` (metrics.json, metrics.md, rows.jsonl, reliability.png); with `write_adapter` the fitted judge
goes beside the simulator adapter as outcome_judge.json, which the planner reads. `rows` refits from an earlier
run's rows.jsonl without a model (another precision or `veto_on`, in seconds).
"""

from __future__ import annotations

import json
import random
import time
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from simplan.core.errors import InputError
from simplan.core.io import write_json, write_text
from simplan.data.build_inputs import expand_inputs, load_trajectories
from simplan.data.episode import EpisodeState, read_settings, renderer_for, step_outcome
from simplan.data.outcomes import OUTCOMES
from simplan.envs.actions import render_action
from simplan.envs.failures import rules_of_env
from simplan.evaluation.outcome_metrics import binary_metrics, calibration, fit_logistic, veto_threshold
from simplan.inference.engines.base import ScoreRequest, log_softmax
from simplan.inference.planning.outcomes import (
    BAD,
    FEATURES,
    GOOD,
    OUTCOME_JUDGE_FILE,
    OutcomeJudge,
    features,
    outcome_probabilities,
    outcome_request,
)


def _help(text: str) -> dict[str, str]:
    return {"help": text}


VETO_ON = ("candidates", "first_choices")


@dataclass
class FitJudgeConfig:
    inputs: list[str] = field(default_factory=list, metadata=_help("dev trajectories with alternatives (JSONL)"))
    out: str = field(default="runs/fit-judge", metadata=_help("folder for metrics.json, metrics.md, reliability.png"))
    states: int = field(default=300, metadata=_help("states sampled, spread over task families (0: all)"))
    precision: float = field(default=0.8, metadata=_help("precision the veto must reach on dev"))
    decider_adapter: str = field(default="decider", metadata=_help("engine adapter of the decider"))
    simulator_adapter: str = field(default="simulator", metadata=_help("engine adapter of the simulator"))
    write_adapter: bool = field(default=False, metadata=_help(f"write {OUTCOME_JUDGE_FILE} beside the simulator"))
    seed: int = field(default=0, metadata=_help("seed of the state sample"))
    veto_on: str = field(
        default="first_choices",
        metadata=_help(
            "where the veto's precision is reached: first_choices (the decider's top action of each state: the "
            "ones a veto overrides, so its overrides are right that often) or candidates (every scored action; "
            "the many plainly bad alternatives, never overridden, lift its precision: on TWX it overrode good "
            "first choices, bench/RESULTS.md)"
        ),
    )
    rows: str = field(
        default="", metadata=_help("refit from this rows.jsonl of an earlier fit-judge run (no model is loaded)")
    )

    def __post_init__(self) -> None:
        if not self.inputs and not self.rows:
            raise ValueError("inputs: give the dev trajectories with alternatives (`simplan counterfactuals --out`)")
        if self.veto_on not in VETO_ON:
            raise ValueError(f"veto_on: {self.veto_on!r} is not one of {', '.join(VETO_ON)}")
        if self.rows and self.write_adapter:
            raise ValueError(
                "write_adapter: a refit from rows has no engine and so no adapter folder; copy "
                "metrics.json's judge into OUTCOME_JUDGE_FILE beside the simulator adapter yourself"
            )
        if not 0.0 < self.precision <= 1.0:
            raise ValueError(f"precision: must be in (0, 1], got {self.precision}")
        if self.states < 0:
            raise ValueError(f"states: must be >= 0, got {self.states}")


@dataclass
class Row:
    """One candidate of one sampled state: its real outcome and what the models said of it."""

    family: str
    state: int
    action: str
    outcome: str
    expert: bool  # the recorded action of an expert path
    logprob: float = 0.0
    probs: dict[str, float] = field(default_factory=dict)


def sample_states(trajectories: list[Any], limit: int, seed: int) -> list[tuple[Any, int]]:
    """(trajectory, step) of states with alternatives, spread over families, at most `limit` (0: all)."""
    by_family: dict[str, list[tuple[Any, int]]] = defaultdict(list)
    for traj in trajectories:
        for t, step in enumerate(traj.steps):
            if step.alternatives:
                by_family[traj.task.family or ""].append((traj, t))
    rng = random.Random(seed)
    for items in by_family.values():
        rng.shuffle(items)
    picked, families = [], sorted(by_family)
    while families and (not limit or len(picked) < limit):
        for f in list(families):
            if not by_family[f]:
                families.remove(f)
                continue
            picked.append(by_family[f].pop())
            if limit and len(picked) >= limit:
                break
    return picked


def collect_rows(cfg: FitJudgeConfig, engine: Any) -> list[Row]:
    """Score every sampled state's candidates with the engine's decider and simulator (module docstring)."""
    from tqdm.auto import tqdm

    loaded = load_trajectories(expand_inputs(cfg.inputs), include_errored=False)
    dirs = dict(getattr(engine, "adapter_dirs", None) or {})
    sim_settings = read_settings(dirs[cfg.simulator_adapter]) if cfg.simulator_adapter in dirs else None
    if sim_settings is None or not sim_settings.outcomes:
        raise InputError(
            f"simulator_adapter: {cfg.simulator_adapter!r} was not trained with outcome lines (its "
            "prompt_settings.json has no outcomes: true); build its dataset with `simplan build --role simulator "
            "--outcomes true`"
        )
    dec_settings = read_settings(dirs.get(cfg.decider_adapter, "")) if cfg.decider_adapter in dirs else None
    tok = getattr(engine, "tokenizer", None)
    sim, dec = renderer_for(sim_settings, tok), renderer_for(dec_settings or sim_settings, tok)
    rows: list[Row] = []
    for i, (traj, t) in enumerate(
        tqdm(sample_states(loaded.trajectories, cfg.states, cfg.seed), desc="fit-judge", unit="state")
    ):
        rules = rules_of_env(traj.env)
        state = EpisodeState.from_trajectory(traj, failures=rules)
        before = EpisodeState(state.turns[:t] + [_opened(state.turns[t])])
        step = traj.steps[t]
        cands = [
            (
                render_action(step.action),
                step_outcome(step, traj.steps[t - 1].score if t else 0.0, rules),
                traj.policy == "expert" and step.source == "expert",
            )
        ]
        cands += [(render_action(a.action), a.outcome, False) for a in step.alternatives]
        session = f"fit-judge-{i}"
        valid = list(step.valid_actions or [])
        requests = [
            outcome_request(sim.simulator_messages(before, a), cfg.simulator_adapter, session) for a, _, _ in cands
        ]
        if valid:
            requests.append(
                ScoreRequest(
                    candidates=valid,
                    adapter=cfg.decider_adapter,
                    messages=dec.decider_messages(before),
                    tag="decide",
                    session=session,
                )
            )
        results = engine.score(requests)
        lp = log_softmax(results[-1].logprobs) if valid else []
        ranked = dict(zip(valid, lp))
        floor = min(lp) if lp else 0.0
        for (action, outcome, expert), probs in zip(cands, outcome_probabilities(results[: len(cands)])):
            rows.append(Row(traj.task.family or "", i, action, outcome, expert, ranked.get(action, floor), probs))
        end = getattr(engine, "end_session", None)
        if callable(end):
            end(session)
    return rows


def _opened(turn: Any) -> Any:
    from dataclasses import replace

    return replace(turn, action=None, next_observation=None, notes=list(turn.notes))


def outcome_metrics(rows: list[Row], precision: float) -> dict[str, Any]:
    """Per family and overall: lost and bad as yes/no predictions, calibration, most-probable-class accuracy."""

    def block(sel: list[Row]) -> dict[str, Any]:
        real = np.array([r.outcome for r in sel])
        out: dict[str, Any] = {"candidates": len(sel), "real": {o: int((real == o).sum()) for o in OUTCOMES}}
        for name, classes in (("lost", ("lost",)), ("bad", BAD)):
            scores = np.array([sum(r.probs[c] for c in classes) for r in sel])
            labels = np.isin(real, classes)
            out[name] = binary_metrics(scores, labels, precision)
        predicted = np.array([max(OUTCOMES, key=lambda o: r.probs[o]) for r in sel])
        out["accuracy"] = float((predicted == real).mean()) if len(sel) else None
        return out

    families = sorted({r.family for r in rows})
    result = {"all": block(rows), "by_family": {f: block([r for r in rows if r.family == f]) for f in families}}
    probs = np.array([r.probs[o] for r in rows for o in OUTCOMES])
    labels = np.array([r.outcome == o for r in rows for o in OUTCOMES])
    result["calibration"] = calibration(probs, labels)  # every class's probability against its occurrence
    lost = np.array([r.probs["lost"] for r in rows])
    result["calibration_lost"] = calibration(lost, np.array([r.outcome == "lost" for r in rows]))
    return result


VETO_PROBES = (0.3, 0.5, 0.7)  # P(lost or error) thresholds reported for the decider's first choices


def first_choice_rows(rows: list[Row]) -> list[Row]:
    """The decider's first choice of each state: the candidate it ranks highest (the action the planner keeps
    unless vetoed)."""
    by_state: dict[int, Row] = {}
    for r in rows:
        if r.state not in by_state or r.logprob > by_state[r.state].logprob:
            by_state[r.state] = r
    return list(by_state.values())


def first_choices(rows: list[Row], veto: float) -> dict[str, Any]:
    """What a veto would do to the decider's first choice of each state: how many states, how many first choices
    were bad, and at the fitted veto and at each of VETO_PROBES, how many it overrides and how many rightly."""
    first = first_choice_rows(rows)

    def overrides(threshold: float) -> dict[str, Any]:
        hit = [r for r in first if OutcomeJudge.bad(r.probs) > threshold]
        return {"threshold": threshold, "overridden": len(hit), "rightly": sum(r.outcome in BAD for r in hit)}

    return {
        "states": len(first),
        "bad": sum(r.outcome in BAD for r in first),
        "at_veto": overrides(veto),
        "probes": [overrides(t) for t in VETO_PROBES],
    }


def fit(rows: list[Row], precision: float, veto_on: str = "first_choices") -> OutcomeJudge:
    """The veto and the learned pivot's threshold from dev precision on `veto_on`'s rows, the value from logistic
    regression (module docstring)."""
    population = first_choice_rows(rows) if veto_on == "first_choices" else rows
    bad = np.array([OutcomeJudge.bad(r.probs) for r in population])
    is_bad = np.array([r.outcome in BAD for r in population])
    veto, recall, reached = veto_threshold(bad, is_bad, precision)
    lost = np.array([r.probs["lost"] for r in population])
    loss_pivot, pivot_recall, pivot_reached = veto_threshold(
        lost, np.array([r.outcome == "lost" for r in population]), precision
    )
    went_on = [r for r in population if r.outcome not in ("lost", "won")]  # steps after which an episode goes on
    names = [f for f in FEATURES if f != "p_no_change"]  # the probabilities sum to 1: one is the reference
    x = np.array([[features(r.logprob, r.probs)[f] for f in names] for r in rows])
    y = np.array([float(r.outcome in GOOD or (r.expert and r.outcome not in BAD)) for r in rows])
    w, b = fit_logistic(x, y)
    fitted = {
        "candidates": len(rows),
        "states": len({r.state for r in rows}),
        "precision_target": precision,
        "veto_on": veto_on,
        "veto_recall": recall,
        "veto_precision": reached,
        "loss_pivot_recall": pivot_recall,
        "loss_pivot_precision": pivot_reached,
        # where the learned pivot can fire at all (an ending step ends the episode first): its false alarms
        "loss_pivot_went_on": len(went_on),
        "loss_pivot_fires_went_on": sum(r.probs["lost"] > loss_pivot for r in went_on),
        "good_share": float(y.mean()) if len(y) else None,
    }
    return OutcomeJudge(
        veto=veto, loss_pivot=loss_pivot, weights=dict(zip(names, map(float, w))), bias=b, fitted=fitted
    )


def plot_reliability(metrics: dict[str, Any], path: Path) -> Path | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(4.5, 4.5))
    for key, label in (("calibration", "every class"), ("calibration_lost", "lost")):
        bins = metrics[key]["bins"]
        ax.plot(
            [b["predicted"] for b in bins],
            [b["observed"] for b in bins],
            "o-",
            label=f"{label} (ECE {metrics[key]['ece']:.3f})",
        )
    ax.plot([0, 1], [0, 1], "k:", lw=1)
    ax.set(xlabel="predicted probability", ylabel="observed frequency", title="Outcome reliability (dev)")
    ax.legend(loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def markdown(metrics: dict[str, Any], judge: OutcomeJudge, precision: float) -> str:
    key = f"recall_at_precision_{precision:g}"
    lines = [
        "# Outcome predictions on dev states",
        "",
        f"Candidates: {metrics['all']['candidates']} from {judge.fitted['states']} states; veto P(lost or error) > "
        f"{judge.veto:.3f} (on {judge.fitted.get('veto_on', 'candidates')}: precision "
        f"{judge.fitted['veto_precision']}, recall {judge.fitted['veto_recall']:.3f}); learned pivot P(lost) > "
        f"{judge.loss_pivot:.3f} (precision {judge.fitted.get('loss_pivot_precision')}, recall "
        f"{judge.fitted.get('loss_pivot_recall', 0.0):.3f}; on dev it would fire on "
        f"{judge.fitted.get('loss_pivot_fires_went_on')} of the {judge.fitted.get('loss_pivot_went_on')} steps "
        "that did not end the game, the only ones where it can).",
        "",
        f"| family | candidates | lost | AUROC lost | recall lost at p>={precision:g} | bad | AUROC bad | "
        f"recall bad at p>={precision:g} | class accuracy |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, m in [("all", metrics["all"]), *metrics["by_family"].items()]:

        def fmt(x: Any) -> str:
            return "-" if x is None else f"{x:.3f}"

        lines.append(
            f"| {name} | {m['candidates']} | {m['lost']['positives']} | {fmt(m['lost']['auroc'])} | "
            f"{fmt(m['lost'][key])} | {m['bad']['positives']} | {fmt(m['bad']['auroc'])} | {fmt(m['bad'][key])} | "
            f"{fmt(m['accuracy'])} |"
        )
    lines += [
        "",
        f"Expected calibration error: every class {metrics['calibration']['ece']:.3f}, lost "
        f"{metrics['calibration_lost']['ece']:.3f}.",
        "",
        "Value weights: "
        + ", ".join(f"{k} {v:+.3f}" for k, v in judge.weights.items())
        + f", bias {judge.bias:+.3f}.",
    ]
    first = metrics.get("first_choices")
    if first:
        probes = "; ".join(
            f"> {p['threshold']:g}: {p['overridden']} ({p['rightly']} rightly)" for p in first["probes"]
        )
        at = first["at_veto"]
        lines += [
            "",
            f"The decider's first choices (the candidate it ranks highest in each state): {first['states']}, "
            f"{first['bad']} of them lost or error. The fitted veto overrides {at['overridden']} "
            f"({at['rightly']} rightly); a veto at P(lost or error) {probes}.",
        ]
    return "\n".join(lines) + "\n"


def read_rows(path: str | Path) -> list[Row]:
    """The rows.jsonl an earlier fit-judge run wrote."""
    from simplan.core.io import iter_jsonl, parse_json

    try:
        return [Row(**parse_json(text)) for _, text in iter_jsonl(path)]
    except FileNotFoundError:
        raise InputError(
            f"rows: {path} does not exist; give the rows.jsonl of a `simplan fit-judge --out` folder"
        ) from None
    except (TypeError, ValueError) as e:
        raise InputError(f"rows: {path} is not a fit-judge rows.jsonl ({e})") from None


def fit_judge(cfg: FitJudgeConfig, engine: Any | None) -> dict[str, Any]:
    """Score (or, with `rows`, read) the candidates, fit the judge and write it all to `out` (module docstring)."""
    started = time.perf_counter()
    rows = read_rows(cfg.rows) if cfg.rows else collect_rows(cfg, engine)
    if not rows:
        raise InputError(f"inputs: no state with alternatives in {cfg.inputs}; run `simplan counterfactuals` on them")
    metrics = outcome_metrics(rows, cfg.precision)
    judge = fit(rows, cfg.precision, cfg.veto_on)
    metrics["first_choices"] = first_choices(rows, judge.veto)
    judge.fitted |= {"inputs": cfg.inputs or [cfg.rows], "seconds": round(time.perf_counter() - started, 1)}
    out = Path(cfg.out)
    write_json(out / "metrics.json", {"config": asdict(cfg), "judge": asdict(judge), **metrics})
    write_text(out / "metrics.md", markdown(metrics, judge, cfg.precision))
    with open(out / "rows.jsonl", "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(asdict(r)) + "\n")
    plot = plot_reliability(metrics, out / "reliability.png")
    written = None
    if cfg.write_adapter and engine is not None:
        dirs = dict(getattr(engine, "adapter_dirs", None) or {})
        written = judge.write(Path(dirs[cfg.simulator_adapter]) / OUTCOME_JUDGE_FILE)
    return {"out": out, "judge": judge, "metrics": metrics, "plot": plot, "written": written}
