"""Offline metrics of a base model and/or a LoRA adapter on a fold of a built dataset.

    simplan eval-model --role decider --dataset runs/datasets/twx-decider --fold dev \\
        --model smollm2-135m-instruct --adapter runs/train/smollm2-twx-decider/adapter --limit 200

Batched greedy generation with transformers (+ peft); with an adapter the base model is evaluated
too (`--compare_base`, on by default), side by side, from the same loaded weights.

Decider metrics: `exact` (the next action equals the dataset's, white space collapsed, case kept),
`parse` (one non-empty line that ended with EOS), `stopped` (EOS within max_new_tokens) and
`valid` (case-insensitively one of the row's `valid_actions`; needs that column, else n/a).
Simulator metrics: `exact` and `token_f1` (core/text.py: the definitions traces and pivots use online, so
offline and online accuracy are one number) and precision/recall of
predicting an error observation: rows carry an `error` flag for their target, and a prediction
counts as an error when it equals (normalised) one of the error observations seen in the dataset.
On a dataset built with verdicts (prompt_settings.json `verdicts`: a reply to a step that ended the
episode ends with `[episode over: won|lost]`), `verdict_recall` / `verdict_precision` say how well the
simulator calls the end of an episode, over the `verdict_rows` targets with one; `exact` compares the
texts with their verdict lines.

`--replay` (decider) plays each miss in its environment (simplan.data.replay): `equivalent` is the
share of rows whose prediction is a later step of the expert plan that, done now, leaves a path as
short as the expert's (another order of interchangeable steps); `exact_or_equivalent` adds it to
`exact`, and `replay_unknown` counts misses that could not be judged (env not replayable). Exact
match stays the headline number; the replay says how many misses were real mistakes.

`--decode choices` (decider) decodes as the planning loop does with `propose: score`: every valid
action of the row (the prompt's list) is scored whole, EOS included, by the hf engine
(simplan.inference.engines.hf_peft), and the most likely one is the output; rows without valid
actions are generated freely, as the planner does for them. `valid` is then 100% by construction
and `exact` measures the decider's first proposal in an episode. The default `free` is plain greedy
text, which shows whether the model writes valid actions on its own. vLLM's `choice` decodes token
by token under a grammar, which can differ when two valid actions share a prefix.

Simulator accuracy per action verb (inference/planning/sim_accuracy.py: a command's first word, a tool call's
name; the action is read from the row's prompt) goes to metrics.json (`by_verb`, per variant) and, for
the adapter (else the base model), to out/simulator_accuracy.json (verb -> {n, exact, accuracy});
`--write_adapter_accuracy true` also writes it into the adapter's folder, where the planner's
selective router reads it (PlannerConfig.router).

Every metric is also broken down by task family (the dataset's `family` column). `--limit N` takes
N rows spread evenly over the families (round robin, each family in fold order), so a small sample
is not just the first game of the fold.

Writes out/metrics.json, out/metrics.md and out/predictions.jsonl (per row: gold, each variant's
output, whether it matched exactly and stopped with EOS, and with --replay its verdict).
`--predictions FILE` scores such a file again without a model (e.g. to add --replay later).

The parts: evaluation/offline_config.py (EvalModelConfig), evaluation/offline_metrics.py (the metrics),
evaluation/offline_generation.py (the outputs); this module reads the fold, replays, scores and writes.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from simplan.core.errors import InputError, MissingInputError
from simplan.core.io import iter_jsonl, write_json, write_jsonl, write_text
from simplan.core.text import collapse, normalize
from simplan.data.build_rows import step_rows
from simplan.data.episode import read_settings
from simplan.evaluation.offline_config import EvalModelConfig
from simplan.evaluation.offline_generation import Outputs, generate_variants
from simplan.evaluation.offline_metrics import decider_metrics, matches, simulator_metrics, simulator_verb_accuracy
from simplan.inference.planning.sim_accuracy import ACCURACY_FILE

if TYPE_CHECKING:
    from simplan.data.trajectory import Trajectory


def write_verb_accuracy(cfg: EvalModelConfig, outputs: dict[str, Any], rows: list[dict[str, Any]]) -> list[Path]:
    """The adapter's (else the base model's) per-verb accuracy as out/simulator_accuracy.json, and with
    --write_adapter_accuracy in the adapter's folder too; returns the files written."""
    variant = "adapter" if "adapter" in outputs else "base"
    if cfg.write_adapter_accuracy and variant != "adapter":
        raise InputError(
            f"write_adapter_accuracy: {cfg.predictions or 'the run'} has no adapter outputs; drop the flag"
        )
    table = simulator_verb_accuracy(outputs[variant][0], rows)
    written = [table.write(cfg.out_dir() / ACCURACY_FILE)]
    if cfg.write_adapter_accuracy:
        written.append(table.write(Path(cfg.adapter) / ACCURACY_FILE))
    return written


