"""The pipeline reuses finished stages, re-runs changed ones and what depends on them; toy-tiny end to end (slow)."""

from __future__ import annotations

import importlib.util
import json
import shlex
import time
from pathlib import Path

import pytest

from simplan.core.config import parse_config
from simplan.scripts.pipeline import main
from simplan.workflows import pipeline as pl

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def fake_stages(monkeypatch):
    """Every stage writes one output file and records that it ran; its config is the pipeline's section."""
    ran: list[str] = []

    def stage(self: pl.Pipeline, name: str) -> pl.Stage:
        out = self.out / f"{name}.out"
        idx = pl.STAGES.index(name)
        section = {"collect-train": self.cfg.collect_train, "eval": self.cfg.eval}.get(name, {})

        def run() -> str:
            ran.append(name)
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(section))
            return f"{name} result"

        depends = [pl.STAGES[idx - 1]] if idx else []
        return pl.Stage(name, f"simplan {name}", dict(section), [out], run, depends, clear=[out])

    monkeypatch.setattr(pl.Pipeline, "stage", stage)
    monkeypatch.setattr(pl, "resolve_base_model", lambda name, fetch=True: "/fake/model")
    return ran


def test_stages_are_reused_and_changes_propagate(tmp_path, fake_stages) -> None:
    out = str(tmp_path / "p")
    assert main(["--out", out]) == 0
    assert fake_stages == list(pl.STAGES)
    marker = json.loads((tmp_path / "p" / ".stages" / "eval.json").read_text())
    assert marker["stage"] == "eval" and len(marker["hash"]) == 16

    fake_stages.clear()
    assert main(["--out", out]) == 0
    assert fake_stages == []  # everything complete: reused

    fake_stages.clear()
    assert main(["--out", out, "--eval", "{episodes: 3}"]) == 0
    assert fake_stages == ["eval", "report"]  # eval changed, report depends on it

    fake_stages.clear()
    assert main(["--out", out, "--eval", "{episodes: 3}", "--collect_train", "{limit: 2}"]) == 0
    assert fake_stages == list(pl.STAGES)  # a change upstream re-runs everything downstream

    fake_stages.clear()
    assert main(["--out", out, "--eval", "{episodes: 3}", "--collect_train", "{limit: 2}", "--force", "report"]) == 0
    assert fake_stages == ["report"]


def test_missing_output_or_unselected_incomplete_stage(tmp_path, fake_stages, capsys) -> None:
    out = tmp_path / "p"
    assert main(["--out", str(out), "--stages", "collect-train,collect-dev"]) == 0
    assert fake_stages == ["collect-train", "collect-dev"]
    # eval selected, but the stages before it never ran: refused with the command to run
    assert main(["--out", str(out), "--stages", "eval"]) == 2  # the user must run the earlier stages first
    assert "not complete" in capsys.readouterr().err
    (out / "collect-dev.out").unlink()  # an output deleted by hand: the stage is not complete any more
    fake_stages.clear()
    assert main(["--out", str(out), "--stages", "collect-train,collect-dev"]) == 0
    assert fake_stages == ["collect-dev"]


def test_a_stage_no_selected_stage_reads_need_not_be_done(tmp_path, fake_stages, monkeypatch, capsys) -> None:
    """A decider-only run skips build-simulator, which stands between its stages in the order but feeds none."""
    reads = {"build-decider": ["collect-train", "collect-dev", "model"], "build-simulator": ["collect-train", "model"],
             "train-decider": ["build-decider", "model"], "train-simulator": ["build-simulator", "model"],
             "eval": ["train-decider", "train-simulator"], "report": ["eval"]}  # fmt: skip
    linear = pl.Pipeline.stage

    def stage(self: pl.Pipeline, name: str) -> pl.Stage:
        st = linear(self, name)
        st.depends = reads.get(name, [])
        return st

    monkeypatch.setattr(pl.Pipeline, "stage", stage)
    out = str(tmp_path / "p")
    decider_only = ["collect-train", "collect-dev", "model", "build-decider", "train-decider"]
    assert main(["--out", out, "--stages", ",".join(decider_only)]) == 0
    assert fake_stages == decider_only
    assert "build-simulator: not selected, and no selected stage reads it" in capsys.readouterr().out
    assert main(["--out", out, "--stages", "eval"]) == 2  # eval reads the simulator: its stages must run first
    assert "[5/8] build-simulator: not complete and not selected" in capsys.readouterr().err


