"""One round of the data flywheel as one command: harvest, convert, rebuild, continue both adapters, evaluate.

    simplan flywheel --config recipes/pipeline/flywheel-toy.yaml          # the command (scripts/flywheel.py)

    from simplan.workflows.flywheel import Flywheel, FlywheelConfig
    flywheel = Flywheel(FlywheelConfig(out="runs/flywheel/r1", data=[...], decider=..., simulator=..., ...))
    flywheel.run()
    print(flywheel.summary())

The round is a pipeline (workflows/pipeline.py) with its own stages; each is the same library call as
its `simplan` command, finished stages are reused and an interrupted one resumes, exactly as there:

    model            the base model
    harvest          the current adapters on harvest_suite       out/harvest/traces.jsonl  evaluate (skipped
                     (train-fold tasks: their traces become                                without a suite)
                     training data)
    traces           harvest + eval_runs -> trajectories           out/data/traces.jsonl     inference.harvest
    build-decider    `data` (what the adapters were trained on)    out/datasets/decider      data.build.build
    build-simulator  + the traces: one merged dataset per role     out/datasets/simulator
    train-decider    continue the decider (`lora_init`)            out/train/decider/adapter training.trainer
    train-simulator  continue the simulator (`lora_init`)          out/train/simulator/adapter
    eval             the new adapters on `suite`                   out/eval/traces.jsonl     evaluate
    simulator-check  the old and the new simulator, paired, on     out/simulator-check/      inference.harvest,
                     the agent's own dev states: `before`'s        summary.json              data.build.build,
                     traces as a simulator dataset (dev fold),                               training.evaluate
                     eval-model on it once per adapter (skipped                              (eval-model)
                     without `before`)
    report           `before` (the old adapters' eval run on       out/report/report.html    write_report
                     the same suite) beside the new one, and the
                     simulator check's table

Harvest from train-fold tasks (recipes/suites/toy-train.yaml): trajectories keep their task's fold, so
traces of the dev suite would land in the dev split, where they are not trained on. The traces stage's
hash covers the contents of the harvested trace files: a run that grew is converted again.

The simulator check answers "does the simulator predict better where the agent really goes?": the
states of `before` (the old adapters on the dev suite) are exactly what the agent meets, which the
collected dev data is not. Both adapters see the same rows (same dataset, fold and `limit`), built
with the prompt settings they were trained with (the round's `build` keys, checked against each
adapter's prompt_settings.json; identical windows once), decoded greedily as `simplan eval-model`
does; a row counts as exact under eval-model's rule. summary.json holds the rows, exact before and
after, the rows right only before / only after (and both, neither), the exact McNemar p-value on
those discordant rows (evaluation/paired.py) and eval-model's token F1 of each.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from simplan.core.config import load_configs
from simplan.core.errors import InputError
from simplan.core.io import iter_jsonl, write_json
from simplan.data.build import BuildConfig
from simplan.data.episode import PromptSettings, read_settings
from simplan.evaluation.offline import EvalModelConfig
from simplan.evaluation.paired import mcnemar_exact
from simplan.workflows.harvest import TracesConfig, trace_file
from simplan.workflows.pipeline import Pipeline, PipelineConfig, check_stage_keys
from simplan.workflows.pipeline_stages import Stage, StageFailed, changed_fields, command_line, flags, run_build

FLYWHEEL_STAGES = (
    "model",
    "harvest",
    "traces",
    "build-decider",
    "build-simulator",
    "train-decider",
    "train-simulator",
    "eval",
    "simulator-check",
    "report",
)
# EvalModelConfig keys the simulator check sets itself: the same rows and decoding for both adapters.
CHECK_SETS = (
    "role",
    "dataset",
    "fold",
    "model",
    "adapter",
    "compare_base",
    "out",
    "decode",
    "predictions",
    "replay",
    "trajectories",
    "write_adapter_accuracy",
)
CHECK_FOLD = "dev"


def _help(text: str) -> dict[str, str]:
    return {"help": text}


def _as_in_pipeline(name: str) -> Any:
    """The field `name` with PipelineConfig's default and help: one home for the settings both share."""
    f = PipelineConfig.__dataclass_fields__[name]
    if f.default_factory is not dataclasses.MISSING:
        return field(default_factory=f.default_factory, metadata=f.metadata)
    return field(default=f.default, metadata=f.metadata)


