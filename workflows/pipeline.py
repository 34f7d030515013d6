"""The whole job as library calls: collect, build, fetch, train, evaluate, report; finished stages reused.

    simplan pipeline --config recipes/pipeline/toy-tiny.yaml          # the command (scripts/pipeline.py)

    from simplan.workflows.pipeline import Pipeline, PipelineConfig
    pipeline = Pipeline(PipelineConfig(out="runs/pipeline/toy", env="toy", model="tiny-llama", suite="toy-dev"))
    result = pipeline.run()             # PipelineResult: each stage's status and seconds, success by arm
    print(pipeline.summary())

Why in workflows/: the pipeline is the top of the dependency graph (it calls data/ for collect and build,
training/ for the adapters, evaluation/ for eval and report), and workflows/ is the layer above them all,
so no package has to import upward (tests/test_layers.py).

Stages, in order; each calls its library function with the command's own config dataclasses, built as
`simplan <command> --config RECIPE --key value ...` would build them (core/config.py `load_configs`):

    collect-train    trajectories of the train fold    out/data/train.jsonl        data.collect.collect(CollectConfig)
    collect-dev      trajectories of the dev fold      out/data/dev.jsonl          data.collect.collect(CollectConfig)
    model            the base model, converted once    (a local HF folder)         models.registry.resolve_model
    build-decider    decider dataset                   out/datasets/decider        data.build.build(BuildConfig)
    build-simulator  simulator dataset                 out/datasets/simulator      data.build.build(BuildConfig)
    train-decider    LoRA adapter of the decider       out/train/decider/adapter   training.trainer.train(...)
    train-simulator  LoRA adapter of the simulator     out/train/simulator/adapter training.trainer.train(...)
    eval             the arms on the eval suite        out/eval/traces.jsonl       evaluation.runner.evaluate
    report           Markdown + HTML report            out/report/report.html      evaluation.report.write_report

Reuse and resume: a stage that completes writes `out/.stages/STAGE.json` atomically, with a hash of its
resolved configuration (the fields that differ from their defaults, recipe files' contents included)
and of the stages it depends on; it is skipped while that hash matches and its outputs exist. A stage
interrupted midway resumes (collect, train and eval resume by themselves); one whose configuration
changed starts over from empty outputs, and so does everything downstream (their hashes include it).
Every stage's configuration is checked before the first one runs, so a typo fails at once. Each
stage prints the `simplan` command that runs it alone.

Progress: before a stage runs, `[i/N] STAGE` and the time the stages still to run will take. Each
guess says where it comes from: the time the stage took when it last ran in this folder (its marker),
else the pipeline's `estimates` (minutes per stage, from the recipe), else the time its twin took in
this run (train-simulator after train-decider, ...). The stages show their own progress bars.
`Pipeline.summary()` is a table of every stage's status, seconds and peak resident memory (this process's
VmHWM, reset before each stage, plus the peaks of a training stage's data-parallel processes), the eval's success
by arm and the path of report.html.

The parts: workflows/pipeline_stages.py (each stage's record and work), workflows/stage_markers.py (the
markers), workflows/time_left.py (the time left); this module holds the configuration and runs the stages.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from simplan.core.config import load_configs
from simplan.core.errors import UsageError
from simplan.core.io import write_json
from simplan.core.memory import peak_reset, rss_mb
from simplan.data.build import BuildConfig
from simplan.data.collect import CollectConfig
from simplan.envs.registry import UnknownEnvError
from simplan.evaluation.folder_lock import FolderLockedError
from simplan.evaluation.runner import EvalConfig, check_planner_settings
from simplan.inference.engines.config import EngineConfig
from simplan.workflows.pipeline_stages import (
    TRAIN_CONFIGS,
    ArmSuccess,
    Stage,
    StageFailed,
    arm_success,
    changed_fields,
    command_line,
    eval_lanes_mb,
    eval_run,
    eval_stage_config,
    flags,
    paired_headline,
    resolve_base_model,
    run_build,
    run_collect,
    run_eval,
    run_report,
    run_train,
    training_processes_mb,
    upgrade_eval_stage_config,
)
from simplan.workflows.stage_markers import StageMarkers
from simplan.workflows.time_left import TimeLeft, duration

STAGES = (
    "collect-train",
    "collect-dev",
    "model",
    "build-decider",
    "build-simulator",
    "train-decider",
    "train-simulator",
    "eval",
    "report",
)
# Errors a stage raises for a cause the user can fix (a bad value, a missing file, an unknown env, a busy
# eval folder): reported as one line with the command to rerun. Anything else keeps its traceback.
EVAL_MINUTES_AT_LEAST = 1.0  # an eval stage's budget under the run's max_minutes: time for its first tasks to start
USER_ERRORS = (ValueError, FileNotFoundError, ImportError, UnknownEnvError, FolderLockedError)


def _help(text: str) -> dict[str, str]:
    return {"help": text}


@dataclass
class PipelineConfig:
    out: str = field(default="runs/pipeline/default", metadata=_help("folder of every stage's outputs"))
    env: str = field(default="twx", metadata=_help("environment to collect from (simplan envs list)"))
    families: list[str] | None = field(default=None, metadata=_help("families/games to collect (default: all)"))
    collect_recipe: str = field(default="", metadata=_help("base `simplan collect` recipe for both folds ('' none)"))
    collect: dict = field(default_factory=dict, metadata=_help("CollectConfig keys for both folds"))
    collect_train: dict = field(default_factory=dict, metadata=_help("CollectConfig keys for the train fold"))
    collect_dev: dict = field(default_factory=dict, metadata=_help("CollectConfig keys for the dev fold"))
    model: str = field(
        default="smollm2-135m-instruct",
        metadata=_help("base model: registry name, HF folder, hub id, or tiny-llama / tiny-qwen2 (random, tests)"),
    )
    build: dict = field(default_factory=dict, metadata=_help("BuildConfig keys for both datasets"))
    decider_recipe: str = field(
        default="recipes/smollm2-135m-instruct/twx/decider.yaml", metadata=_help("`simplan train` recipe (decider)")
    )
    simulator_recipe: str = field(
        default="recipes/smollm2-135m-instruct/twx/simulator.yaml",
        metadata=_help("`simplan train` recipe (simulator)"),
    )
    train: dict = field(default_factory=dict, metadata=_help("training keys overriding both recipes (max_steps, ...)"))
    train_decider: dict = field(default_factory=dict, metadata=_help("training keys for the decider only"))
    train_simulator: dict = field(default_factory=dict, metadata=_help("training keys for the simulator only"))
    suite: str = field(default="twx-dev-small", metadata=_help("eval suite (recipes/suites/NAME.yaml)"))
    arms: list[str] = field(default_factory=lambda: ["reactive", "plan", "simplan"], metadata=_help("arms"))
    eval: dict = field(default_factory=dict, metadata=_help("EvalConfig keys (episodes, planner, faults, ...)"))
    engine: dict = field(
        default_factory=lambda: {"engine": "hf"},
        metadata=_help(
            "EngineConfig keys of the eval engine (engine, dtype, threads, hf: {batch_size: ...}, ...) and the "
            "evaluation's concurrency"
        ),
    )
    title: str = field(default="simplan pipeline report", metadata=_help("report title"))
    stages: list[str] | None = field(default=None, metadata=_help("run only these stages (default: all)"))
    force: list[str] = field(default_factory=list, metadata=_help("re-run these stages even when complete"))
    estimates: dict = field(
        default_factory=dict,
        metadata=_help(
            "minutes each stage takes on your machine, e.g. '{train-decider: 8, eval: 30}': the time left "
            "printed before a stage has run in this folder (after that, its measured time is used)"
        ),
    )
    max_minutes: float = field(
        default=0.0,
        metadata=_help(
            "this run's time budget in minutes (0: none): when the eval stage starts, its own budget "
            "(eval.max_minutes) shrinks to what is left of this one, less the time left guessed for the stages "
            "after it (at least EVAL_MINUTES_AT_LEAST); pairs started by then still finish"
        ),
    )

    def __post_init__(self) -> None:
        check_stage_keys(self, STAGES)
        if self.max_minutes < 0:
            raise ValueError(f"max_minutes: must be >= 0 (0: no budget), got {self.max_minutes}")


def check_stage_keys(cfg: Any, stages: tuple[str, ...]) -> None:
    """The checks every pipeline's config shares (this one's, workflows/flywheel.py's): stage names in
    `stages`, `force` and `estimates`, and no eval/engine key that the pipeline sets itself."""
    for name in ("stages", "force"):
        bad = sorted(set(getattr(cfg, name) or []) - set(stages))
        if bad:
            raise ValueError(f"{name}: unknown stage(s) {bad}; stages are {', '.join(stages)}")
    for section, keys in (("eval", ("out", "engine", "model", "adapters")), ("engine", ("model", "adapters"))):
        clash = sorted(set(getattr(cfg, section)) & set(keys))
        if clash:
            raise ValueError(f"{section}: {clash} are set by the pipeline itself; remove them")
    bad_estimates = {
        k: v
        for k, v in cfg.estimates.items()
        if k not in stages or isinstance(v, bool) or not isinstance(v, int | float) or v < 0
    }
    if bad_estimates:
        raise ValueError(
            f"estimates: {bad_estimates} are not stage: minutes (a number >= 0); stages are {', '.join(stages)}"
        )


@dataclass
class StageRecord:
    name: str
    status: str  # ran, reused, not selected, failed, interrupted
    seconds: float | None  # this run's for a stage that ran; the run that made them for reused outputs
    result: str = ""
    peak_mb: float | None = None  # peak resident memory during the stage (Linux; _run_stage), when it ran


@dataclass
class PipelineResult:
    report: Path
    stages: list[StageRecord]
    arms: list[ArmSuccess]


def _hash(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


# ---------------------------------------------------------------------------------------------
# The pipeline
# ---------------------------------------------------------------------------------------------
class Pipeline:
    stage_names: tuple[str, ...] = STAGES  # in order; a subclass (workflows/flywheel.py) runs its own

    def __init__(self, cfg: PipelineConfig) -> None:
        self.cfg = cfg
        self.out = Path(cfg.out)
        self.markers = StageMarkers(self.out / ".stages")
        self.hashes: dict[str, str] = {}
        self.model_path: str | None = None
        self.records: list[StageRecord] = []
        self.depends: dict[str, list[str]] = {}  # stage -> the stages it reads, as `_expected` built them
        self.started: float | None = None  # when `run` began (perf_counter), for `max_minutes`
        self.clock = TimeLeft({}, {})
        self.ahead: list[str] = []  # the stages `run` still runs

    # -- paths ---------------------------------------------------------------------------------
    def data(self, fold: str) -> Path:
        return self.out / "data" / f"{fold}.jsonl"

    def dataset(self, role: str) -> Path:
        return self.out / "datasets" / role

    def train_dir(self, role: str) -> Path:
        return self.out / "train" / role

    def report_html(self) -> Path:
        return self.out / "report" / "report.html"

    # -- stages --------------------------------------------------------------------------------
    def stage(self, name: str) -> Stage:
        """The stage's configuration from the pipeline's; ValueError names a bad key or value."""
        if name.startswith("collect-"):
            return self._collect(name.split("-", 1)[1])
        if name == "model":
            model = self.cfg.model
            return Stage(name, command_line("models fetch", [model]), {"model": model}, [], self._fetch_model)
        if name.startswith("build-"):
            return self._build(name.split("-", 1)[1])
        if name.startswith("train-"):
            return self._train(name.split("-", 1)[1])
        if name == "eval":
            return self._eval()
        if name == "report":
            run, out, title = self.out / "eval", self.out / "report", self.cfg.title
            config = {"runs": [str(run)], "out": str(out), "title": title}
            command = command_line("report", [str(run), "--out", str(out), "--title", title])
            return Stage(name, command, config, [self.report_html()], lambda: run_report(run, out, title), ["eval"])
        raise ValueError(f"unknown stage {name!r}")

    def _model(self) -> str:
        # The model stage sets the folder before any stage that needs it runs; until then (when every
        # stage's configuration is checked up front) the name stands in for it.
        return self.model_path or self.cfg.model

    def _collect(self, fold: str) -> Stage:
        cfg = self.cfg
        values = {
            "env": cfg.env,
            "fold": fold,
            **({"families": cfg.families} if cfg.families else {}),
            **cfg.collect,
            **(cfg.collect_train if fold == "train" else cfg.collect_dev),
            "out": str(self.data(fold)),
        }
        recipe = cfg.collect_recipe or None
        (collect_cfg,) = load_configs([CollectConfig], recipe, values, f"pipeline keys collect/collect_{fold}")
        args = (["--config", cfg.collect_recipe] if recipe else []) + flags(values)
        out = self.data(fold)
        return Stage(
            f"collect-{fold}",
            command_line("collect", args),
            {"collect": changed_fields(collect_cfg)},
            [out],
            lambda: run_collect(collect_cfg),
            clear=[out],
        )

    def _build(self, role: str) -> Stage:
        out = self.dataset(role)
        inputs, writers = self.build_inputs()
        env = self.build_env()
        values = {
            "role": role,
            "inputs": inputs,
            "model": self._model(),
            **({"env": env} if env else {}),
            **self.cfg.build,
            "out": str(out),
        }
        (build_cfg,) = load_configs([BuildConfig], None, values, "pipeline key build")
        hashed = changed_fields(build_cfg)
        if env and hashed.get("env") == env:  # the collect stages it reads hash the env: no rebuild after upgrade
            del hashed["env"]
        return Stage(
            f"build-{role}",
            command_line("build", flags(values)),
            {"build": hashed},
            [out / "dataset"],
            lambda: run_build(build_cfg),
            [*writers, "model"],
            clear=[out],
        )

    def build_inputs(self) -> tuple[list[str], list[str]]:
        """The trajectory files both datasets are built from, and the stages that write them."""
        return [str(self.data("train")), str(self.data("dev"))], ["collect-train", "collect-dev"]

    def build_env(self) -> str | None:
        """The env whose failure classes both datasets use: the one collected from, as named here. Collection
        records the env's own name ("shop"), which build could not resolve for an env given as a class spec."""
        return self.cfg.env

    def train_keys(self, role: str) -> dict[str, Any]:
        """`simplan train` keys of the role from the pipeline's config (the recipe gives the rest)."""
        return {**self.cfg.train, **(self.cfg.train_decider if role == "decider" else self.cfg.train_simulator)}

    def _train(self, role: str) -> Stage:
        cfg = self.cfg
        recipe = cfg.decider_recipe if role == "decider" else cfg.simulator_recipe
        out = self.train_dir(role)
        values = {
            "model": self._model(),
            **self.train_keys(role),
            "dataset": str(self.dataset(role) / "dataset"),
            "output_dir": str(out),
        }
        configs = load_configs(list(TRAIN_CONFIGS), recipe, values, f"pipeline keys train/train_{role}")
        return Stage(
            f"train-{role}",
            command_line("train", ["--config", recipe] + flags(values)),
            {type(c).__name__: changed_fields(c) for c in configs},
            [out / "adapter" / "adapter_config.json"],
            lambda: run_train(*configs),
            [f"build-{role}", "model"],
            clear=[out],
            held_elsewhere_mb=lambda: training_processes_mb(out),
        )

    def _eval(self) -> Stage:
        adapters = {r: self.train_dir(r) / "adapter" for r in ("decider", "simulator")}
        return self.eval_stage("eval", self.cfg.suite, self.cfg.arms, adapters, ["train-decider", "train-simulator"])

    def eval_stage(
        self,
        name: str,
        suite: str,
        arms: list[str],
        adapters: dict[str, Path],
        depends: list[str],
        eval_keys: dict[str, Any] | None = None,
    ) -> Stage:
        """An evaluation of `adapters` on `suite` into out/NAME, with the pipeline's eval and engine keys
        (`eval_keys` over the eval keys: the flywheel's harvest plays every task of its suite)."""
        cfg = self.cfg
        out = self.out / name
        values = {
            "suite": suite,
            "arms": arms,
            **cfg.eval,
            **(eval_keys or {}),
            **cfg.engine,
            "model": self._model(),
            "adapters": ",".join(f"{role}={path}" for role, path in adapters.items()),
            "out": str(out),
        }
        eval_cfg, engine_cfg = load_configs([EvalConfig, EngineConfig], None, values, "pipeline keys eval/engine")
        check_planner_settings(eval_cfg)  # with every stage's keys, before the first stage runs (`_expected`)
        alone = command_line("eval", flags(values))
        return Stage(
            name,
            alone,
            eval_stage_config(eval_cfg, engine_cfg),
            [out / "traces.jsonl"],
            lambda: run_eval(self.within_budget(name, eval_cfg), engine_cfg, alone),
            [*depends, "model"],
            clear=[out],
            upgrade=upgrade_eval_stage_config,
            held_elsewhere_mb=lambda: eval_lanes_mb(out),
        )

    def within_budget(self, name: str, eval_cfg: EvalConfig) -> EvalConfig:
        """The eval stage `name`'s config under the run's `max_minutes`: its time budget at most what is left of
        the run's, less the time left guessed for the stages after it (TimeLeft), and at least
        EVAL_MINUTES_AT_LEAST; unchanged without a run budget or where its own is shorter."""
        minutes = getattr(self.cfg, "max_minutes", 0.0)
        if not minutes or self.started is None:
            return eval_cfg
        after = self.ahead[self.ahead.index(name) + 1 :] if name in self.ahead else []
        later = sum(self.clock.guess(s)[0] or 0.0 for s in after) / 60.0
        left = minutes - (time.perf_counter() - self.started) / 60.0 - later
        budget = round(max(left, EVAL_MINUTES_AT_LEAST), 1)
        if eval_cfg.max_minutes and eval_cfg.max_minutes <= budget:
            return eval_cfg
        print(
            f"{name}: time budget {budget:g} min (the run's max_minutes {minutes:g}: {max(left, 0.0):.1f} min left "
            f"after the {later:.1f} min guessed for the stages after it)",
            flush=True,
        )
        return replace(eval_cfg, max_minutes=budget)

    def _fetch_model(self) -> str:
        self.model_path = resolve_base_model(self.cfg.model)
        print(f"model: {self.cfg.model} -> {self.model_path}", flush=True)
        return self.model_path

    # -- markers -------------------------------------------------------------------------------
    def complete(self, st: Stage, digest: str) -> bool:
        done = self.markers.read(st.name)
        if not done or not all(p.exists() for p in st.outputs):
            return False
        return done.get("hash") == digest or self._same_legacy_command(done, st) or self._same_after_upgrade(done, st)

    def _same_legacy_command(self, done: dict[str, Any], st: Stage) -> bool:
        """A marker that holds `argv` and no `config` (its hash covers the command line only) counts when it ran
        the same command line, so a finished run is not started over (and cleared) after an upgrade of simplan;
        such a stage is not re-run when only a recipe file's contents changed."""
        return "argv" in done and "config" not in done and done.get("command") == st.command

    def _same_after_upgrade(self, done: dict[str, Any], st: Stage) -> bool:
        """A marker whose config, read with today's keys (`st.upgrade`), is this stage's, and whose hash is what
        that config gave with today's inputs (nothing upstream changed since)."""
        old = done.get("config")
        if st.upgrade is None or not isinstance(old, dict):
            return False
        depends = [self.hashes[d] for d in st.depends]
        if done.get("hash") != _hash({"stage": st.name, "config": old, "depends": depends}):
            return False
        try:
            return st.upgrade(old) == st.config
        except (ValueError, TypeError):
            return False

    def _adopt(self, st: Stage, digest: str) -> None:
        """Rewrite the marker of a complete stage whose hash is not today's (an argv marker, a config in other
        keys) with today's hash (its time kept)."""
        done = self.markers.read(st.name) or {}
        if done.get("hash") == digest:
            return
        self.markers.write(st, digest, done.get("seconds"), done.get("model_path"))
        self.markers.mark_started(st.name, digest)

    def _digest(self, st: Stage) -> str:
        return _hash({"stage": st.name, "config": st.config, "depends": [self.hashes[d] for d in st.depends]})

    def _needed(self, chosen: list[str]) -> set[str]:
        """The chosen stages and every stage they read, transitively (`Stage.depends`): a stage before a chosen one
        that none of them reads (build-simulator for `--stages ...,build-decider,train-decider`) need not be done."""
        needed: set[str] = set()
        todo = list(chosen)
        while todo:
            name = todo.pop()
            if name not in needed:
                needed.add(name)
                todo += self.depends.get(name, [])
        return needed

    def _expected(self, plan: list[str], chosen: list[str]) -> list[str]:
        """The stages this run will run, after building every stage's configuration: a bad key fails here,
        before the first stage runs; what each stage reads is kept for `_needed`. The model folder is the one the
        model stage's marker recorded, if any."""
        saved = self.markers.read("model") or {}
        self.model_path = saved.get("model_path")
        runs = []
        self.depends = {}
        for name in plan:
            try:
                st = self.stage(name)
            except ValueError as e:
                raise StageFailed(f"{name}: {e}", usage=True) from None
            self.hashes[name], self.depends[name] = self._digest(st), st.depends
            if name in chosen and (name in self.cfg.force or not self.complete(st, self.hashes[name])):
                runs.append(name)
        self.hashes.clear()
        return runs

    # -- run -----------------------------------------------------------------------------------
    def run(self) -> PipelineResult:
        cfg = self.cfg
        chosen = cfg.stages or list(self.stage_names)
        plan = list(self.stage_names[: max(self.stage_names.index(s) for s in chosen) + 1])
        estimates = {k: 60.0 * float(v) for k, v in cfg.estimates.items()}
        clock = self.clock = TimeLeft(self.markers.measured(self.stage_names), estimates)
        ahead = self.ahead = self._expected(plan, chosen)
        needed = self._needed(chosen)
        self.records = []
        t_start = self.started = time.perf_counter()
        for i, name in enumerate(plan, start=1):
            banner = f"[{i}/{len(plan)}] {name}"
            try:
                st = self.stage(name)
            except ValueError as e:
                raise StageFailed(f"{banner}: {e}", usage=True) from None
            digest = self.hashes[name] = self._digest(st)
            done = self.complete(st, digest)
            if name == "model" and (done or name not in chosen) and name not in cfg.force:
                try:  # cheap once converted; later stages' configurations need the folder
                    self.model_path = resolve_base_model(cfg.model, fetch=name in chosen)
                except FileNotFoundError as e:
                    raise StageFailed(f"{banner}: {e}", usage=True) from None
            if name not in chosen and not done and name not in needed:
                print(f"{banner}: not selected, and no selected stage reads it", flush=True)
                self.records.append(StageRecord(name, "not selected", None))
                continue
            if name not in chosen:
                if not done:
                    raise StageFailed(
                        f"{banner}: not complete and not selected by --stages; run it first: {st.command}", usage=True
                    )
                print(f"{banner}: complete (not selected)", flush=True)
                self.records.append(StageRecord(name, "not selected", clock.earlier.get(name)))
                continue
            if done:
                self._adopt(st, digest)
            if done and name not in cfg.force:
                print(f"{banner}: complete, reusing ({self.markers.path(name)})", flush=True)
                self.records.append(StageRecord(name, "reused", clock.earlier.get(name)))
                if name in ahead:
                    ahead.remove(name)
                continue
            remaining = ahead[ahead.index(name) :] if name in ahead else [name]
            print(f"\n=== {banner} === {clock.line(remaining)}\n$ {st.command}", flush=True)
            seconds, result, peak = self._run_stage(st, digest, banner, fresh=name in cfg.force)
            clock.now[name] = seconds
            self.records.append(StageRecord(name, "ran", seconds, result, peak))
            print(f"{banner}: done in {duration(seconds)}", flush=True)
        write_json(self.out / "pipeline.json", {"config": asdict(cfg), "hashes": self.hashes})
        print(f"\npipeline: finished in {duration(time.perf_counter() - t_start)}", flush=True)
        return PipelineResult(self.report_html(), list(self.records), arm_success(self.out / "eval"))

    def _run_stage(self, st: Stage, digest: str, banner: str, fresh: bool = False) -> tuple[float, str, float | None]:
        """Run one stage and write its marker; returns its seconds, result and peak resident MB (of this process,
        plus the peaks of training's data-parallel processes: the eval's JVMs and training's data workers are not
        in it). A failure is recorded and raised."""
        self.markers.start(st, digest, fresh)
        reset = peak_reset()  # where it cannot be reset, VmHWM is the process's peak so far: not the stage's
        t0 = time.perf_counter()
        again = (
            "fix the cause and re-run the same pipeline command (finished stages are reused), or run the stage "
            f"alone: {st.command}"
        )
        try:
            result = st.run() or ""
        except (StageFailed, *USER_ERRORS) as e:
            self.records.append(StageRecord(st.name, "failed", time.perf_counter() - t0, type(e).__name__))
            usage = isinstance(e, UsageError) or getattr(e, "usage", False)
            raise StageFailed(f"{banner} failed: {e}\n{again}", usage=usage) from None
        except BaseException as e:
            status = "interrupted" if isinstance(e, KeyboardInterrupt) else "failed"
            self.records.append(StageRecord(st.name, status, time.perf_counter() - t0, type(e).__name__))
            raise
        missing = [str(p) for p in st.outputs if not p.exists()]
        if missing:
            self.records.append(StageRecord(st.name, "failed", time.perf_counter() - t0, "outputs missing"))
            raise StageFailed(f"{banner}: finished but its outputs are missing: {', '.join(missing)}")
        seconds = time.perf_counter() - t0
        peak = rss_mb("VmHWM") if reset else None
        if peak is not None and st.held_elsewhere_mb and (elsewhere := st.held_elsewhere_mb()):
            peak += elsewhere
        self.markers.write(
            st, digest, round(seconds, 1), self.model_path if st.name == "model" else None, peak_mb=peak
        )
        return seconds, result, peak

    # -- summary -------------------------------------------------------------------------------
    def summary(self) -> str:
        """Each stage's status and seconds, the eval's success by arm and the report's path."""
        lines = [
            f"pipeline summary ({self.out})",
            f"  {'stage':<16} {'status':<13} {'seconds':>8} {'peak GB':>7}  result",
        ]
        for r in self.records:
            seconds = "-" if r.seconds is None else f"{r.seconds:.1f}"
            peak = "-" if r.peak_mb is None else f"{r.peak_mb / 1024:.1f}"
            lines.append(f"  {r.name:<16} {r.status:<13} {seconds:>8} {peak:>7}  {r.result}".rstrip())
        run = eval_run(self.out / "eval")  # read once for both lines
        arms = arm_success(run)
        if arms:
            lines.append("  eval success by arm: " + ", ".join(_rate(a) for a in arms))
        lines += [f"  {line}" for line in paired_headline(run)]
        report = self.report_html()
        if report.exists():
            lines.append(f"report: {report.resolve()}")
        return "\n".join(lines)


def _rate(a: ArmSuccess) -> str:
    share = f" ({100 * a.successes / a.episodes:.0f}%)" if a.episodes else ""
    errored = f", {a.errored} errored" if a.errored else ""
    return f"{a.arm} {a.successes}/{a.episodes}{share}{errored}"
