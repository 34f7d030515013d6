"""`simplan pipeline`: the whole job in one command: collect, build, fetch, train, evaluate, report.

    simplan pipeline --config recipes/pipeline/twx-smollm2.yaml        # `make demo`: ~1 hour on 2 CPU cores
    simplan pipeline --config recipes/pipeline/toy-tiny.yaml           # toy env + tiny model: ~2-3 minutes
    simplan pipeline --config recipes/pipeline/twx-smollm2.yaml --force eval,report --eval '{episodes: 3}'

Stages, in order (each calls the stage's own `simplan <command>` main with explicit arguments, so
any stage can be re-run alone with the command it prints):

    collect-train    trajectories of the train fold         out/data/train.jsonl       (simplan collect)
    collect-dev      trajectories of the dev fold           out/data/dev.jsonl         (simplan collect)
    model            the base model, converted/cached once  (a local HF folder)        (simplan.training.models)
    build-decider    decider dataset                        out/datasets/decider       (simplan build)
    build-simulator  simulator dataset                      out/datasets/simulator     (simplan build)
    train-decider    LoRA adapter of the decider            out/train/decider/adapter  (simplan train)
    train-simulator  LoRA adapter of the simulator          out/train/simulator/adapter
    eval             the arms on the eval suite             out/eval/traces.jsonl      (simplan eval)
    report           Markdown + HTML report                 out/report/report.{md,html} (simplan report)

Re-running reuses finished stages: each stage writes `out/.stages/STAGE.json` atomically when it
completes, holding a hash of its arguments and of the stages it depends on; a stage is skipped when
that hash matches and its outputs exist. A stage interrupted midway is resumed (collect, train and
eval resume by themselves); a stage whose configuration changed starts over from empty outputs,
and so does everything downstream of it (their hashes include it). `--force STAGE,...` re-runs
stages; `--stages STAGE,...` runs only those (their inputs must be complete).
"""

from __future__ import annotations

import hashlib
import importlib
import json
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from simplan.data.io import write_json
from simplan.scripts.config import parse_config

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
TINY_PREFIX = "tiny-"  # "tiny-llama" / "tiny-qwen2": a tiny random model made on the fly (tests, quick runs)


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
        metadata=_help("EngineConfig keys of the eval engine (engine, dtype, threads, concurrency, ...)"),
    )
    title: str = field(default="simplan pipeline report", metadata=_help("report title"))
    stages: list[str] | None = field(default=None, metadata=_help("run only these stages (default: all)"))
    force: list[str] = field(default_factory=list, metadata=_help("re-run these stages even when complete"))

    def __post_init__(self) -> None:
        for name in ("stages", "force"):
            bad = sorted(set(getattr(self, name) or []) - set(STAGES))
            if bad:
                raise ValueError(f"{name}: unknown stage(s) {bad}; stages are {', '.join(STAGES)}")
        for section, keys in (("eval", ("out", "engine", "model", "adapters")), ("engine", ("model", "adapters"))):
            clash = sorted(set(getattr(self, section)) & set(keys))
            if clash:
                raise ValueError(f"{section}: {clash} are set by the pipeline itself; remove them")


class StageFailed(RuntimeError):
    pass


