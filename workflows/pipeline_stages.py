"""The pipeline's stages: their record (`Stage`), the work of each (one library call), and its command line.

    from simplan.workflows.pipeline_stages import Stage, changed_fields, command_line, flags, run_build
    st = Stage("build-decider", command_line("build", flags(values)), {"build": changed_fields(cfg)}, [out],
               lambda: run_build(cfg))

A stage's `config` is what its outputs depend on (the fields of its config dataclasses that differ from
their defaults, `changed_fields`): workflows/pipeline.py hashes it with the hashes of the stages it depends
on. `run_collect`, `run_build`, `run_train`, `run_eval` and `run_report` each call the library function of
one `simplan` command and return a short result for the summary; a result the user must act on raises
`StageFailed`.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from simplan.core.config import load_configs
from simplan.data.build import BuildConfig
from simplan.data.collect import CollectConfig
from simplan.evaluation.runner import EvalConfig
from simplan.inference.engines.config import MODEL_FREE_KINDS, EngineConfig
from simplan.training.config import DataArguments, LoraArguments, ModelArguments, TrainArguments

if TYPE_CHECKING:
    from simplan.evaluation.report_data import RunData

TINY_PREFIX = "tiny-"  # "tiny-llama" / "tiny-qwen2": a tiny random model made on the fly (tests, quick runs)
TRAIN_CONFIGS = (ModelArguments, LoraArguments, DataArguments, TrainArguments)  # `simplan train`'s dataclasses


class StageFailed(RuntimeError):
    """A stage did not finish; `usage` when the cause is the user's to fix (a UsageError: exit status 2)."""

    def __init__(self, message: str, usage: bool = False) -> None:
        super().__init__(message)
        self.usage = usage


# ---------------------------------------------------------------------------------------------
# Stage records: what each stage depends on, and what the summary shows
# ---------------------------------------------------------------------------------------------
@dataclass
class Stage:
    name: str
    command: str  # the `simplan ...` command that runs this stage alone (printed, never parsed)
    config: dict[str, Any]  # what the outputs depend on: hashed, together with the hashes of `depends`
    outputs: list[Path]  # must exist for the stage to count as complete
    run: Callable[[], str]  # does the work; returns a short result for the summary
    depends: list[str] = field(default_factory=list)
    clear: list[Path] = field(default_factory=list)  # removed when the configuration changed
    # A marker's stored config read in today's keys (a config class's LEGACY_KEYS): a finished stage whose settings
    # are the same under today's keys is reused, not run again (None: the stage's config has no other spelling).
    upgrade: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    # The peak resident MB its work held in processes of its own (training's data-parallel processes, an eval's
    # engine lanes: they hold theirs at the same time), read once it ran: the summary adds it to this process's
    # peak. None: none such.
    held_elsewhere_mb: Callable[[], float | None] | None = None


@dataclass
class ArmSuccess:
    arm: str
    successes: int
    episodes: int
    errored: int = 0  # of episodes: crashed, no result (the eval stage fails on them; a re-run retries them)