@dataclass
class FlywheelConfig:
    out: str = field(default="runs/flywheel/round1", metadata=_help("folder of every stage's outputs"))
    data: list[str] = field(
        default_factory=list,
        metadata=_help("the trajectory files the adapters were trained on (train and dev), merged with the traces"),
    )
    decider: str = field(default="", metadata=_help("the decider adapter to continue (a train run's adapter/)"))
    simulator: str = field(default="", metadata=_help("the simulator adapter to continue"))
    harvest_suite: str = field(
        default="", metadata=_help("suite of train-fold tasks the current adapters play for data ('' none)")
    )
    harvest_arms: list[str] = field(
        default_factory=lambda: ["simplan"], metadata=_help("arms that play the harvest suite")
    )
    harvest_eval: dict = field(
        default_factory=dict,
        metadata=_help(
            "EvalConfig keys of the harvest only, over `eval` (e.g. '{episodes: 0, max_steps: 0}': every task "
            "of harvest_suite under its own step caps, where `eval` sizes the dev suite)"
        ),
    )
    eval_runs: list[str] = field(
        default_factory=list, metadata=_help("more eval run folders (or trace files) to harvest")
    )
    traces: dict = field(default_factory=dict, metadata=_help("TracesConfig keys of the conversion (arms, min_score)"))
    before: str = field(
        default="",
        metadata=_help(
            "the old adapters' eval run on `suite`, shown beside the new one in the report; its states are "
            "the simulator check's rows ('' none: no check)"
        ),
    )
    simulator_check: dict = field(
        default_factory=dict,
        metadata=_help(
            "EvalModelConfig keys of the simulator check's two eval-model runs (limit, batch_size, "
            "max_new_tokens, dtype, num_threads, device)"
        ),
    )
    model: str = _as_in_pipeline("model")
    build: dict = _as_in_pipeline("build")
    decider_recipe: str = _as_in_pipeline("decider_recipe")
    simulator_recipe: str = _as_in_pipeline("simulator_recipe")
    train: dict = _as_in_pipeline("train")
    train_decider: dict = _as_in_pipeline("train_decider")
    train_simulator: dict = _as_in_pipeline("train_simulator")
    suite: str = _as_in_pipeline("suite")
    arms: list[str] = _as_in_pipeline("arms")
    eval: dict = _as_in_pipeline("eval")
    engine: dict = _as_in_pipeline("engine")
    title: str = field(default="simplan flywheel round", metadata=_help("report title"))
    stages: list[str] | None = _as_in_pipeline("stages")
    force: list[str] = _as_in_pipeline("force")
    estimates: dict = _as_in_pipeline("estimates")

    def __post_init__(self) -> None:
        for name in ("data", "decider", "simulator"):
            if not getattr(self, name):
                raise ValueError(f"{name}: required ({FlywheelConfig.__dataclass_fields__[name].metadata['help']})")
        if not self.harvest_suite and not self.eval_runs:
            raise ValueError("harvest_suite / eval_runs: give a suite to harvest or eval runs to convert (or both)")
        clash = sorted(set(self.traces) & {"runs", "out"})
        if clash:
            raise ValueError(f"traces: {clash} are set by the flywheel itself; remove them")
        clash = sorted(set(self.harvest_eval) & {"out", "engine", "model", "adapters", "suite", "arms"})
        if clash:
            raise ValueError(f"harvest_eval: {clash} are set by the flywheel itself (harvest_suite, harvest_arms)")
        clash = sorted(set(self.simulator_check) & set(CHECK_SETS))
        if clash:
            raise ValueError(f"simulator_check: {clash} are set by the flywheel itself; remove them")
        check_stage_keys(self, FLYWHEEL_STAGES)


def run_traces(cfg: TracesConfig) -> str:
    from simplan.workflows.harvest import harvest

    report = harvest(cfg)
    print(report.summary(), flush=True)
    if not report.written:
        raise StageFailed(f"no episode could be converted into {cfg.out}; see the skipped counts above")
    return f"{report.written} episodes, {report.decider_targets} decider targets, {report.masked} masked"