def test_flags_and_config_validation() -> None:
    assert pl.flags({"a": [1, 2], "b": None, "c": True, "d": {"x": 1}}) == [
        "--a", "1,2", "--b", "none", "--c", "true", "--d", '{"x": 1}',
    ]  # fmt: skip
    with pytest.raises(ValueError, match="unknown stage"):
        pl.PipelineConfig(force=["trian"])
    with pytest.raises(ValueError, match="set by the pipeline"):
        pl.PipelineConfig(eval={"out": "x"})


def test_markers_from_before_config_hashes_count_when_the_command_is_the_same(tmp_path, fake_stages) -> None:
    out = tmp_path / "p"
    assert main(["--out", str(out)]) == 0
    for marker in (out / ".stages").glob("*.json"):  # as the argv-hashing pipeline wrote them
        record = json.loads(marker.read_text())
        legacy = {"stage": record["stage"], "hash": "0123456789abcdef", "argv": [], "command": record["command"]}
        marker.write_text(json.dumps(legacy))
    (out / ".stages" / "eval.json").write_text(json.dumps({"hash": "x", "argv": [], "command": "simplan eval --old"}))
    fake_stages.clear()
    assert main(["--out", str(out)]) == 0
    assert fake_stages == ["eval"]  # the one whose command changed; report is reused (its config is unchanged)
    assert all("config" in json.loads(m.read_text()) for m in (out / ".stages").glob("*.json"))  # upgraded
    fake_stages.clear()
    assert main(["--out", str(out)]) == 0
    assert fake_stages == []


def test_time_left_and_summary(tmp_path, fake_stages, capsys) -> None:
    out = str(tmp_path / "p")
    assert main(["--out", out, "--estimates", "{collect-train: 2, eval: 1}"]) == 0
    text = capsys.readouterr().out
    assert "=== [1/9] collect-train === time left: about 3 min or more (from recipe estimates: 2;" in text
    assert "no estimate for collect-dev, model," in text
    # collect-dev has no estimate of its own: its twin's time in this run stands in
    assert "=== [2/9] collect-dev === time left:" in text and "collect-train this run: 1" in text
    summary = text[text.index("pipeline summary") :]
    assert "collect-train    ran" in summary and "collect-train result" in summary
    assert "report: " not in summary  # the fake report stage writes no report.html

    assert main(["--out", out, "--force", "eval"]) == 0
    text = capsys.readouterr().out
    # eval re-runs, report is reused (eval's configuration is unchanged); the time comes from the last run
    assert "=== [8/9] eval === time left: about 0 s (from earlier runs here: 1)" in text
    assert "pipeline: eval: forced (--force); starting it over" in text  # a forced eval does not resume
    summary = text[text.index("pipeline summary") :]
    assert "collect-train    reused" in summary and "eval             ran" in summary
    assert "report           reused" in summary


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="peak memory is read from Linux /proc")
def test_each_stage_reports_its_own_peak_memory(tmp_path, fake_stages, monkeypatch, capsys) -> None:
    fake = pl.Pipeline.stage

    def stage(self: pl.Pipeline, name: str) -> pl.Stage:
        st = fake(self, name)
        if name == "train-decider":
            run = st.run

            def allocating() -> str:
                block = bytearray(300 << 20)  # 300 MB touched, freed before the stage ends
                block[::4096] = b"x" * len(block[::4096])
                del block
                return run()

            st.run = allocating
        return st

    monkeypatch.setattr(pl.Pipeline, "stage", stage)
    assert main(["--out", str(tmp_path / "p")]) == 0
    peaks = {m.stem: json.loads(m.read_text())["peak_mb"] for m in (tmp_path / "p" / ".stages").glob("*.json")}
    assert peaks["train-decider"] >= peaks["build-simulator"] + 250  # the 300 MB show in its own stage only
    assert peaks["train-simulator"] < peaks["train-decider"] - 250  # the peak starts again for the next stage
    summary = capsys.readouterr().out.split("pipeline summary")[1]
    assert "peak GB" in summary
    row = next(line for line in summary.splitlines() if "train-decider" in line).split()
    assert float(row[3]) == pytest.approx(peaks["train-decider"] / 1024, abs=0.06)


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="peak memory is read from Linux /proc")
def test_a_training_stage_in_processes_adds_their_peaks(tmp_path, fake_stages, monkeypatch, capsys) -> None:
    """A training run in data-parallel processes holds its memory outside the pipeline's process: the stage's
    peak is the pipeline's own plus the processes' (metrics.json's peak_rss_mb_per_process, summed)."""
    fake = pl.Pipeline.stage

    def stage(self: pl.Pipeline, name: str) -> pl.Stage:
        st = fake(self, name)
        if name.startswith("train-"):
            out = tmp_path / name
            out.mkdir(exist_ok=True)
            peaks = [1500, 1600] if name == "train-decider" else [1500]  # the simulator trained in-process
            (out / "metrics.json").write_text(json.dumps({"peak_rss_mb_per_process": peaks}))
            st.held_elsewhere_mb = lambda: pl.training_processes_mb(out)
        return st

    monkeypatch.setattr(pl.Pipeline, "stage", stage)
    assert main(["--out", str(tmp_path / "p")]) == 0
    peaks = {m.stem: json.loads(m.read_text())["peak_mb"] for m in (tmp_path / "p" / ".stages").glob("*.json")}
    # the simulator trained in this process: its own peak counted it, nothing is added
    assert peaks["train-decider"] - peaks["train-simulator"] == pytest.approx(3100, abs=200)
    assert pl.training_processes_mb(tmp_path / "nowhere") is None