def _dataset_root(cfg: EvalModelConfig) -> Path:
    """The build's output folder (config.json, stats) for --dataset given as it or as its dataset/."""
    folder = Path(cfg.dataset)
    return folder.parent if folder.name == "dataset" and (folder.parent / "config.json").exists() else folder


def _load_rows(cfg: EvalModelConfig) -> tuple[list[dict[str, Any]], set[str]]:
    from datasets import load_from_disk

    folder = Path(cfg.dataset)
    if (folder / "dataset" / "dataset_dict.json").exists():
        folder = folder / "dataset"
    if not folder.exists():
        raise MissingInputError(f"dataset: {folder} does not exist; build it with `simplan build`")
    data = load_from_disk(str(folder))
    if cfg.fold not in data:
        raise InputError(f"fold: {cfg.fold!r} is not in {folder} (folds: {list(data)})")
    rows = _step_view(data[cfg.fold])
    if cfg.limit and cfg.limit < len(rows):
        rows = [rows[i] for i in spread_sample([r.get("family") or "" for r in rows], cfg.limit)]
    error_texts: set[str] = set()
    if "error" in data[cfg.fold].column_names or "errors" in data[cfg.fold].column_names:
        for name in data:
            error_texts |= {normalize(r["completion"]) for r in _step_view(data[name]) if r["error"]}
    return rows, error_texts


def _step_view(split: Any) -> list[dict[str, Any]]:
    """Rows of one fold, a conversation dataset's as one row per trained turn (data/build_rows.step_rows)."""
    if "weights" not in split.column_names:
        return split.to_list()
    return [r for row in split.to_list() for r in step_rows(row)]


def spread_sample(families: list[str], limit: int) -> list[int]:
    """Indices of `limit` rows taken round robin over the families (first-seen order), each family in
    row order: a sample that covers every family as evenly as its size allows."""
    queues: dict[str, list[int]] = {}
    for i, family in enumerate(families):
        queues.setdefault(family, []).append(i)
    picked: list[int] = []
    depth = 0
    while len(picked) < min(limit, len(families)):
        for queue in queues.values():
            if depth < len(queue) and len(picked) < limit:
                picked.append(queue[depth])
        depth += 1
    return sorted(picked)


def _cells(m: dict[str, Any], keys: list[str]) -> str:
    return " | ".join(
        "n/a" if m.get(k) is None else (f"{m[k]:.1%}" if isinstance(m[k], float) else str(m[k])) for k in keys
    )


def _table(results: dict[str, dict[str, Any]], cfg: EvalModelConfig) -> str:
    keys = [k for k in next(iter(results.values())) if k not in ("seconds", "by_family")]
    lines = [
        f"# eval-model: {cfg.role} on {cfg.dataset} ({cfg.fold})",
        "",
        f"outputs read from `{cfg.predictions}`"
        if cfg.predictions
        else f"model `{cfg.model}`"
        + (f", adapter `{cfg.adapter}`" if cfg.adapter else "")
        + (", decoding: the most likely valid action (`--decode choices`)" if cfg.decode == "choices" else ""),
        "",
        "| variant | " + " | ".join(keys) + " |",
        "|---" * (len(keys) + 1) + "|",
    ]
    lines += [f"| {name} | {_cells(m, keys)} |" for name, m in results.items()]
    families = sorted({f for m in results.values() for f in m.get("by_family", {})})
    if len(families) > 1:
        lines += ["", "By task family:", "", "| variant | family | " + " | ".join(keys) + " |"]
        lines.append("|---" * (len(keys) + 2) + "|")
        for name, m in results.items():
            lines += [f"| {name} | {f} | {_cells(m['by_family'][f], keys)} |" for f in families]
    return "\n".join(lines) + "\n"


