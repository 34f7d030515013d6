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
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from simplan.core.io import iter_jsonl, write_json, write_jsonl, write_text
from simplan.core.text import collapse, exact, normalize, token_f1
from simplan.data.build_rows import step_rows
from simplan.data.episode import read_settings
from simplan.data.format import prompt_text, split_verdict
from simplan.inference.planning.sim_accuracy import ACCURACY_FILE, SimulatorAccuracy, simulator_prompt_action

if TYPE_CHECKING:
    from simplan.data.trajectory import Trajectory

ROLES = ("decider", "simulator")
DECODES = ("free", "choices")


@dataclass
class EvalModelConfig:
    role: str = field(default="decider", metadata={"help": "decider or simulator (which metrics to compute)"})
    dataset: str = field(default="", metadata={"help": "dataset folder from `simplan build`"})
    fold: str = field(default="dev", metadata={"help": "fold to evaluate"})
    model: str = field(
        default="smollm2-135m-instruct", metadata={"help": "base model: registry name, HF folder or hub id"}
    )
    adapter: str = field(default="", metadata={"help": "PEFT adapter folder (train's output_dir/adapter); '' = base"})
    compare_base: bool = field(default=True, metadata={"help": "with --adapter, evaluate the base model too"})
    limit: int = field(
        default=200,
        metadata={"help": "evaluate N rows spread evenly over the fold's task families, in fold order (0: all)"},
    )
    batch_size: int = field(default=16, metadata={"help": "prompts per generate call"})
    max_new_tokens: int = field(
        default=0, metadata={"help": "generation cap (0: longest gold completion in the fold + 16 tokens)"}
    )
    dtype: str = field(default="auto", metadata={"help": "auto (bfloat16 where native, else float32), float32, ..."})
    num_threads: int = field(default=0, metadata={"help": "torch CPU threads (0: torch's default)"})
    device: str = field(default="auto", metadata={"help": "auto (the GPU when there is one, else cpu), cpu, cuda:N"})
    out: str = field(default="", metadata={"help": "output folder (default: next to the adapter, or runs/eval-model)"})
    replay: bool = field(
        default=False,
        metadata={
            "help": "decider: replay each miss in its environment and count a later expert step that is as "
            "short done now as `equivalent` (see simplan.data.replay; needs the trajectories)"
        },
    )
    predictions: str = field(
        default="",
        metadata={
            "help": "score the outputs in an earlier run's predictions.jsonl (same --dataset, --fold, --limit) "
            "instead of generating; e.g. to add --replay"
        },
    )
    trajectories: str = field(
        default="",
        metadata={"help": "with --replay: collection JSONL files, comma-separated ('' = the dataset's build inputs)"},
    )
    write_adapter_accuracy: bool = field(
        default=False,
        metadata={
            "help": f"simulator: also write the adapter's per-verb accuracy ({ACCURACY_FILE}) into --adapter, "
            "where the planner's selective router reads it"
        },
    )
    decode: str = field(
        default="free",
        metadata={
            "help": "decider: free (greedy text) or choices (the most likely of the row's valid actions, "
            "scored whole: the planner's first proposal)"
        },
    )

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"role: {self.role!r} is not one of {ROLES}")
        if not self.dataset:
            raise ValueError("dataset: give the dataset folder written by `simplan build`")
        for name in ("limit", "max_new_tokens", "num_threads"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}: {getattr(self, name)} must be >= 0")
        if self.batch_size <= 0:
            raise ValueError(f"batch_size: {self.batch_size} must be positive")
        if self.replay and self.role != "decider":
            raise ValueError("replay: only the decider's actions can be replayed; drop --replay for the simulator")
        if self.decode not in DECODES:
            raise ValueError(f"decode: {self.decode!r} is not one of {DECODES}")
        if self.decode == "choices" and self.role != "decider":
            raise ValueError("decode: choices picks among a decider's valid actions; use free for the simulator")
        if self.write_adapter_accuracy and (self.role != "simulator" or not self.adapter):
            raise ValueError(
                "write_adapter_accuracy: writes a simulator adapter's per-verb accuracy; give --role simulator and "
                "--adapter DIR, or drop --write_adapter_accuracy"
            )
        if self.decode == "choices" and self.predictions:
            raise ValueError("decode: --predictions scores saved outputs, nothing is decoded; drop --decode")

    def out_dir(self) -> Path:
        if self.out:
            return Path(self.out)
        if self.predictions:
            return Path(self.predictions).parent / "rescored"
        suffix = "-choices" if self.decode == "choices" else ""
        if self.adapter:
            return Path(self.adapter).parent / f"eval-{self.fold}{suffix}"
        return Path("runs/eval-model") / f"{Path(self.model).name}-{self.role}-{self.fold}{suffix}"