def run_report(runs: list[Path], out: Path, title: str, check: Path | None = None) -> str:
    """The report of `runs`, with the simulator check's table when `check` (its summary.json) exists."""
    from simplan.evaluation.report import write_report

    extra = [SimulatorCheck.read(check).table()] if check is not None and check.exists() else None
    return str(write_report(runs, out, title=title, extra=extra)["html"])


# ---------------------------------------------------------------------------------------------
# The simulator check: the old and the new simulator on the agent's own dev states
# ---------------------------------------------------------------------------------------------
@dataclass
class SimulatorCheck:
    """The old (before) and the new (after) simulator on the same rows; exact as `simplan eval-model` counts it."""

    rows: int
    exact_before: float
    exact_after: float
    both: int  # rows both predicted exactly
    only_before: int  # the discordant rows: right before the round, wrong after ...
    only_after: int  # ... and the other way round
    neither: int
    p_value: float  # exact McNemar test on only_before vs only_after (evaluation/paired.py)
    token_f1_before: float | None = None
    token_f1_after: float | None = None

    @staticmethod
    def from_rows(before: list[bool], after: list[bool], f1: tuple[float | None, float | None]) -> SimulatorCheck:
        if len(before) != len(after):
            raise ValueError(f"simulator check: {len(before)} rows before but {len(after)} after; pairs need both")
        n = len(before)
        only_before = sum(b and not a for b, a in zip(before, after))
        only_after = sum(a and not b for b, a in zip(before, after))
        both = sum(b and a for b, a in zip(before, after))
        return SimulatorCheck(
            rows=n,
            exact_before=sum(before) / n if n else 0.0,
            exact_after=sum(after) / n if n else 0.0,
            both=both,
            only_before=only_before,
            only_after=only_after,
            neither=n - both - only_before - only_after,
            p_value=mcnemar_exact(only_before, only_after),
            token_f1_before=f1[0],
            token_f1_after=f1[1],
        )

    @staticmethod
    def read(path: Path) -> SimulatorCheck:
        return SimulatorCheck(**json.loads(path.read_text()))

    def line(self) -> str:
        """'simulator exact 12.0% -> 18.5% on 200 rows (only before 4, only after 17, McNemar p 0.007)'."""
        return (
            f"simulator exact {100 * self.exact_before:.1f}% -> {100 * self.exact_after:.1f}% on {self.rows} rows "
            f"of the agent's dev states (only before {self.only_before}, only after {self.only_after}, "
            f"McNemar p {self.p_value:.3g})"
        )

    def table(self) -> Any:
        from simplan.evaluation.report_tables import Table, pct

        f1 = [pct(x) for x in (self.token_f1_before, self.token_f1_after)]
        return Table(
            "Simulator on the agent's own dev states (paired)",
            ["simulator", "rows", "exact", "token F1", "rows right only here"],
            [
                ["before the round", str(self.rows), pct(self.exact_before), f1[0], str(self.only_before)],
                ["after the round", str(self.rows), pct(self.exact_after), f1[1], str(self.only_after)],
            ],
            note=f"The before run's steps as simulator rows, the same rows for both adapters; exact McNemar p = "
            f"{self.p_value:.3g} on the {self.only_before + self.only_after} rows only one predicted exactly.",
        )


def exact_by_row(run: Path) -> tuple[list[str], list[bool], float | None]:
    """An eval-model run's gold per row, whether the adapter matched it exactly, and its token F1 (None if absent)."""
    records = [json.loads(line) for _, line in iter_jsonl(run / "predictions.jsonl")]
    metrics = json.loads((run / "metrics.json").read_text())
    f1 = metrics["results"]["adapter"].get("token_f1")
    return [r["gold"] for r in records], [bool(r["adapter_exact"]) for r in records], f1