def _metrics(
    cfg: EvalModelConfig,
    preds: list[str],
    stopped: list[bool] | None,
    rows: list[dict[str, Any]],
    errors: set[str],
    verdicts: list[str | None] | None,
) -> dict[str, Any]:
    """The role's metrics on all rows, with `by_family`: the same on each task family's rows."""
    verdicts_on = cfg.role == "simulator" and dataset_verdicts(cfg)  # the replies' verdict lines are scored

    def on(idx: list[int]) -> dict[str, Any]:
        def pick(values: list[Any] | None) -> list[Any] | None:
            return None if values is None else [values[i] for i in idx]

        if cfg.role == "decider":
            return decider_metrics([preds[i] for i in idx], pick(stopped), [rows[i] for i in idx], pick(verdicts))
        return simulator_metrics([preds[i] for i in idx], pick(stopped), [rows[i] for i in idx], errors, verdicts_on)

    groups: dict[str, list[int]] = {}
    for i, r in enumerate(rows):
        groups.setdefault(str(r.get("family") or "?"), []).append(i)
    return {**on(list(range(len(rows)))), "by_family": {family: on(idx) for family, idx in sorted(groups.items())}}


def dataset_verdicts(cfg: EvalModelConfig) -> bool:
    """Whether the dataset's simulator replies carry verdict lines (its prompt_settings.json; False without one)."""
    settings = read_settings(_dataset_root(cfg))
    return settings is not None and settings.verdicts


def _trajectory_files(cfg: EvalModelConfig) -> list[Path]:
    """--trajectories, else the dataset's build inputs; both as `simplan build` reads them (files, folders, globs)."""
    from simplan.data.build_inputs import expand_inputs

    if cfg.trajectories:
        inputs = [f.strip() for f in cfg.trajectories.split(",") if f.strip()]
    else:
        config = _dataset_root(cfg) / "config.json"
        if not config.exists():
            raise MissingInputError(f"replay: {config} does not exist; name the collection files with --trajectories")
        inputs = [str(f) for f in json.loads(config.read_text(encoding="utf-8")).get("inputs", [])]
    if not inputs:
        raise MissingInputError(
            "replay: no trajectory files named; give the collection JSONL files with --trajectories"
        )
    try:
        return expand_inputs(inputs)
    except FileNotFoundError as e:
        raise MissingInputError(
            f"replay: {e}; name the collection JSONL files the dataset was built from with --trajectories"
        ) from None


def load_replay_trajectories(cfg: EvalModelConfig, rows: list[dict[str, Any]]) -> dict[str, Trajectory]:
    """The recorded trajectories of the fold's rows, by id: read once, before any generation, so a
    missing file or a dataset without trajectory columns fails before minutes of work."""
    from simplan.data.build_inputs import load_trajectories

    if any("trajectory_id" not in r or "step" not in r for r in rows):
        raise InputError("replay: the dataset has no trajectory_id/step columns; rebuild it with `simplan build`")
    wanted = {r["trajectory_id"] for r in rows}
    return {t.id: t for t in load_trajectories(_trajectory_files(cfg)).trajectories if t.id in wanted}


def replay_verdicts(
    trajectories: dict[str, Trajectory], rows: list[dict[str, Any]], preds: list[str]
) -> list[str | None]:
    """Per row: None when the prediction matches exactly, else its `simplan.data.replay` verdict."""
    from tqdm.auto import tqdm

    from simplan.data.replay import Replayer

    misses = [i for i, (p, r) in enumerate(zip(preds, rows)) if not matches("decider", p, r["completion"])]
    verdicts: list[str | None] = [None] * len(rows)
    if not misses:
        return verdicts
    with Replayer() as replayer:
        for i in tqdm(misses, desc="replay misses", unit="row"):
            traj, step = trajectories.get(rows[i]["trajectory_id"]), int(rows[i]["step"])
            if traj is None:
                verdicts[i] = "unknown"
                continue
            recorded = traj.steps[step].action.text if step < len(traj.steps) else None
            if recorded is None or collapse(recorded) != collapse(rows[i]["completion"]):
                raise InputError(
                    f"replay: trajectory {traj.id} step {step} is {recorded!r} in the collection files but "
                    f"{rows[i]['completion']!r} in the dataset: these are not the files it was built from; "
                    "name those with --trajectories"
                )
            verdicts[i] = replayer.equally_short(traj, step, preds[i])
    return verdicts