def test_an_eval_on_engine_lanes_counts_the_lanes_peaks_of_its_last_run(tmp_path) -> None:
    """run.json's lane_peak_rss_mb (evaluation/runner.py) of the stage's last invocation, summed: the eval stage's
    held_elsewhere_mb (an engine in the eval's own process: none)."""
    out = tmp_path / "eval"
    out.mkdir()
    runs = [{"lane_peak_rss_mb": [900.0, 950.0]}, {"lane_peak_rss_mb": [1000.0, None, 1100.0]}]
    (out / "run.json").write_text(json.dumps({"invocations": runs}))
    assert pl.eval_lanes_mb(out) == 2100.0  # the last run; a lane that died is left out
    (out / "run.json").write_text(json.dumps({"invocations": [{"engine": {}}]}))
    assert pl.eval_lanes_mb(out) is None and pl.eval_lanes_mb(tmp_path / "nowhere") is None


def test_no_peak_is_reported_where_it_cannot_be_reset(tmp_path, fake_stages, monkeypatch, capsys) -> None:
    monkeypatch.setattr(pl, "peak_reset", lambda: False)  # VmHWM would be the process's peak, not the stage's
    assert main(["--out", str(tmp_path / "p")]) == 0
    peaks = {json.loads(m.read_text())["peak_mb"] for m in (tmp_path / "p" / ".stages").glob("*.json")}
    assert peaks == {None}
    row = next(line for line in capsys.readouterr().out.splitlines() if line.lstrip().startswith("train-decider"))
    assert row.split()[3] == "-"


def test_a_failing_stage_is_summarised_with_its_command(tmp_path, fake_stages, monkeypatch, capsys) -> None:
    fake = pl.Pipeline.stage

    def stage(self: pl.Pipeline, name: str) -> pl.Stage:
        st = fake(self, name)
        if name == "train-decider":
            st.run = lambda: (_ for _ in ()).throw(ValueError("max_length: all 3 training examples are longer"))
        return st

    monkeypatch.setattr(pl.Pipeline, "stage", stage)
    assert main(["--out", str(tmp_path / "p")]) == 1
    captured = capsys.readouterr()
    assert "[6/9] train-decider failed: max_length: all 3" in captured.err
    assert "run the stage alone: simplan train-decider" in captured.err
    assert "train-decider    failed" in captured.out and "build-simulator  ran" in captured.out
    assert fake_stages[-1] == "build-simulator"