def paired_exact(before: Path, after: Path) -> SimulatorCheck:
    """The two eval-model runs (same dataset, fold and limit) paired row by row; different rows are an error."""
    gold_b, exact_b, f1_b = exact_by_row(before)
    gold_a, exact_a, f1_a = exact_by_row(after)
    if gold_b != gold_a:
        raise StageFailed(f"simulator check: {before} and {after} scored different rows; they cannot be paired")
    return SimulatorCheck.from_rows(exact_b, exact_a, (f1_b, f1_a))


def check_layout(adapter: Path, settings: PromptSettings) -> None:
    """The adapter was trained on `settings` (its prompt_settings.json, when it has one), else a ValueError."""
    saved = read_settings(adapter)
    if saved is None or saved == settings:
        return
    here = settings.to_dict()
    differ = ", ".join(f"{k}: {v!r} there, {here[k]!r} here" for k, v in saved.to_dict().items() if v != here[k])
    raise InputError(
        f"simulator check: {adapter} was trained with other prompt settings ({differ}); set the round's `build` keys "
        "to the ones it was trained with, so both simulators are measured on the layout they learned"
    )


def run_simulator_check(
    traces_cfg: TracesConfig, build_cfg: BuildConfig, evals: dict[str, EvalModelConfig], out: Path
) -> str:
    from simplan.evaluation.offline import evaluate as evaluate_model

    run_traces(traces_cfg)  # a `before` without traces is a FileNotFoundError naming it
    run_build(build_cfg)
    for cfg in evals.values():
        check_layout(Path(cfg.adapter), build_cfg.settings())  # the new adapter exists only now
    for name, cfg in evals.items():
        print(f"simulator-check: eval-model of the {name} simulator {cfg.adapter}", flush=True)
        evaluate_model(cfg)
    check = paired_exact(Path(evals["before"].out), Path(evals["after"].out))
    write_json(out / "summary.json", dataclasses.asdict(check))
    print(f"simulator-check: {check.line()}", flush=True)
    return check.line()


def file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()[:16]