def _read_predictions(cfg: EvalModelConfig, rows: list[dict[str, Any]]) -> tuple[Outputs, dict[str, Any]]:
    """The outputs of an earlier run's predictions.jsonl, checked row by row against the fold."""
    path = Path(cfg.predictions)
    if not path.exists():
        raise MissingInputError(f"predictions: {path} does not exist; give an eval-model run's predictions.jsonl")
    records = [json.loads(line) for _, line in iter_jsonl(path)]
    if len(records) != len(rows):
        raise InputError(
            f"predictions: {path} has {len(records)} rows, the fold {len(rows)}; "
            "use the run's --dataset, --fold and --limit"
        )
    for i, (record, row) in enumerate(zip(records, rows)):
        if collapse(str(record.get("gold", ""))) != collapse(row["completion"]):
            raise InputError(
                f"predictions: {path}:{i + 1} has gold {record.get('gold')!r} where the fold has "
                f"{row['completion']!r}; use the run's --dataset, --fold and --limit"
            )
    outputs: Outputs = {}
    for variant in ("base", "adapter"):
        if variant in records[0]:
            stopped = [bool(r[f"{variant}_stopped"]) for r in records] if f"{variant}_stopped" in records[0] else None
            outputs[variant] = ([str(r[variant]) for r in records], stopped, 0.0)
    if not outputs:
        raise InputError(f"predictions: {path} has neither a 'base' nor an 'adapter' column")
    return outputs, {"predictions": str(path)}


def evaluate(cfg: EvalModelConfig) -> dict[str, Any]:
    rows, error_texts = _load_rows(cfg)
    if not rows:
        raise InputError(f"fold: {cfg.fold!r} of {cfg.dataset} has no rows")
    trajectories = load_replay_trajectories(cfg, rows) if cfg.replay else None
    outputs, facts = _read_predictions(cfg, rows) if cfg.predictions else generate_variants(cfg, rows)
    results: dict[str, dict[str, Any]] = {}
    verdicts: dict[str, list[str | None] | None] = {}
    for variant, (preds, stopped, seconds) in outputs.items():
        started = time.perf_counter()
        verdicts[variant] = None if trajectories is None else replay_verdicts(trajectories, rows, preds)
        metrics = _metrics(cfg, preds, stopped, rows, error_texts, verdicts[variant])
        metrics["seconds"] = round(seconds + time.perf_counter() - started, 1)
        results[variant] = metrics
    out = cfg.out_dir()
    report = {"config": asdict(cfg), **facts, "results": results}
    if cfg.role == "simulator":
        report["by_verb"] = {v: simulator_verb_accuracy(preds, rows).to_dict() for v, (preds, _, _) in outputs.items()}
        report["accuracy_files"] = [str(p) for p in write_verb_accuracy(cfg, outputs, rows)]
    write_json(out / "metrics.json", report)
    write_text(out / "metrics.md", _table(results, cfg))
    write_jsonl(
        out / "predictions.jsonl",
        (
            {
                "index": i,
                "task_id": r.get("task_id"),
                "family": r.get("family"),
                "trajectory_id": r.get("trajectory_id"),
                "step": r.get("step"),
                "gold": r["completion"],
                **{v: preds[i] for v, (preds, _, _) in outputs.items()},
                **{f"{v}_exact": matches(cfg.role, preds[i], r["completion"]) for v, (preds, _, _) in outputs.items()},
                **{f"{v}_stopped": stopped[i] for v, (_, stopped, _) in outputs.items() if stopped is not None},
                **{f"{v}_replay": vs[i] for v, vs in verdicts.items() if vs is not None},
            }
            for i, r in enumerate(rows)
        ),
    )
    report["out"] = str(out)
    return report