# ---------------------------------------------------------------------------------------------
# Metrics (pure functions)
# ---------------------------------------------------------------------------------------------
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
    """`stopped`: None when unknown (outputs read back from an older predictions file: no parse/stopped);
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


def write_verb_accuracy(cfg: EvalModelConfig, outputs: dict[str, Any], rows: list[dict[str, Any]]) -> list[Path]:
    """The adapter's (else the base model's) per-verb accuracy as out/simulator_accuracy.json, and with
    --write_adapter_accuracy in the adapter's folder too; returns the files written."""
    variant = "adapter" if "adapter" in outputs else "base"
    if cfg.write_adapter_accuracy and variant != "adapter":
        raise ValueError(
            f"write_adapter_accuracy: {cfg.predictions or 'the run'} has no adapter outputs; drop the flag"
        )
    table = simulator_verb_accuracy(outputs[variant][0], rows)
    written = [table.write(cfg.out_dir() / ACCURACY_FILE)]
    if cfg.write_adapter_accuracy:
        written.append(table.write(Path(cfg.adapter) / ACCURACY_FILE))
    return written


# ---------------------------------------------------------------------------------------------
# Generation
# ---------------------------------------------------------------------------------------------
def generate(
    model: Any, tokenizer: Any, prompts: list[list[dict[str, str]]], batch_size: int, max_new_tokens: int
) -> tuple[list[str], list[bool]]:
    """Greedy completions (text without EOS) and whether each stopped with EOS, in input order."""
    import torch
    from tqdm.auto import tqdm

    texts = [prompt_text(tokenizer, p) for p in prompts]
    lengths = [len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]
    order = sorted(range(len(texts)), key=lambda i: -lengths[i])  # similar lengths batch with little padding
    outputs: list[str] = [""] * len(texts)
    stopped: list[bool] = [False] * len(texts)
    tokenizer.padding_side = "left"  # generation continues every row from its own last token
    for start in tqdm(range(0, len(order), batch_size), desc="generate", unit="batch"):
        idx = order[start : start + batch_size]
        enc = tokenizer([texts[i] for i in idx], add_special_tokens=False, padding=True, return_tensors="pt")
        enc = enc.to(model.device)
        with torch.no_grad():
            out = model.generate(
                **enc,
                max_new_tokens=max_new_tokens,
                do_sample=False,
                pad_token_id=tokenizer.pad_token_id,
                eos_token_id=tokenizer.eos_token_id,
            )
        for row, i in zip(out[:, enc["input_ids"].shape[1] :].tolist(), idx):
            if tokenizer.eos_token_id in row:
                row = row[: row.index(tokenizer.eos_token_id)]
                stopped[i] = True
            outputs[i] = tokenizer.decode(row, skip_special_tokens=True)
    return outputs, stopped


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
        raise FileNotFoundError(f"dataset: {folder} does not exist; build it with `simplan build`")
    data = load_from_disk(str(folder))
    if cfg.fold not in data:
        raise ValueError(f"fold: {cfg.fold!r} is not in {folder} (folds: {list(data)})")
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
            raise FileNotFoundError(f"replay: {config} does not exist; name the collection files with --trajectories")
        inputs = [str(f) for f in json.loads(config.read_text(encoding="utf-8")).get("inputs", [])]
    if not inputs:
        raise FileNotFoundError(
            "replay: no trajectory files named; give the collection JSONL files with --trajectories"
        )
    try:
        return expand_inputs(inputs)
    except FileNotFoundError as e:
        raise FileNotFoundError(
            f"replay: {e}; name the collection JSONL files the dataset was built from with --trajectories"
        ) from None


def load_replay_trajectories(cfg: EvalModelConfig, rows: list[dict[str, Any]]) -> dict[str, Trajectory]:
    """The recorded trajectories of the fold's rows, by id: read once, before any generation, so a
    missing file or a dataset without trajectory columns fails before minutes of work."""
    from simplan.data.build_inputs import load_trajectories

    if any("trajectory_id" not in r or "step" not in r for r in rows):
        raise ValueError("replay: the dataset has no trajectory_id/step columns; rebuild it with `simplan build`")
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
                raise ValueError(
                    f"replay: trajectory {traj.id} step {step} is {recorded!r} in the collection files but "
                    f"{rows[i]['completion']!r} in the dataset: these are not the files it was built from; "
                    "name those with --trajectories"
                )
            verdicts[i] = replayer.equally_short(traj, step, preds[i])
    return verdicts


Outputs = dict[str, tuple[list[str], list[bool] | None, float]]  # variant -> (texts, stopped EOS, seconds)