def changed_fields(config: Any, prefix: str = "") -> dict[str, Any]:
    """The fields of a config dataclass that differ from their defaults: what a stage's hash covers. A section's
    (a dataclass field's) changed fields are listed under dotted keys (`hf.batch_size`).

    Defaults are left out so that a field added to a config class later (whose default keeps the old
    behaviour) does not make every finished stage look changed and start over."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            out.update(changed_fields(value, f"{prefix}{f.name}."))
            continue
        if f.default is not dataclasses.MISSING:
            default: Any = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = dataclasses.MISSING
        if value != default:
            out[prefix + f.name] = value
    return out


def flags(values: dict[str, Any]) -> list[str]:
    """Command-line flags for a mapping (for the printed commands): lists comma-joined, mappings as YAML flow.

    {"max_steps": 40, "families": ["a", "b"]} -> ["--max_steps", "40", "--families", "a,b"]
    """
    out: list[str] = []
    for key, value in values.items():
        if value is None:
            text = "none"
        elif isinstance(value, bool):
            text = "true" if value else "false"
        elif isinstance(value, list | tuple):
            text = ",".join(str(v) for v in value)
        elif isinstance(value, dict):
            text = json.dumps(value)  # YAML flow syntax: the flag parses it with yaml.safe_load
        else:
            text = str(value)
        out += [f"--{key}", text]
    return out


def command_line(command: str, args: list[str]) -> str:
    return f"simplan {command} " + " ".join(_quote(a) for a in args)


def _quote(arg: str) -> str:
    return arg if arg and all(c.isalnum() or c in "-_./=,:" for c in arg) else "'" + arg.replace("'", "'\\''") + "'"


# ---------------------------------------------------------------------------------------------
# The stages' work: one library call each
# ---------------------------------------------------------------------------------------------
def run_collect(cfg: CollectConfig) -> str:
    from simplan.data.collect import collect

    report = collect(cfg)
    print(report.summary(), flush=True)
    if report.unfinished:
        raise StageFailed(f"{report.unfinished} episode(s) could not be written to {cfg.out}")
    errored = report.statuses["errored"]
    return f"{report.planned} episodes" + (f", {errored} errored" if errored else "")


def run_build(cfg: BuildConfig) -> str:
    from simplan.data.build import build
    from simplan.data.build_stats import stats_markdown

    result = build(cfg)
    stats = result.stats
    print(stats_markdown(stats), flush=True)
    if stats["malformed_lines"]:
        print(f"build: {stats['malformed_lines']} bad input line(s) skipped; see {result.paths['stats']}", flush=True)
    total = stats["examples"]["total"]
    if not total:
        raise StageFailed(f"no example survived in {cfg.out}; see the dropped counts above")
    return f"{total} examples"


def run_train(
    model_args: ModelArguments, lora_args: LoraArguments, data_args: DataArguments, train_args: TrainArguments
) -> str:
    from simplan.training.trainer import train  # torch and transformers only once a stage trains

    metrics = train(model_args, lora_args, data_args, train_args).metrics
    losses = [f"{k} {metrics[k]:.3f}" for k in ("train_loss", "eval_loss") if isinstance(metrics.get(k), float)]
    processes = [f"{train_args.processes} processes"] if train_args.processes > 1 else []
    return ", ".join([f"{metrics['global_step']} steps", *losses, *processes])


def training_processes_mb(output_dir: Path) -> float | None:
    """The summed peak resident MB of a run's training processes (metrics.json), where it ran in several; None
    where it ran in this one (this process's own peak counts it) or recorded none."""
    try:
        peaks = json.loads((output_dir / "metrics.json").read_text()).get("peak_rss_mb_per_process") or []
    except (OSError, ValueError):
        return None
    if len(peaks) < 2 or None in peaks:
        return None
    return float(sum(peaks))


def eval_lanes_mb(out: Path) -> float | None:
    """The summed peak resident MB of an eval's engine lanes in its last invocation (run.json `lane_peak_rss_mb`,
    evaluation/runner.py); None for an eval whose engine ran in its own process."""
    try:
        invocations = json.loads((out / "run.json").read_text()).get("invocations") or []
    except (OSError, ValueError):
        return None
    peaks = [p for p in (invocations[-1].get("lane_peak_rss_mb") or []) if p is not None] if invocations else []
    return float(sum(peaks)) if peaks else None


def engine_info(cfg: EngineConfig) -> dict[str, str]:
    """What eval_config.json records of the engine, as `simplan eval` records it, so the printed eval
    command resumes the pipeline's eval folder."""
    if cfg.engine in MODEL_FREE_KINDS:  # no model: the model and adapters change nothing
        return {"engine": cfg.engine, "model": "", "adapters": ""}
    return {"engine": cfg.engine, "model": cfg.model, "adapters": cfg.adapters}


def eval_stage_config(eval_cfg: EvalConfig, engine_cfg: EngineConfig) -> dict[str, Any]:
    """What the eval stage's outputs depend on: the changed fields of both configs, the planner mappings in
    today's keys (core/config.py upgrade_keys), as the stage's hash covers them."""
    changed = changed_fields(eval_cfg)
    for key in ("planner", "arm_overrides"):
        if key in changed:
            changed[key] = getattr(canonical_eval_identity(eval_cfg), key)
    return {"eval": changed, "engine": changed_fields(engine_cfg)}


def canonical_eval_identity(eval_cfg: EvalConfig) -> Any:
    from simplan.evaluation.runner import canonical_planner_keys

    return SimpleNamespace(
        **canonical_planner_keys({"planner": eval_cfg.planner, "arm_overrides": eval_cfg.arm_overrides})
    )


def upgrade_eval_stage_config(old: dict[str, Any]) -> dict[str, Any]:
    """An eval marker's stored config (changed fields of EvalConfig and EngineConfig, perhaps in the flat keys of
    before the sections) as today's `eval_stage_config` of the same settings."""
    values = {**old.get("eval", {}), **old.get("engine", {})}
    eval_cfg, engine_cfg = load_configs([EvalConfig, EngineConfig], None, values, "an earlier eval marker")
    return eval_stage_config(eval_cfg, engine_cfg)


def run_eval(eval_cfg: EvalConfig, engine_cfg: EngineConfig, alone: str = "") -> str:
    """The eval stage; `alone`: the `simplan eval` command that runs it by itself (a budget cut points to it)."""
    from simplan.evaluation.folder_lock import check_unlocked
    from simplan.evaluation.runner import budget_message, errored_message, evaluate
    from simplan.inference.engines import engine_from_config, engine_lanes, is_merged

    check_unlocked(Path(eval_cfg.out))  # before minutes of engine loading; evaluate() holds the lock
    print(f"eval: loading engine {engine_cfg.engine} {engine_cfg.model}", flush=True)
    engine = engine_from_config(engine_cfg, concurrent=True)
    info = {**engine_info(engine_cfg), "merge_adapters": is_merged(engine), "lanes": engine_lanes(engine)}  # as eval
    try:
        outcome = evaluate(eval_cfg, engine, engine_info=info)
    finally:
        engine.close()
    print(
        f"eval: {outcome.ran} episode(s) run in {outcome.seconds:.1f}s ({outcome.skipped} already done, "
        f"{outcome.errored} errored) of {outcome.planned}",
        flush=True,
    )
    crashed = errored_message(outcome)
    if crashed:  # not finished: no marker, so the report never runs on crashes and the next run retries them
        raise StageFailed(crashed)
    rerun = (
        f"To play the rest, run the stage alone with --max_minutes 0 (finished episodes are kept): {alone}; then "
        "re-run the pipeline with --force report"
        if alone
        else ""
    )
    cut = budget_message(outcome, eval_cfg.max_minutes, rerun)
    if cut:  # finished within its budget: the report says how many tasks were paired
        print(cut, flush=True)
        return f"{outcome.planned - outcome.left} of {outcome.planned} episodes (time budget)"
    return f"{outcome.planned} episodes"


def run_report(run: Path, out: Path, title: str) -> str:
    from simplan.evaluation.report import write_report

    return str(write_report([run], out, title=title)["html"])


def resolve_base_model(name: str, fetch: bool = True) -> str:
    """A local folder for `name`; tiny-llama / tiny-qwen2 build a tiny random model (cached)."""
    if name.startswith(TINY_PREFIX):
        from simplan.models.tiny import tiny_model

        return str(tiny_model(name[len(TINY_PREFIX) :]))
    from simplan.models.registry import resolve_model

    return resolve_model(name, fetch=fetch)


def eval_run(run: Path) -> RunData | None:
    """An eval folder's traces as the report reads them (evaluation/report_data.py); None before any."""
    if not (run / "traces.jsonl").exists():
        return None
    from simplan.evaluation.report_data import load_run_data

    return load_run_data(run)


def arm_success(run: Path | RunData | None) -> list[ArmSuccess]:
    """Successes per arm of an eval folder (or of its `eval_run`), as the report counts them; [] before any."""
    data = eval_run(run) if isinstance(run, Path) else run
    return [] if data is None else [ArmSuccess(m.arm, m.successes, m.episodes, m.errored) for m in data.arms]


def paired_headline(data: RunData | None) -> list[str]:
    """The report's opening lines for an `eval_run` (each arm against the first, then each arm that imagines against
    reactive-pivots where it ran; paired, plain text), [] before any episode."""
    if data is None:
        return []
    from simplan.evaluation.report_tables import arm_comparisons, headline

    lines = headline(arm_comparisons([data]), [data])
    return [line.replace("**", "").removeprefix(f"{data.name}: ") for line in lines]
