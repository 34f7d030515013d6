"""`simplan validate`: FILE:LINE problems (bad bytes too), non-zero exit, duplicate ids, keep-going split."""

from __future__ import annotations

import json

import pytest

from simplan.core.io import JsonlLineError, iter_jsonl, read_jsonl_tolerant
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


def test_bad_bytes_spoil_only_their_line(good_file, capsys):
    lines = good_file.read_bytes().splitlines(keepends=True)
    at = lines[3].index(b'"goal"')
    lines[3] = lines[3][:at] + b"\xc3\x28" + lines[3][at:]  # a UTF-8 lead byte with no continuation
    good_file.write_bytes(b"".join(lines))
    assert validate_script.main([str(good_file)]) == 1
    err = capsys.readouterr().err
    assert f"{good_file}:4: (encoding): not UTF-8 at byte {at + 1} (0xc3)" in err
    assert "INVALID: 10 lines in 1 file(s), 9 good, 1 bad" in err
    # The shared readers go on past the line too; the strict one names it instead of a bare UnicodeDecodeError.
    records, problems = read_jsonl_tolerant(good_file)
    assert len(records) == 9 and problems == [
        f"{good_file}:4: not UTF-8 at byte {at + 1} (0xc3); save the file as UTF-8"
    ]
    with pytest.raises(JsonlLineError, match=rf"^{good_file}:4: not UTF-8"):
        list(iter_jsonl(good_file))


def test_same_id_with_different_content_names_both_lines(good_file):
    lines = good_file.read_text().splitlines(keepends=True)
    changed = {**json.loads(lines[0]), "final_score": 0.5}
    good_file.write_text("".join(lines) + json.dumps(changed) + "\n")
    report = validate_file(good_file)
    assert report.bad_lines == [f"{good_file}:11"]
    assert report.problems == [
        f"{good_file}:11: id: duplicate episode id {changed['id']!r} (first at {good_file}:1) with different "
        "content; drop one line or give it a new id"
    ]