class Flywheel(Pipeline):
    """The round's stages (module docstring) on the pipeline's machinery."""

    stage_names = FLYWHEEL_STAGES

    def __init__(self, cfg: FlywheelConfig) -> None:
        saved = read_settings(cfg.simulator) if cfg.simulator else None
        if saved is not None and "verdicts" not in cfg.build:
            # The round continues the old simulator (lora_init): its data keeps the layout that adapter learned,
            # verdict lines included or not, unless the round's `build` keys say otherwise.
            # A copy: the caller's config (a recipe loaded once, reused for the next round) stays as given.
            cfg = dataclasses.replace(cfg, build={**cfg.build, "verdicts": saved.verdicts})
        super().__init__(cfg)  # type: ignore[arg-type]  # the fields the pipeline reads have the same names
        self.cfg: FlywheelConfig = cfg

    def traces_path(self) -> Path:
        return self.out / "data" / "traces.jsonl"

    def stage(self, name: str) -> Stage:
        if name == "harvest":
            return self._harvest()
        if name == "traces":
            return self._traces()
        if name == "simulator-check":
            return self._simulator_check()
        if name == "report":
            return self._report()
        return super().stage(name)

    def build_inputs(self) -> tuple[list[str], list[str]]:
        return [*self.cfg.data, str(self.traces_path())], ["traces"]

    def build_env(self) -> str | None:
        # The round names no env (its data and traces may come from several): each trajectory's recorded env,
        # unless the round's `build` keys give one (`build: {env: package.module:Class}` for a class-spec env).
        return None

    def train_keys(self, role: str) -> dict[str, Any]:
        return {**super().train_keys(role), "lora_init": self.cfg.decider if role == "decider" else self.cfg.simulator}

    def _harvest(self) -> Stage:
        cfg = self.cfg
        if not cfg.harvest_suite:
            return Stage("harvest", "(no harvest_suite: nothing to run)", {}, [], lambda: "skipped")
        adapters = {"decider": Path(cfg.decider), "simulator": Path(cfg.simulator)}
        return self.eval_stage("harvest", cfg.harvest_suite, cfg.harvest_arms, adapters, [], cfg.harvest_eval)

    def harvested(self) -> list[str]:
        return ([str(self.out / "harvest")] if self.cfg.harvest_suite else []) + list(self.cfg.eval_runs)

    def _traces(self) -> Stage:
        out = self.traces_path()
        values = {**self.cfg.traces, "runs": self.harvested(), "out": str(out)}
        (traces_cfg,) = load_configs([TracesConfig], None, values, "flywheel key traces")
        # A harvest stage that ran is covered by its own hash; eval runs from elsewhere by their contents.
        try:
            contents = {run: file_digest(trace_file(run)) for run in self.cfg.eval_runs}
        except FileNotFoundError as e:
            raise InputError(f"eval_runs: {e}") from None
        return Stage(
            "traces",
            command_line("traces", flags(values)),
            {"traces": changed_fields(traces_cfg), "contents": contents},
            [out],
            lambda: run_traces(traces_cfg),
            ["harvest"],
            clear=[out],
        )

    def check_summary(self) -> Path:
        return self.out / "simulator-check" / "summary.json"

    def _simulator_check(self) -> Stage:
        cfg = self.cfg
        if not cfg.before:
            why = "no `before` eval run: no states of the old adapters to measure the simulators on"
            return Stage("simulator-check", f"({why})", {}, [], lambda: f"skipped ({why})")
        out = self.out / "simulator-check"
        try:
            contents = {cfg.before: file_digest(trace_file(cfg.before))}
        except FileNotFoundError:  # not yet made (a recipe checked before its pipeline ran): the run says so
            contents = {cfg.before: "missing"}
        traces_values = {"runs": [cfg.before], "out": str(out / "traces.jsonl")}  # every arm: all are the agent
        (traces_cfg,) = load_configs([TracesConfig], None, traces_values, "flywheel simulator check")
        build_values = {
            "inputs": [traces_cfg.out],
            "model": self._model(),
            **{k: v for k, v in cfg.build.items() if k != "oversample"},  # training weights: each state counts once
            "role": "simulator",
            "dedupe": True,  # arms that walked the same way repeat a window: counted twice it is no new evidence
            "out": str(out / "dataset"),
        }
        (build_cfg,) = load_configs([BuildConfig], None, build_values, "flywheel key build")
        check_layout(Path(cfg.simulator), build_cfg.settings())  # the old adapter: before any stage runs
        adapters = {"before": Path(cfg.simulator), "after": self.train_dir("simulator") / "adapter"}
        evals: dict[str, EvalModelConfig] = {}
        commands = [command_line("traces", flags(traces_values)), command_line("build", flags(build_values))]
        for name, adapter in adapters.items():
            values = {
                "role": "simulator",
                "dataset": str(out / "dataset"),
                "fold": CHECK_FOLD,
                "model": self._model(),
                "adapter": str(adapter),
                "compare_base": False,
                **cfg.simulator_check,
                "out": str(out / name),
            }
            (evals[name],) = load_configs([EvalModelConfig], None, values, "flywheel key simulator_check")
            commands.append(command_line("eval-model", flags(values)))
        config = {
            "traces": changed_fields(traces_cfg),
            "build": changed_fields(build_cfg),
            "eval_model": {name: changed_fields(c) for name, c in evals.items()},
            "contents": contents,
        }
        return Stage(
            "simulator-check",
            " && ".join(commands),
            config,
            [self.check_summary()],
            lambda: run_simulator_check(traces_cfg, build_cfg, evals, out),
            ["train-simulator", "model"],
            clear=[out],
        )

    def _report(self) -> Stage:
        runs = ([Path(self.cfg.before)] if self.cfg.before else []) + [self.out / "eval"]
        out, title = self.out / "report", self.cfg.title
        check = self.check_summary() if self.cfg.before else None
        command = command_line("report", [*map(str, runs), "--out", str(out), "--title", title])
        config = {"runs": [str(r) for r in runs], "out": str(out), "title": title, "check": str(check or "")}
        return Stage(
            "report",
            command,
            config,
            [self.report_html()],
            lambda: run_report(runs, out, title, check),
            ["eval", "simulator-check"],
        )

    def summary(self) -> str:
        """The pipeline's summary, with the simulator check's line when it has run."""
        text = super().summary()
        if self.check_summary().exists():
            text += f"\nsimulator check: {SimulatorCheck.read(self.check_summary()).line()}"
        return text
