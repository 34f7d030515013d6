"""`simplan validate`: FILE:LINE problems, non-zero exit, duplicate ids, keep-going split."""

from __future__ import annotations

import json

import pytest

from simplan.data.collect import CollectConfig, collect
from simplan.data.validate import validate_file, validate_files
from simplan.scripts import validate as validate_script


@pytest.fixture
def good_file(tmp_path):
    path = tmp_path / "toy.jsonl"
    collect(CollectConfig(env="toy", limit=5, policies=["expert", "noisy_expert"], out=str(path), progress=False))
    return path


def _corrupt(path, lineno, fn):
    lines = path.read_text().splitlines(keepends=True)
    lines[lineno - 1] = fn(lines[lineno - 1])
    path.write_text("".join(lines))


def _set(field_path, value):
    def fn(line):
        rec = json.loads(line)
        obj = rec
        for key in field_path[:-1]:
            obj = obj[key]
        obj[field_path[-1]] = value
        return json.dumps(rec) + "\n"

    return fn


def test_good_file_passes(good_file, capsys):
    report = validate_file(good_file)
    assert report.ok and report.lines == report.good == 10
    assert validate_script.main([str(good_file)]) == 0
    assert "OK: 10 lines" in capsys.readouterr().out


def test_corrupted_lines_are_named_and_exit_non_zero(good_file, capsys):
    _corrupt(good_file, 3, lambda line: line[: len(line) // 2] + "\n")  # torn JSON
    _corrupt(good_file, 5, _set(["steps", 1, "source"], "oracle"))
    _corrupt(good_file, 7, _set(["task", "fold"], "validation"))
    report = validate_file(good_file)
    assert not report.ok and report.bad_lines == [f"{good_file}:{n}" for n in (3, 5, 7)]
    assert report.problems[0].startswith(f"{good_file}:3: (json): not valid JSON")
    assert report.problems[1].startswith(f"{good_file}:5: steps[1].source: 'oracle' is not one of")
    assert report.problems[2].startswith(f"{good_file}:7: task.fold: 'validation'")
    assert validate_script.main([str(good_file)]) == 1
    err = capsys.readouterr().err
    assert f"{good_file}:5: steps[1].source" in err and "INVALID: 10 lines" in err


def test_duplicate_ids_within_and_across_files(good_file, tmp_path):
    lines = good_file.read_text().splitlines(keepends=True)
    other = tmp_path / "other.jsonl"
    other.write_text(lines[0])
    good_file.write_text("".join(lines) + lines[1])
    report = validate_files([good_file, other])
    assert report.bad_lines == [f"{good_file}:11", f"{other}:1"]
    assert "duplicate episode id" in report.problems[0] and f"first at {good_file}:2" in report.problems[0]


def test_keep_going_splits_good_and_bad_losing_nothing(good_file, tmp_path):
    original = good_file.read_text().splitlines(keepends=True)
    _corrupt(good_file, 2, _set(["success"], "yes"))
    _corrupt(good_file, 9, lambda line: "{not json\n")
    corrupted = good_file.read_text().splitlines(keepends=True)
    out, rejects = tmp_path / "good.jsonl", tmp_path / "bad.jsonl"
    code = validate_script.main([str(good_file), "--keep-going", "--out", str(out), "--rejects", str(rejects)])
    assert code == 1  # still non-zero: the input had bad lines
    good_lines, bad_lines = out.read_text().splitlines(keepends=True), rejects.read_text().splitlines(keepends=True)
    assert good_lines == [line for i, line in enumerate(original) if i not in (1, 8)]
    assert bad_lines == [corrupted[1], corrupted[8]]
    assert validate_file(out).ok
    # Defaults next to the input; --out without --keep-going is a usage error.
    report = validate_file(good_file, keep_going=True)
    assert report.out_path.endswith("toy.good.jsonl") and report.rejects_path.endswith("toy.rejects.jsonl")
    with pytest.raises(SystemExit):
        validate_script.main([str(good_file), "--out", str(out)])


def test_missing_file_is_a_usage_error(tmp_path, capsys):
    assert validate_script.main([str(tmp_path / "nope.jsonl")]) == 2
    assert "no such file" in capsys.readouterr().err