def _generate_variants(cfg: EvalModelConfig, rows: list[dict[str, Any]]) -> tuple[Outputs, dict[str, Any]]:
    """Greedy outputs of the base model and/or the adapter; also the run's facts (device, token cap)."""
    import torch
    from transformers import AutoModelForCausalLM

    from simplan.models.registry import load_tokenizer, pick_device, resolve_model
    from simplan.training.lora import bf16_supported

    if cfg.num_threads:
        torch.set_num_threads(cfg.num_threads)
    if cfg.adapter and not (Path(cfg.adapter) / "adapter_config.json").exists():
        raise FileNotFoundError(f"adapter: {cfg.adapter} has no adapter_config.json; give train's output/adapter")
    device = pick_device(cfg.device)
    tokenizer = load_tokenizer(cfg.model)
    dtype = getattr(torch, cfg.dtype) if cfg.dtype != "auto" else None
    if dtype is None:
        dtype = torch.bfloat16 if bf16_supported() else torch.float32
    max_new = cfg.max_new_tokens or (
        max(len(ids) for ids in tokenizer([r["completion"] for r in rows], add_special_tokens=False)["input_ids"]) + 16
    )
    variants: list[str] = (["base"] if not cfg.adapter or cfg.compare_base else []) + (
        ["adapter"] if cfg.adapter else []
    )
    facts = {"device": device, "max_new_tokens": max_new}
    if cfg.decode == "choices":
        return _choose_variants(cfg, rows, variants, str(dtype).removeprefix("torch."), device, max_new), facts
    model = AutoModelForCausalLM.from_pretrained(resolve_model(cfg.model), dtype=dtype).to(device).eval()
    if cfg.adapter:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, cfg.adapter).eval()
    prompts = [r["prompt"] for r in rows]
    outputs: Outputs = {}
    for variant in variants:
        started = time.perf_counter()
        if variant == "base" and cfg.adapter:
            with model.disable_adapter():
                preds, stopped = generate(model, tokenizer, prompts, cfg.batch_size, max_new)
        else:
            preds, stopped = generate(model, tokenizer, prompts, cfg.batch_size, max_new)
        outputs[variant] = (preds, stopped, time.perf_counter() - started)
    return outputs, facts


def _choose_variants(
    cfg: EvalModelConfig, rows: list[dict[str, Any]], variants: list[str], dtype: str, device: str, max_new: int
) -> Outputs:
    """`--decode choices`: each variant's most likely valid action per row, through the planner's hf engine."""
    from tqdm.auto import tqdm

    from simplan.inference.engines.base import GenerationRequest, checked_generation
    from simplan.inference.engines.hf_peft import HFPeftEngine

    engine = HFPeftEngine(
        cfg.model,
        {"adapter": cfg.adapter} if cfg.adapter else None,
        dtype=dtype,
        batch_size=cfg.batch_size,
        device=device,
    )
    outputs: Outputs = {}
    for variant in variants:
        started = time.perf_counter()
        preds: list[str] = []
        stopped: list[bool] = []
        for r in tqdm(rows, desc=f"choose ({variant})", unit="row"):
            request = GenerationRequest(
                adapter="adapter" if variant == "adapter" else None,
                messages=r["prompt"],
                choices=list(r.get("valid_actions") or []) or None,  # none listed: free text, as the planner
                max_tokens=max_new,
            )
            # Checked and sanitized at the same engine boundary as the planner's (inference/engines/base.py).
            (result,) = checked_generation(engine, [request], engine.generate([request]))
            preds.append(result.completions[0].text)
            stopped.append(result.completions[0].finish_reason == "stop")
        outputs[variant] = (preds, stopped, time.perf_counter() - started)
    engine.close()
    return outputs


def _read_predictions(cfg: EvalModelConfig, rows: list[dict[str, Any]]) -> tuple[Outputs, dict[str, Any]]:
    """The outputs of an earlier run's predictions.jsonl, checked row by row against the fold."""
    path = Path(cfg.predictions)
    if not path.exists():
        raise FileNotFoundError(f"predictions: {path} does not exist; give an eval-model run's predictions.jsonl")
    records = [json.loads(line) for _, line in iter_jsonl(path)]
    if len(records) != len(rows):
        raise ValueError(
            f"predictions: {path} has {len(records)} rows, the fold {len(rows)}; "
            "use the run's --dataset, --fold and --limit"
        )
    for i, (record, row) in enumerate(zip(records, rows)):
        if collapse(str(record.get("gold", ""))) != collapse(row["completion"]):
            raise ValueError(
                f"predictions: {path}:{i + 1} has gold {record.get('gold')!r} where the fold has "
                f"{row['completion']!r}; use the run's --dataset, --fold and --limit"
            )
    outputs: Outputs = {}
    for variant in ("base", "adapter"):
        if variant in records[0]:
            stopped = [bool(r[f"{variant}_stopped"]) for r in records] if f"{variant}_stopped" in records[0] else None
            outputs[variant] = ([str(r[variant]) for r in records], stopped, 0.0)
    if not outputs:
        raise ValueError(f"predictions: {path} has neither a 'base' nor an 'adapter' column")
    return outputs, {"predictions": str(path)}


def evaluate(cfg: EvalModelConfig) -> dict[str, Any]:
    rows, error_texts = _load_rows(cfg)
    if not rows:
        raise ValueError(f"fold: {cfg.fold!r} of {cfg.dataset} has no rows")
    trajectories = load_replay_trajectories(cfg, rows) if cfg.replay else None
    outputs, facts = _read_predictions(cfg, rows) if cfg.predictions else _generate_variants(cfg, rows)
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
