"""Check trajectory JSONL files line by line against the schema (`data/trajectory.py`).

    simplan validate runs/data/twx-train.jsonl
    simplan validate a.jsonl b.jsonl --keep-going --out good.jsonl --rejects bad.jsonl

    from simplan.data.validate import validate_file
    report = validate_file("runs/data/twx-train.jsonl")
    print(report.summary()); assert report.ok

Every non-empty line is parsed and checked with `validate_record`; each problem is reported as
`FILE:LINE: field: problem`. An episode id seen before (in any of the files) is a problem of the
later line. With `keep_going`, good lines are written on unchanged to the output file and bad
lines, also unchanged, to the rejects file (both written atomically), so nothing is lost: fix the
rejects and validate them again.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from simplan.data.io import atomic_open, iter_jsonl
from simplan.data.trajectory import validate_record


@dataclass
class ValidationReport:
    paths: list[str]
    lines: int = 0
    good: int = 0
    bad_lines: list[str] = field(default_factory=list)  # "FILE:LINE" of each bad line
    problems: list[str] = field(default_factory=list)  # "FILE:LINE: field: problem"
    out_path: str | None = None
    rejects_path: str | None = None

    @property
    def bad(self) -> int:
        return len(self.bad_lines)

    @property
    def ok(self) -> bool:
        return self.bad == 0

    def summary(self, max_problems: int = 50) -> str:
        lines = self.problems[:max_problems]
        if len(self.problems) > max_problems:
            lines.append(f"... and {len(self.problems) - max_problems} more problems")
        verdict = "OK" if self.ok else "INVALID"
        lines.append(f"{verdict}: {self.lines} lines in {len(self.paths)} file(s), {self.good} good, {self.bad} bad")
        if self.out_path:
            lines.append(f"good lines -> {self.out_path}")
        if self.rejects_path:
            lines.append(f"bad lines -> {self.rejects_path}")
        return "\n".join(lines)


def line_problems(line: str) -> tuple[list[str], str | None]:
    """(problems as 'field: problem', the record's id or None) for one raw JSONL line."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError as e:
        return [f"(json): not valid JSON ({e.msg} at column {e.colno})"], None
    record_id = record.get("id") if isinstance(record, dict) and isinstance(record.get("id"), str) else None
    return validate_record(record), record_id


def default_outputs(path: str | os.PathLike) -> tuple[Path, Path]:
    """`X.jsonl` -> (`X.good.jsonl`, `X.rejects.jsonl`) next to it."""
    p = Path(path)
    stem = p.name[: -len(".jsonl")] if p.name.endswith(".jsonl") else p.name
    return p.with_name(f"{stem}.good.jsonl"), p.with_name(f"{stem}.rejects.jsonl")


def validate_files(
    paths: Sequence[str | os.PathLike],
    out_path: str | os.PathLike | None = None,
    rejects_path: str | os.PathLike | None = None,
    keep_going: bool = False,
) -> ValidationReport:
    """Validate every line of `paths`; with `keep_going` split them into good (out) and bad (rejects).

    Without `keep_going` nothing is written; all problems are still reported.
    """
    missing = [str(p) for p in paths if not Path(p).is_file()]
    if missing:
        raise FileNotFoundError(f"no such file: {', '.join(missing)}")
    if keep_going:
        default_out, default_rejects = default_outputs(paths[0])
        out_path, rejects_path = Path(out_path or default_out), Path(rejects_path or default_rejects)
        if out_path == rejects_path:
            raise ValueError(f"--out and --rejects are the same file ({out_path}); give two paths")
    report = ValidationReport(paths=[str(p) for p in paths])
    seen: dict[str, str] = {}  # id -> FILE:LINE of first occurrence
    good_lines: list[str] = []
    bad_lines: list[str] = []
    for path in paths:
        for lineno, raw in iter_jsonl(path):
            report.lines += 1
            where = f"{path}:{lineno}"
            problems, record_id = line_problems(raw)
            if record_id is not None:
                if record_id in seen:
                    problems.append(f"id: duplicate episode id {record_id!r} (first at {seen[record_id]})")
                else:
                    seen[record_id] = where
            line = raw if raw.endswith("\n") else raw + "\n"
            if problems:
                report.bad_lines.append(where)
                report.problems += [f"{where}: {p}" for p in problems]
                bad_lines.append(line)
            else:
                report.good += 1
                good_lines.append(line)
    if keep_going:
        # Both files are complete before either replaces its target (inputs may be overwritten).
        with atomic_open(out_path) as good_f, atomic_open(rejects_path) as bad_f:
            good_f.writelines(good_lines)
            bad_f.writelines(bad_lines)
        report.out_path, report.rejects_path = str(out_path), str(rejects_path)
    return report


def validate_file(
    path: str | os.PathLike,
    rejects_path: str | os.PathLike | None = None,
    keep_going: bool = False,
    out_path: str | os.PathLike | None = None,
) -> ValidationReport:
    """Validate one file (see `validate_files`)."""
    return validate_files([path], out_path=out_path, rejects_path=rejects_path, keep_going=keep_going)