def test_stage_configs_come_from_the_recipes(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(REPO)
    argv = ["--config", "recipes/pipeline/twx-smollm2.yaml", "--out", str(tmp_path / "p")]
    (cfg,) = parse_config([pl.PipelineConfig], argv)
    pipeline = pl.Pipeline(cfg)
    pipeline.model_path = "/models/smollm2"
    train = pipeline.stage("train-decider")
    assert train.config["TrainArguments"]["max_steps"] == 90  # the pipeline's train keys override the recipe
    assert train.config["TrainArguments"]["learning_rate"] == 8.0e-4  # the recipe's own value
    assert train.config["ModelArguments"]["model"] == "/models/smollm2"
    assert train.config["DataArguments"]["dataset"] == str(tmp_path / "p" / "datasets" / "decider" / "dataset")
    assert train.command.startswith("simplan train --config recipes/smollm2-135m-instruct/twx/decider.yaml ")
    collect_train = pipeline.stage("collect-train").config["collect"]  # the fields that differ from the defaults
    assert collect_train["policies"] == ["expert", "noisy_expert", "random"] and collect_train["branches"] == 2
    collect_dev = pipeline.stage("collect-dev").config["collect"]  # collect_dev's keys over the recipe's
    assert "policies" not in collect_dev and "branches" not in collect_dev  # back to the defaults
    assert collect_dev["limit"] == 3 and collect_dev["workers"] == 2
    assert pipeline.stage("build-simulator").config["build"]["max_prompt_tokens"] == 640
    eval_stage = pipeline.stage("eval")
    assert eval_stage.config["eval"]["concurrency"] == 12 and eval_stage.config["eval"]["episodes"] == 5
    # the pivots without imagination beside reactive and simplan on every task, then the bound
    assert eval_stage.config["eval"]["arms"] == ["reactive", "reactive-pivots", "simplan", "simplan-oracle"]
    assert eval_stage.config["eval"]["compared_arms"] == 3
    assert "max_steps" not in eval_stage.config["eval"]  # each task's cap comes from its expert path (the suite's)
    assert eval_stage.config["eval"]["arm_overrides"]["simplan"] == {
        "horizon": 1,
        "judge": {"progress": 0.0, "error": 0.0, "repeat": 0.0, "failed": 0.0},
        "pivot_rules": {"similarity": "likelihood", "mismatch_threshold": 0.9},
    }

    # a recipe file's contents are part of the stage's configuration: an edit re-runs the stage
    recipe = tmp_path / "decider.yaml"
    recipe.write_text(
        (REPO / cfg.decider_recipe).read_text().replace("learning_rate: 8.0e-4", "learning_rate: 1.0e-4")
    )
    cfg.decider_recipe = str(recipe)
    assert pipeline.stage("train-decider").config["TrainArguments"]["learning_rate"] == 1e-4

    # a typo in any stage's keys fails before the first stage runs
    assert main(argv + ["--train", "{max_stepz: 3}"]) == 2
    captured = capsys.readouterr()
    assert "train-decider: pipeline keys train/train_decider: unknown key 'max_stepz'" in captured.err
    assert "pipeline summary" not in captured.out  # nothing ran, nothing to summarise
    assert not (tmp_path / "p" / "data").exists()

    # so does a wrong planner setting of the eval stage (built per arm only when the eval ran, after training)
    assert main(argv + ["--eval", "{planner: {pivot_rules: {ban_after: [similarity]}}}"]) == 2
    captured = capsys.readouterr()
    assert "eval: PivotConfig (arm reactive): pivot_rules.ban_after: ['similarity'] cannot ban" in captured.err
    assert not (tmp_path / "p" / "data").exists()


def test_build_stages_name_the_pipelines_env_and_keep_their_hash(tmp_path, monkeypatch) -> None:
    """Trajectories record the env's own name ("shop"), which build resolves only where the package's entry point
    is installed: both build stages pass the env the pipeline collected from, in the command they print too."""
    from simplan.data.build import BuildConfig

    spec = "simplan_shop.env:ShopEnv"
    pipeline = pl.Pipeline(pl.PipelineConfig(out=str(tmp_path / "p"), env=spec))
    ran: list[BuildConfig] = []
    monkeypatch.setattr(pl, "run_build", lambda cfg: ran.append(cfg) or "built")
    for role in ("decider", "simulator"):
        stage = pipeline.stage(f"build-{role}")
        argv = shlex.split(stage.command)
        assert argv[:2] == ["simplan", "build"]
        (printed,) = parse_config([BuildConfig], argv[2:])  # the printed command runs the same build
        assert printed.env == spec and printed.role == role
        stage.run()
        assert ran[-1].env == spec and ran[-1].role == role
        # the collect stages the build reads hash the env: a build finished before it was passed is not redone
        assert "env" not in stage.config["build"]

    other = pl.Pipeline(pl.PipelineConfig(out=str(tmp_path / "q"), env=spec, build={"env": "toy"}))
    assert other.stage("build-decider").config["build"]["env"] == "toy"  # the pipeline's build keys win, hashed


def test_collect_eval_and_report_stages_call_the_library(tmp_path, capsys) -> None:
    """Toy env, no model: collect through data.collect, eval with the expert engine, the report, the summary."""
    out = tmp_path / "p"
    common = ["--out", str(out), "--env", "toy", "--collect", "{workers: 1, progress: false}"]
    argv = common + ["--collect_train", "{limit: 2}", "--collect_dev", "{limit: 1}", "--stages", "collect-train"]
    assert main(argv) == 0
    lines = (out / "data" / "train.jsonl").read_text().splitlines()
    assert lines and {json.loads(line)["policy"] for line in lines} == {"expert", "noisy_expert"}
    marker = json.loads((out / ".stages" / "collect-train.json").read_text())
    assert marker["config"]["collect"]["limit"] == 2 and marker["command"].startswith("simplan collect --env toy")

    cfg = pl.PipelineConfig(
        out=str(out),
        suite="toy-dev",
        arms=["reactive"],
        eval={"episodes": 2, "progress": False},
        engine={"engine": "expert"},
        title="toy expert",
        max_minutes=30,
    )
    pipeline = pl.Pipeline(cfg)
    pipeline.started = time.perf_counter() - 60.0 * 40  # the run's budget is spent: the eval gets its least
    capsys.readouterr()
    assert pipeline.stage("eval").run() == "2 episodes"
    assert "eval: time budget 1 min (the run's max_minutes 30: 0.0 min left" in capsys.readouterr().out
    assert pl.arm_success(out / "eval") == [pl.ArmSuccess("reactive", 2, 2)]
    html = pipeline.stage("report").run()
    assert html == str(out / "report" / "report.html") and "toy expert" in Path(html).read_text()
    summary = pipeline.summary()
    assert "eval success by arm: reactive 2/2 (100%)" in summary
    assert summary.endswith(f"report: {(out / 'report' / 'report.html').resolve()}")


def test_a_stage_error_the_user_can_fix_is_one_line_with_the_command(tmp_path, capsys) -> None:
    argv = ["--out", str(tmp_path / "p"), "--env", "no_such_env", "--stages", "collect-train"]
    assert main(argv + ["--collect", "{progress: false}"]) == 2  # a usage error inside a stage: status 2
    captured = capsys.readouterr()
    assert "[1/1] collect-train failed: " in captured.err and "no_such_env" in captured.err
    assert "Traceback" not in captured.err and "run the stage alone: simplan collect --env no_such_env" in captured.err
    assert "collect-train    failed" in captured.out


def _stages_available() -> bool:
    return (
        importlib.util.find_spec("simplan.scripts.train") is not None
        and (REPO / "recipes/smollm2-135m-instruct/twx/decider.yaml").exists()
        and (REPO / "recipes/smollm2-135m-instruct/twx/simulator.yaml").exists()
    )


@pytest.mark.slow
@pytest.mark.skipif(not _stages_available(), reason="simplan train or its recipes are not there yet")
def test_toy_tiny_pipeline_end_to_end(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(REPO)
    out = tmp_path / "toy-tiny"
    argv = ["--config", "recipes/pipeline/toy-tiny.yaml", "--out", str(out)]
    assert main(argv) == 0
    # the summary ends on the paired comparison the report opens with
    printed = capsys.readouterr().out
    assert "simplan - reactive = " in printed and "paired tasks" in printed and "exact McNemar p = " in printed
    report = out / "report" / "report.md"
    assert report.exists() and (out / "report" / "report.html").exists()
    assert (out / "train" / "decider" / "adapter" / "adapter_config.json").exists()
    text = report.read_text()
    assert str(out / "eval" / "traces.jsonl") in text
    for arm in ("reactive", "plan", "simplan"):
        assert f"| {arm} |" in text
    lines = (out / "eval" / "results.jsonl").read_text().splitlines()
    assert len(lines) == 6  # 2 toy tasks x 3 arms
    # re-running reuses every stage
    before = {p.name: p.stat().st_mtime for p in (out / ".stages").glob("*.json")}
    assert main(argv) == 0
    assert {p.name: p.stat().st_mtime for p in (out / ".stages").glob("*.json")} == before


REAL_STAGE = pl.Pipeline.stage  # taken before the fake_stages fixture replaces it


def test_an_eval_whose_episodes_errored_fails_and_a_rerun_retries_them(tmp_path, fake_stages, monkeypatch, capsys):
    """Every episode crashes (a planner bug): the eval stage fails naming them, no marker records it as done and
    the report never runs on crashes; the cause fixed, the same command plays those episodes again and goes on."""
    from simplan.inference.planning.planner import Planner

    fake = pl.Pipeline.stage
    monkeypatch.setattr(pl.Pipeline, "stage", lambda self, name: (REAL_STAGE if name == "eval" else fake)(self, name))
    broken, real_loop = [True], Planner._loop

    def loop(self: Planner, ep):
        if broken[0]:
            raise AttributeError("'NoneType' object has no attribute 'text'")
        return real_loop(self, ep)

    monkeypatch.setattr(Planner, "_loop", loop)
    out = tmp_path / "p"
    argv = ["--out", str(out), "--suite", "toy-dev", "--arms", "reactive", "--engine", "{engine: expert}"]
    argv += ["--eval", "{episodes: 2, progress: false}"]

    assert main(argv) == 1
    captured = capsys.readouterr()
    assert "[8/9] eval failed: 2 of 2 episode(s) errored (reactive 2)" in captured.err
    assert "AttributeError: 'NoneType' object has no attribute 'text'" in captured.err
    assert f"end events in {out / 'eval' / 'traces.jsonl'}" in captured.err
    assert "eval             failed" in captured.out and "report" not in fake_stages
    assert "eval success by arm: reactive 0/2 (0%), 2 errored" in captured.out
    assert not (out / ".stages" / "eval.json").exists()

    broken[0] = False
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert "eval: 2 episode(s) run" in captured.out and "(0 already done, 0 errored) of 2" in captured.out
    assert (out / ".stages" / "eval.json").exists() and fake_stages[-1] == "report"
    assert "eval success by arm: reactive 2/2 (100%)" in captured.out


def test_the_runs_max_minutes_shrinks_the_eval_budget_to_what_is_left(capsys) -> None:
    """max_minutes 10, 4 minutes gone, the report guessed at 1: the eval may take 5 minutes (its own 25 shrinks),
    a shorter own budget stays, and past the run's budget it still gets EVAL_MINUTES_AT_LEAST; no run budget: as
    the recipe says."""
    from simplan.evaluation.runner import EvalConfig
    from simplan.workflows.time_left import TimeLeft

    def budget(run_minutes: float, gone: float, own: float) -> float:
        p = pl.Pipeline(pl.PipelineConfig(out="unused", max_minutes=run_minutes))
        p.started, p.ahead = time.perf_counter() - 60.0 * gone, ["eval", "report"]
        p.clock = TimeLeft({}, {"report": 60.0})
        return p.within_budget("eval", EvalConfig(max_minutes=own)).max_minutes

    assert budget(10, 4, 25) == pytest.approx(5.0, abs=0.1)
    assert (
        "eval: time budget 5 min (the run's max_minutes 10: 5.0 min left after the 1.0 min" in capsys.readouterr().out
    )
    assert budget(10, 4, 0) == pytest.approx(5.0, abs=0.1)  # no budget of its own: the run's
    assert budget(10, 4, 3) == 3  # its own is shorter
    assert budget(10, 20, 25) == pl.EVAL_MINUTES_AT_LEAST
    assert budget(0, 20, 25) == 25
    with pytest.raises(ValueError, match="max_minutes: must be >= 0"):
        pl.PipelineConfig(max_minutes=-1)
