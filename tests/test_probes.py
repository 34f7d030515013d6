"""Misuse probes, end to end through the `simplan` entry point: each ordinary mistake ends in a message that says
what, where and what to do, with exit status 2 (1 for failed work, 130 for Ctrl-C), never a traceback (issue 30).

    .venv/bin/pytest -q tests/test_probes.py

Every probe runs `scripts/cli.py main` in this process (no model loads: the output folder and the flags are
checked before anything expensive), and asserts the status, the words that name the file or field, and that
no "Traceback" reached stderr.
"""

from __future__ import annotations

import codecs
import errno
import json
import os
import stat
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from simplan.core import io
from simplan.core.config import load_configs, load_yaml
from simplan.scripts import cli


def simplan(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    """(exit status, stderr) of `simplan ARGS...`; argparse's SystemExit read as the status it carries."""
    try:
        rc = cli.main([str(a) for a in args])
    except SystemExit as e:
        rc = e.code if isinstance(e.code, int) else 1
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    return rc, err


@pytest.fixture
def trajectories(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    """Two good toy trajectory lines, collected through the CLI."""
    path = tmp_path / "toy.jsonl"
    flags = ["--env", "toy", "--fold", "train", "--policies", "expert", "--limit", "2", "--workers", "1"]
    assert simplan(capsys, "collect", *flags, "--out", path, "--progress", "false")[0] == 0
    assert len(path.read_text().splitlines()) == 2
    return path


# ------------------------------------------------------------------------------------------ recipes and flags
def test_a_missing_config_file_is_named(tmp_path, capsys):
    for command in ("train", "build", "pipeline"):
        rc, err = simplan(capsys, command, "--config", tmp_path / "missing.yaml")
        assert rc == 2 and f"config file {tmp_path / 'missing.yaml'} does not exist" in err, (command, err)
        assert len(err.strip().splitlines()) == 2  # the error and where the options are listed, not 60 flags


def test_the_shipped_recipes_are_found_from_any_working_folder(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the pipeline's default train recipes are recipes/... paths
    rc, err = simplan(capsys, "pipeline", "--env", "nosuch", "--out", tmp_path / "p")
    assert rc == 2 and "unknown environment 'nosuch'" in err and "config file" not in err, err
    own = tmp_path / "recipes" / "smollm2-135m-instruct" / "twx"
    own.mkdir(parents=True)
    (own / "decider.yaml").write_text("learning_rate: 0.5\n")  # a recipe of the working folder wins
    assert load_yaml("recipes/smollm2-135m-instruct/twx/decider.yaml") == {"learning_rate": 0.5}


def test_a_recipe_that_is_not_yaml_or_not_a_mapping(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("role: decider\ninputs: [a.jsonl\n")
    rc, err = simplan(capsys, "build", "--config", bad)
    assert rc == 2 and f"{bad}: not valid YAML (" in err and "at line 3, column 1" in err
    assert len(err.strip().splitlines()) == 2
    listed = tmp_path / "list.yaml"
    listed.write_text("- 1\n- 2\n")
    rc, err = simplan(capsys, "train", "--config", listed)
    assert rc == 2 and f"{listed}: a recipe is a mapping of key: value, got list" in err


def test_recipe_values_are_read_by_the_field_type(tmp_path):
    from simplan.evaluation.runner import EvalConfig
    from simplan.training.config import TrainArguments

    recipe = tmp_path / "r.yaml"
    recipe.write_text("learning_rate: 1e-4\n")  # YAML 1.1 reads this as the string '1e-4'
    assert load_configs([TrainArguments], recipe)[0].learning_rate == pytest.approx(1e-4)
    recipe.write_text("suite: toy-dev\narms: reactive\n")
    assert load_configs([EvalConfig], recipe)[0].arms == ["reactive"]  # one arm, not seven letters
    recipe.write_text("suite: toy-dev\narms: {reactive: 1}\n")
    with pytest.raises(ValueError, match="arms"):
        load_configs([EvalConfig], recipe)


def test_suite_values_are_read_by_the_field_type(tmp_path):
    from simplan.evaluation.suites import load_suite, suite_tasks

    suite = tmp_path / "mine.yaml"
    suite.write_text(
        "faults: {transient: 1e-1}\nentries:\n  - {env: toy, families: corridor, tasks_per_family: '2'}\n"
    )
    (entry,) = load_suite(str(suite)).entries
    assert entry.families == ["corridor"] and entry.tasks_per_family == 2 and entry.faults.transient == 0.1
    assert [t.task_id for _, tasks in suite_tasks(load_suite(str(suite))) for t in tasks] == [
        "corridor-100",
        "corridor-101",
    ]
    suite.write_text("entries:\n  - {env: toy, tasks_per_family: many}\n")
    with pytest.raises(ValueError, match=r"entries\[0\]: tasks_per_family: expected"):
        load_suite(str(suite))


@pytest.mark.parametrize(
    "planner, words",
    [
        ("{horizon: 2", "planner: not valid YAML (expected ',' or '}', but got '<stream end>' at line 1, column 12)"),
        ("[1,2]", "planner: expected a YAML mapping, got [1, 2]"),
    ],
)
def test_a_planner_flag_that_is_not_a_mapping(planner, words, tmp_path, capsys):
    rc, err = simplan(
        capsys, "eval", "--suite", "toy-dev", "--engine", "random", "--planner", planner, "--out", tmp_path
    )
    assert rc == 2 and words in err


# ------------------------------------------------------------------------------------------ output paths
def test_an_out_that_cannot_be_a_folder_is_refused_before_the_engine_loads(tmp_path, capsys):
    a_file = tmp_path / "notes.txt"
    a_file.write_text("mine\n")
    engine = ["--engine", "hf", "--model", tmp_path / "no-such-model"]  # would fail if it were loaded
    rc, err = simplan(capsys, "eval", "--suite", "toy-dev", *engine, "--out", a_file)
    assert rc == 2 and f"--out {a_file}: is a file, not a folder" in err
    rc, err = simplan(capsys, "eval", "--suite", "toy-dev", *engine, "--out", a_file / "run")
    assert rc == 2 and f"{a_file} is a file, so no folder can be made under it" in err
    rc, err = simplan(capsys, "train", "--dataset", tmp_path / "ds", "--output_dir", a_file)
    assert rc == 2 and f"--output_dir {a_file}: is a file" in err
    rc, err = simplan(capsys, "report", tmp_path, "--out", a_file)
    assert rc == 2 and "is a file" in err
    assert a_file.read_text() == "mine\n"


def test_an_out_file_that_is_a_folder(tmp_path, capsys):
    rc, err = simplan(capsys, "collect", "--env", "toy", "--fold", "train", "--out", tmp_path)
    assert rc == 2 and f"--out {tmp_path}: is a folder; give a file path" in err


@pytest.mark.parametrize(
    "code, words",
    [(errno.ENOSPC, "no space left on the device"), (errno.EROFS, "a read-only file system")],
)
def test_a_full_or_read_only_disk_is_named_before_any_work(code, words, tmp_path, capsys, monkeypatch, trajectories):
    def write(fd: int, data: bytes) -> int:
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(io.os, "write", write)
    out = tmp_path / "datasets" / "decider"
    rc, err = simplan(capsys, "build", "--inputs", trajectories, "--out", out)
    assert rc == 2 and f"--out {out}: cannot be written (checked in {tmp_path}, where it would be made)" in err
    assert words in err and not out.exists()


# ------------------------------------------------------------------------------------------ models and envs
def test_a_missing_model_folder(tmp_path, capsys):
    rc, err = simplan(
        capsys,
        "eval",
        "--suite",
        "toy-dev",
        "--engine",
        "hf",
        "--model",
        tmp_path / "missing",
        "--out",
        tmp_path / "e",
    )
    assert rc == 2 and f"model '{tmp_path / 'missing'}' not found" in err and "does not exist" in err


def test_an_env_factory_that_cannot_make_an_env(tmp_path, capsys, monkeypatch):
    out = tmp_path / "c.jsonl"
    rc, err = simplan(capsys, "collect", "--env", "json:loads", "--fold", "train", "--out", out)
    assert rc == 2 and "env 'json:loads': json.loads cannot be made with no arguments" in err
    (tmp_path / "myfactory.py").write_text("def make(**kwargs):\n    return 3\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    rc, err = simplan(capsys, "collect", "--env", "myfactory:make", "--fold", "train", "--out", out)
    assert rc == 2 and "env 'myfactory:make' returned an object of type int, which does not implement" in err
    sys.modules.pop("myfactory", None)


# ------------------------------------------------------------------------------------------ input files
def test_empty_and_blank_inputs_are_errors(tmp_path, capsys):
    for name, text in (("empty.jsonl", ""), ("blank.jsonl", "\n  \n")):
        path = tmp_path / name
        path.write_text(text)
        for command in (["validate", path], ["import", "--format", "openai", path, "--out", tmp_path / "o.jsonl"]):
            rc, err = simplan(capsys, *command)
            assert rc == 2 and f"{path}: empty (no line to read)" in err, (command, err)
        rc, err = simplan(capsys, "build", "--inputs", path, "--out", tmp_path / "ds")
        assert rc == 2 and f"input {path}: empty" in err
        rc, err = simplan(capsys, "counterfactuals", "--inputs", path, "--out", tmp_path / "cf.jsonl")
        assert rc == 2 and f"{path}: empty" in err


def test_a_utf8_bom_is_not_part_of_line_one(tmp_path, capsys, trajectories):
    bom = tmp_path / "bom.jsonl"
    bom.write_bytes(codecs.BOM_UTF8 + trajectories.read_bytes())
    rc, err = simplan(capsys, "validate", bom)
    assert rc == 0, err


def test_bad_records_are_named_at_their_line(tmp_path, capsys, trajectories):
    first, second = trajectories.read_text().splitlines()
    record = json.loads(first)
    record["success"] = float("nan")
    cases = {
        "torn": (first[:40], "(json): not valid JSON (Unterminated string starting at column"),
        "nan": (json.dumps(record), "success: expected bool, got float"),
        "deep": ("[" * 50_000, "(json): not readable (nested deeper than 100 levels)"),
        "long_int": ("9" * 5000, "(json): not readable (an integer of more than 4300 digits)"),
    }
    for name, (line, words) in cases.items():
        path = tmp_path / f"{name}.jsonl"
        path.write_text(f"{second}\n{line}")  # a torn last line has no newline
        rc, err = simplan(capsys, "validate", path)
        assert rc == 1 and f"{path}:2: {words}" in err, (name, err)
        assert "at at" not in err


@pytest.fixture
def eval_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    """A finished toy eval run folder (one reactive episode per task, random engine)."""
    out = tmp_path / "ev"
    flags = ["--suite", "toy-dev", "--engine", "random", "--arms", "reactive", "--episodes", "1"]
    assert simplan(capsys, "eval", *flags, "--out", out)[0] == 0
    return out


def test_traces_with_a_bad_line_writes_the_good_episodes_and_says_so(tmp_path, capsys, eval_run):
    traces = eval_run / "traces.jsonl"
    with traces.open("a") as f:
        f.write("[" * 20_000 + "\n")
    out = tmp_path / "harvested.jsonl"
    rc, err = simplan(capsys, "traces", "--runs", eval_run, "--out", out)
    assert rc == 1 and "1 line(s) could not be read" in err, err
    assert out.exists() and len(out.read_text().splitlines()) >= 1  # every good episode written


def test_traces_on_a_file_that_holds_no_trace_events(tmp_path, capsys, eval_run, trajectories):
    traces = eval_run / "traces.jsonl"
    traces.write_text(trajectories.read_text())  # trajectories where trace events belong
    rc, err = simplan(capsys, "traces", "--runs", eval_run, "--out", tmp_path / "h.jsonl")
    assert rc == 2 and f"{traces}: not a trace file of `simplan eval`" in err, err
    traces.write_text("")
    rc, err = simplan(capsys, "traces", "--runs", eval_run, "--out", tmp_path / "h.jsonl")
    assert rc == 2 and f"{traces}: empty (no line to read)" in err, err


@pytest.mark.parametrize(
    "adapters, words",
    [
        ("decider", "adapter(s) decider need a folder: give name=DIR"),
        ("decider=missing-folder", "adapters: decider=missing-folder: no such folder"),
        ("decider={tmp}", "holds no adapter_config.json; give the adapter folder `simplan train` wrote"),
    ],
)
def test_an_adapter_that_is_no_adapter_folder_is_named_before_the_model_loads(adapters, words, tmp_path, capsys):
    engine = ["--engine", "hf", "--model", tmp_path / "no-such-model", "--merge-adapters", "false"]
    rc, err = simplan(
        capsys,
        "eval",
        "--suite",
        "toy-dev",
        *engine,
        "--adapters",
        adapters.format(tmp=tmp_path),
        "--out",
        tmp_path / "e",
    )
    assert rc == 2 and words in err and "failed:" not in err, err


def test_a_planner_section_that_is_not_a_mapping_names_the_section(tmp_path, capsys):
    rc, err = simplan(
        capsys, "eval", "--suite", "toy-dev", "--engine", "random", "--planner", "{budgets: [1]}", "--out", tmp_path
    )
    assert rc == 2 and "planner: budgets: expected a mapping of key: value, got list" in err, err


def test_env_kwargs_the_env_does_not_take_stop_counterfactuals_with_a_message(tmp_path, capsys, trajectories):
    out = tmp_path / "cf.jsonl"
    rc, err = simplan(
        capsys, "counterfactuals", "--inputs", trajectories, "--env_kwargs", "{no_such: 1}", "--out", out
    )
    assert rc == 2 and "cannot be made with no_such" in err and not out.exists(), err


# ------------------------------------------------------------------------------------------ the boundary
def test_an_unexpected_error_is_one_line_and_a_saved_traceback(tmp_path, capsys, monkeypatch):
    def main(argv: list[str]) -> int:
        raise RuntimeError("the disk controller caught fire\nsecond line")

    monkeypatch.setattr(cli.importlib, "import_module", lambda name: SimpleNamespace(main=main))
    monkeypatch.setattr(cli.tempfile, "tempdir", str(tmp_path))
    monkeypatch.delenv("SIMPLAN_DEBUG", raising=False)
    rc, err = simplan(capsys, "report", "x", "--out", "y")
    lines = err.strip().splitlines()
    assert rc == 1 and lines[0] == "simplan report: failed: RuntimeError: the disk controller caught fire"
    (saved,) = tmp_path.glob("simplan-report-*.traceback.txt")
    assert f"the traceback is in {saved}" in lines[1] and "simplan --debug report" in lines[1]
    assert "Traceback (most recent call last)" in saved.read_text() and "caught fire" in saved.read_text()
    try:
        rc = cli.main(["--debug", "report", "x"])
    finally:
        err = capsys.readouterr().err
    assert rc == 1 and "Traceback (most recent call last)" in err and "RuntimeError" in err


def test_a_plain_value_error_inside_the_work_is_a_failure_not_a_usage_error(tmp_path, capsys, monkeypatch):
    """Only typed errors (core/errors.py) are the user's to fix: a ValueError from a bug in the library exits 1 with
    its traceback saved, as any other failure does, instead of being printed as if the user had erred."""
    import simplan.scripts.report as report_script

    def broken(*args, **kwargs):
        raise ValueError("a bug: bins must increase")

    monkeypatch.setattr(report_script, "write_report", broken)
    monkeypatch.setattr(cli.tempfile, "tempdir", str(tmp_path))
    monkeypatch.delenv("SIMPLAN_DEBUG", raising=False)
    rc, err = simplan(capsys, "report", tmp_path / "run", "--out", tmp_path / "out")
    assert rc == 1 and "failed: ValueError: a bug" in err and "the traceback is in" in err


SCRIPTS = Path(cli.__file__).parent


def test_scripts_leave_errors_to_the_one_boundary():
    """No script catches an error to print it and return a status itself (a copy of scripts/cli.py's boundary that
    drifts): `except` in a script only for what it does on the way out (eval's Ctrl-C note, envs list going on
    past a broken plugin, an optional import's fallback), never with `return 2`."""
    import ast

    offenders = []
    for path in sorted(SCRIPTS.glob("*.py")):
        if path.name in ("cli.py", "__init__.py"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ExceptHandler):
                caught = ast.unparse(node.type) if node.type is not None else "everything"
                returns_2 = any(
                    isinstance(n, ast.Return) and isinstance(n.value, ast.Constant) and n.value.value == 2
                    for n in ast.walk(node)
                )
                if returns_2 or any(w in caught for w in ("ValueError", "FileNotFoundError", "UsageError")):
                    offenders.append(f"{path.name}:{node.lineno} except {caught}")
    assert not offenders, offenders


def missing_input_commands(tmp: Path) -> list[tuple[str, list[str]]]:
    """(words the message must hold, argv) of each command given an input that does not exist."""
    gone = tmp / "gone"
    return [
        (f"{gone}.jsonl", ["validate", f"{gone}.jsonl"]),
        (f"{gone}.jsonl", ["import", f"{gone}.jsonl", "--out", tmp / "imported.jsonl"]),
        (f"{gone}.jsonl", ["build", "--role", "decider", "--inputs", f"{gone}.jsonl", "--out", tmp / "ds"]),
        (f"{gone}.jsonl", ["counterfactuals", "--inputs", f"{gone}.jsonl", "--out", tmp / "cf.jsonl"]),
        (str(gone), ["traces", "--runs", gone, "--out", tmp / "traces.jsonl"]),
        (str(gone), ["report", gone, "--out", tmp / "report"]),
        (str(gone), ["eval-model", "--role", "decider", "--dataset", gone, "--out", tmp / "em"]),
        ("nosuch-1", ["run", "--env", "toy", "--task", "nosuch-1", "--engine", "random", "--view", "none"]),
        (f"{gone}.yaml", ["eval", "--suite", f"{gone}.yaml", "--engine", "random", "--out", tmp / "ev"]),
    ]


@pytest.mark.parametrize("index", range(len(missing_input_commands(Path("/x")))))
def test_every_command_names_a_missing_input_with_status_2(index, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # `run` writes its default trace under runs/ of the working folder
    words, argv = missing_input_commands(tmp_path)[index]
    rc, err = simplan(capsys, *argv)
    assert rc == 2 and words in err and "failed:" not in err, err


def test_a_disk_that_fills_during_the_work_is_named_in_words(tmp_path, capsys, monkeypatch):
    def main(argv: list[str]) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "runs/eval/x/traces.jsonl")

    monkeypatch.setattr(cli.importlib, "import_module", lambda name: SimpleNamespace(main=main))
    monkeypatch.setattr(cli.tempfile, "tempdir", str(tmp_path))
    rc, err = simplan(capsys, "eval")
    assert rc == 1 and "simplan eval: failed: OSError: runs/eval/x/traces.jsonl: no space left on the device" in err


def test_ctrl_c_is_status_130_without_a_traceback(capsys, monkeypatch):
    def main(argv: list[str]) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(cli.importlib, "import_module", lambda name: SimpleNamespace(main=main))
    rc, err = simplan(capsys, "eval")
    assert rc == 130 and "simplan eval: interrupted" in err


def test_serve_warns_that_a_key_on_the_command_line_is_visible(capsys):
    rc, err = simplan(capsys, "serve", "--api-key", "sekrit", "--no-such-flag")
    assert rc == 2 and "visible to every account on this machine (`ps`)" in err and "SIMPLAN_API_KEY" in err


# ------------------------------------------------------------------------------------------ permissions
def test_atomic_writes_follow_the_umask(tmp_path):
    old = os.umask(0o022)
    try:
        io.write_text(tmp_path / "a.txt", "x")
        with io.atomic_dir(tmp_path / "adapter") as d:
            (d / "f").write_text("y")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "a.txt").stat().st_mode) == 0o644  # mkstemp alone makes 0600
    assert stat.S_IMODE((tmp_path / "adapter").stat().st_mode) == 0o755  # mkdtemp alone makes 0700