# ---------------------------------------------------------------------------------------------
# Arguments
# ---------------------------------------------------------------------------------------------
def flags(values: dict[str, Any]) -> list[str]:
    """Flags of a script from a mapping: lists comma-joined, mappings as YAML flow (JSON), None as "none".

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


def _hash(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


@dataclass
class Stage:
    name: str
    command: str  # the simplan subcommand (for the printed re-run command)
    argv: list[str]
    outputs: list[Path]  # must exist for the stage to count as complete
    run: Callable[[list[str]], int]
    depends: list[str] = field(default_factory=list)
    clear: list[Path] = field(default_factory=list)  # removed when the configuration changed


class Pipeline:
    def __init__(self, cfg: PipelineConfig) -> None:
        self.cfg = cfg
        self.out = Path(cfg.out)
        self.markers = self.out / ".stages"
        self.hashes: dict[str, str] = {}
        self.model_path: str | None = None

    # -- paths ---------------------------------------------------------------------------------
    def data(self, fold: str) -> Path:
        return self.out / "data" / f"{fold}.jsonl"

    def dataset(self, role: str) -> Path:
        return self.out / "datasets" / role

    def train_dir(self, role: str) -> Path:
        return self.out / "train" / role

    # -- stages --------------------------------------------------------------------------------
    def stage(self, name: str) -> Stage:
        cfg = self.cfg
        if name.startswith("collect-"):
            fold = name.split("-", 1)[1]
            values = {
                "env": cfg.env,
                "fold": fold,
                **({"families": cfg.families} if cfg.families else {}),
                **cfg.collect,
                **(cfg.collect_train if fold == "train" else cfg.collect_dev),
                "out": str(self.data(fold)),
            }
            argv = (["--config", cfg.collect_recipe] if cfg.collect_recipe else []) + flags(values)
            return Stage(name, "collect", argv, [self.data(fold)], _script("collect"), clear=[self.data(fold)])
        if name == "model":
            return Stage(name, "models fetch", [cfg.model], [], self._fetch_model)
        if name.startswith("build-"):
            role = name.split("-", 1)[1]
            values = {
                "role": role,
                "inputs": [str(self.data("train")), str(self.data("dev"))],
                "model": self.model_path,
                **cfg.build,
                "out": str(self.dataset(role)),
            }
            out = self.dataset(role)
            return Stage(
                name,
                "build",
                flags(values),
                [out / "dataset"],
                _script("build"),
                ["collect-train", "collect-dev", "model"],
                clear=[out],
            )
        if name.startswith("train-"):
            role = name.split("-", 1)[1]
            recipe = cfg.decider_recipe if role == "decider" else cfg.simulator_recipe
            values = {
                "model": self.model_path,
                **cfg.train,
                **(cfg.train_decider if role == "decider" else cfg.train_simulator),
                "dataset": str(self.dataset(role) / "dataset"),
                "output_dir": str(self.train_dir(role)),
            }
            out = self.train_dir(role)
            return Stage(
                name,
                "train",
                ["--config", recipe] + flags(values),
                [out / "adapter" / "adapter_config.json"],
                _script("train"),
                [f"build-{role}", "model"],
                clear=[out],
            )
        if name == "eval":
            adapters = ",".join(f"{r}={self.train_dir(r) / 'adapter'}" for r in ("decider", "simulator"))
            values = {
                "suite": cfg.suite,
                "arms": cfg.arms,
                **cfg.eval,
                **cfg.engine,
                "model": self.model_path,
                "adapters": adapters,
                "out": str(self.out / "eval"),
            }
            return Stage(
                name,
                "eval",
                flags(values),
                [self.out / "eval" / "traces.jsonl"],
                _script("eval"),
                ["train-decider", "train-simulator", "model"],
                clear=[self.out / "eval"],
            )
        if name == "report":
            argv = [str(self.out / "eval"), "--out", str(self.out / "report"), "--title", cfg.title]
            return Stage(name, "report", argv, [self.out / "report" / "report.html"], _script("report"), ["eval"])
        raise ValueError(f"unknown stage {name!r}")

    def _fetch_model(self, argv: list[str]) -> int:
        self.model_path = resolve_base_model(argv[0])
        print(f"model: {argv[0]} -> {self.model_path}", flush=True)
        return 0

    # -- markers -------------------------------------------------------------------------------
    def _marker(self, name: str) -> Path:
        return self.markers / f"{name}.json"

    def _read(self, path: Path) -> dict[str, Any] | None:
        try:
            return json.loads(path.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return None

    def complete(self, st: Stage, digest: str) -> bool:
        done = self._read(self._marker(st.name))
        return bool(done and done.get("hash") == digest and all(p.exists() for p in st.outputs))

    # -- run -----------------------------------------------------------------------------------
    def run(self) -> Path:
        cfg = self.cfg
        chosen = cfg.stages or list(STAGES)
        last = max(STAGES.index(s) for s in chosen)
        t_start = time.perf_counter()
        for i, name in enumerate(STAGES[: last + 1], start=1):
            st = self.stage(name)
            digest = _hash({"stage": name, "argv": st.argv, "depends": [self.hashes[d] for d in st.depends]})
            self.hashes[name] = digest
            banner = f"[{i}/{len(STAGES)}] {name}"
            rerun = f"simplan {st.command} " + " ".join(_quote(a) for a in st.argv)
            done = self.complete(st, digest)
            if name == "model" and (done or name not in chosen) and name not in cfg.force:
                try:  # cheap once converted; later stages' arguments need the folder
                    self.model_path = resolve_base_model(cfg.model, fetch=name in chosen)
                except FileNotFoundError as e:
                    raise StageFailed(f"{banner}: {e}") from None
            if name not in chosen:
                if not done:
                    raise StageFailed(f"{banner}: not complete and not selected by --stages; run it first: {rerun}")
                print(f"{banner}: complete (not selected)", flush=True)
                continue
            if done and name not in cfg.force:
                print(f"{banner}: complete, reusing ({self._marker(name)})", flush=True)
                continue
            self._start(st, digest)
            print(f"\n=== {banner} ===\n$ {rerun}", flush=True)
            t0 = time.perf_counter()
            rc = int(st.run(list(st.argv)) or 0)
            if rc != 0:
                raise StageFailed(
                    f"{banner} failed (exit status {rc}); fix the cause above and re-run the same pipeline command "
                    "(finished stages are reused), or run the stage alone: " + rerun
                )
            missing = [str(p) for p in st.outputs if not p.exists()]
            if missing:
                raise StageFailed(f"{banner}: finished but its outputs are missing: {', '.join(missing)}")
            seconds = time.perf_counter() - t0
            write_json(
                self._marker(name),
                {
                    "stage": name,
                    "hash": digest,
                    "argv": st.argv,
                    "command": rerun,
                    "outputs": [str(p) for p in st.outputs],
                    "model_path": self.model_path if name == "model" else None,
                    "seconds": round(seconds, 1),
                    "finished": time.strftime("%Y-%m-%dT%H:%M:%S"),
                },
            )
            print(f"{banner}: done in {seconds:.0f}s", flush=True)
        write_json(self.out / "pipeline.json", {"config": asdict(cfg), "hashes": self.hashes})
        print(f"\npipeline: finished in {time.perf_counter() - t_start:.0f}s", flush=True)
        return self.out / "report" / "report.html"

    def _start(self, st: Stage, digest: str) -> None:
        """Record that the stage started; a configuration change since the last start clears its outputs."""
        started = self.markers / f"{st.name}.started"
        previous = started.read_text().strip() if started.exists() else None
        if previous is not None and previous != digest:
            for p in st.clear:
                if p.is_dir():
                    shutil.rmtree(p)
                elif p.exists():
                    p.unlink()
            print(f"pipeline: {st.name}: configuration changed since it last ran; starting it over", flush=True)
        self._marker(st.name).unlink(missing_ok=True)
        started.parent.mkdir(parents=True, exist_ok=True)
        started.write_text(digest + "\n")


def _script(name: str) -> Callable[[list[str]], int]:
    """The `main` of scripts/NAME.py, imported when the stage runs (skipped stages import nothing heavy)."""

    def run(argv: list[str]) -> int:
        module = importlib.import_module(f"simplan.scripts.{name}")
        return int(module.main(argv) or 0)

    return run


def resolve_base_model(name: str, fetch: bool = True) -> str:
    """A local folder for `name`; tiny-llama / tiny-qwen2 build a tiny random model (cached)."""
    if name.startswith(TINY_PREFIX):
        from simplan.training.tiny import tiny_model

        return str(tiny_model(name[len(TINY_PREFIX) :]))
    from simplan.training.models import resolve_model

    return resolve_model(name, fetch=fetch)


def _quote(arg: str) -> str:
    return arg if arg and all(c.isalnum() or c in "-_./=,:" for c in arg) else "'" + arg.replace("'", "'\\''") + "'"


def main(argv: list[str] | None = None) -> int:
    (cfg,) = parse_config([PipelineConfig], argv, description=__doc__.split("\n")[0], prog="simplan pipeline")
    try:
        report = Pipeline(cfg).run()
    except StageFailed as e:
        print(f"simplan pipeline: {e}", file=sys.stderr)
        return 1
    if report.exists():
        print(f"\nreport: {report}\nreport: {report.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
