"""One round of the data flywheel as one command: harvest, convert, rebuild, continue both adapters, evaluate.

    simplan flywheel --config recipes/pipeline/flywheel-toy.yaml          # the command (scripts/flywheel.py)

    from simplan.inference.flywheel import Flywheel, FlywheelConfig
    flywheel = Flywheel(FlywheelConfig(out="runs/flywheel/r1", data=[...], decider=..., simulator=..., ...))
    flywheel.run()
    print(flywheel.summary())

The round is a pipeline (inference/pipeline.py) with its own stages; each is the same library call as
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
    report           `before` (the old adapters' eval run on       out/report/report.html    write_report
                     the same suite) beside the new one

Harvest from train-fold tasks (recipes/suites/toy-train.yaml): trajectories keep their task's fold, so
traces of the dev suite would land in the dev split, where they are not trained on. The traces stage's
hash covers the contents of the harvested trace files: a run that grew is converted again.
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from simplan.inference.harvest import TracesConfig, trace_file
from simplan.inference.pipeline import (
    Pipeline,
    PipelineConfig,
    Stage,
    StageFailed,
    changed_fields,
    check_stage_keys,
    command_line,
    flags,
)
from simplan.scripts.config import load_configs

FLYWHEEL_STAGES = (
    "model",
    "harvest",
    "traces",
    "build-decider",
    "build-simulator",
    "train-decider",
    "train-simulator",
    "eval",
    "report",
)


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
    eval_runs: list[str] = field(
        default_factory=list, metadata=_help("more eval run folders (or trace files) to harvest")
    )
    traces: dict = field(default_factory=dict, metadata=_help("TracesConfig keys of the conversion (arms, min_score)"))
    before: str = field(
        default="", metadata=_help("the old adapters' eval run on `suite`, shown beside the new one in the report")
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
        check_stage_keys(self, FLYWHEEL_STAGES)


def run_traces(cfg: TracesConfig) -> str:
    from simplan.inference.harvest import harvest

    report = harvest(cfg)
    print(report.summary(), flush=True)
    if not report.written:
        raise StageFailed(f"no episode could be converted into {cfg.out}; see the skipped counts above")
    return f"{report.written} episodes, {report.decider_targets} decider targets, {report.masked} masked"


def run_report(runs: list[Path], out: Path, title: str) -> str:
    from simplan.inference.report import write_report

    return str(write_report(runs, out, title=title)["html"])


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
        super().__init__(cfg)  # type: ignore[arg-type]  # the fields the pipeline reads have the same names
        self.cfg: FlywheelConfig = cfg

    def traces_path(self) -> Path:
        return self.out / "data" / "traces.jsonl"

    def stage(self, name: str) -> Stage:
        if name == "harvest":
            return self._harvest()
        if name == "traces":
            return self._traces()
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
        return self.eval_stage("harvest", cfg.harvest_suite, cfg.harvest_arms, adapters, [])

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
            raise ValueError(f"eval_runs: {e}") from None
        return Stage(
            "traces",
            command_line("traces", flags(values)),
            {"traces": changed_fields(traces_cfg), "contents": contents},
            [out],
            lambda: run_traces(traces_cfg),
            ["harvest"],
            clear=[out],
        )

    def _report(self) -> Stage:
        runs = ([Path(self.cfg.before)] if self.cfg.before else []) + [self.out / "eval"]
        out, title = self.out / "report", self.cfg.title
        command = command_line("report", [*map(str, runs), "--out", str(out), "--title", title])
        config = {"runs": [str(r) for r in runs], "out": str(out), "title": title}
        return Stage("report", command, config, [self.report_html()], lambda: run_report(runs, out, title), ["eval"])
