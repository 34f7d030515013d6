"""Check trajectory JSONL files line by line against the schema (`data/trajectory.py`).

    simplan validate runs/data/twx-train.jsonl
    simplan validate a.jsonl b.jsonl --keep-going --out good.jsonl --rejects bad.jsonl

    from simplan.data.validate import validate_file
    report = validate_file("runs/data/twx-train.jsonl")
    print(report.summary()); assert report.ok

Every non-empty line is read on its own (bytes that are not UTF-8 spoil only their line), parsed
and checked with `validate_record`; each problem is reported as `FILE:LINE: field: problem`.
`read_trajectory_lines` does this for `simplan build` too, so both accept exactly the same lines.
An episode id seen on an earlier good line (in any of the files) is a problem of the later line,
which says whether its content is the same or different and where the first one is. With
`keep_going`, good lines are written on unchanged (byte for byte) to the output file and bad lines
to the rejects file (both written atomically), so nothing is lost: fix the rejects and validate
them again.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from simplan.core.errors import EmptyInputError, InputError, MissingInputError
from simplan.core.io import JsonProblem, atomic_open, has_lines, iter_jsonl_lines, parse_json
from simplan.data.trajectory import InvalidRecord, Trajectory


@dataclass
class TrajectoryLine:
    """One non-empty line of a trajectory file, checked: its trajectory, or the problems that stop it."""

    path: str
    lineno: int
    raw: bytes  # exactly as on disk, so a split into good and rejected lines loses nothing
    trajectory: Trajectory | None  # None when there are problems
    problems: list[str]  # "field: problem"; a duplicate id is not among them (see `duplicate_problem`)
    duplicate_of: str | None = None  # FILE:LINE of an earlier good line with the same id
    same_content: bool = False  # that earlier line holds the same record

    @property
    def where(self) -> str:
        return f"{self.path}:{self.lineno}"

    def duplicate_problem(self) -> str | None:
        """'id: ...' naming the earlier line when this line's id was seen before, else None."""
        if self.duplicate_of is None or self.trajectory is None:
            return None
        first = f"{self.trajectory.id!r} (first at {self.duplicate_of}"
        if self.same_content:
            return f"id: duplicate episode id {first}, the same record)"
        return f"id: duplicate episode id {first}) with different content; drop one line or give it a new id"


def parse_line(text: str) -> tuple[Trajectory | None, list[str], dict | None]:
    """(trajectory or None, problems as 'field: problem', the decoded record or None) for one line."""
    try:
        record = parse_json(text)  # NaN passes here so the schema names its field ("steps[0].score: nan ...")
    except JsonProblem as e:
        return None, [f"(json): {e}"], None
    try:
        return Trajectory.from_dict(record), [], record
    except InvalidRecord as e:
        return None, e.problems, record


# Meta keys that measure the run that collected a record, not what happened in it: the same expert episode
# collected twice differs in them, and is still the same record (build keeps one and counts the other).
RUN_MEASUREMENTS = ("elapsed_s",)


def _fingerprint(record: dict) -> bytes:
    """Equal for equal records however the JSON was spaced, its keys ordered or its collection timed."""
    meta = record.get("meta")
    if isinstance(meta, dict) and any(k in meta for k in RUN_MEASUREMENTS):
        record = {**record, "meta": {k: v for k, v in meta.items() if k not in RUN_MEASUREMENTS}}
    canonical = json.dumps(record, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.blake2b(canonical.encode("utf-8"), digest_size=16).digest()


def read_trajectory_lines(paths: Sequence[str | os.PathLike]) -> Iterator[TrajectoryLine]:
    """Every non-empty line of `paths` in order, checked; ids are compared across all the files.

    Only good lines claim an id, so a bad line never makes a later good line with its id a duplicate.
    """
    seen: dict[str, tuple[str, bytes]] = {}  # id -> (FILE:LINE of its first good line, fingerprint)
    for path in paths:
        for line in iter_jsonl_lines(path):
            if line.text is None:
                yield TrajectoryLine(str(path), line.lineno, line.raw, None, [f"(encoding): {line.problem}"])
                continue
            trajectory, problems, record = parse_line(line.text)
            checked = TrajectoryLine(str(path), line.lineno, line.raw, trajectory, problems)
            if trajectory is not None:
                fingerprint = _fingerprint(record)
                if trajectory.id in seen:
                    checked.duplicate_of, first_fingerprint = seen[trajectory.id]
                    checked.same_content = fingerprint == first_fingerprint
                else:
                    seen[trajectory.id] = (checked.where, fingerprint)
            yield checked


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
        raise MissingInputError(f"no such file: {', '.join(missing)}")
    empty = [str(p) for p in paths if not has_lines(p)]
    if empty:
        raise EmptyInputError(f"{', '.join(empty)}: empty (no line to read); give a file of trajectory JSONL lines")
    if keep_going:
        default_out, default_rejects = default_outputs(paths[0])
        out_path, rejects_path = Path(out_path or default_out), Path(rejects_path or default_rejects)
        if out_path == rejects_path:
            raise InputError(f"--out and --rejects are the same file ({out_path}); give two paths")
    report = ValidationReport(paths=[str(p) for p in paths])
    good_lines: list[bytes] = []
    bad_lines: list[bytes] = []
    for line in read_trajectory_lines(paths):
        report.lines += 1
        duplicate = line.duplicate_problem()
        problems = line.problems + ([duplicate] if duplicate else [])
        raw = line.raw if line.raw.endswith(b"\n") else line.raw + b"\n"
        if problems:
            report.bad_lines.append(line.where)
            report.problems += [f"{line.where}: {p}" for p in problems]
            bad_lines.append(raw)
        else:
            report.good += 1
            good_lines.append(raw)
    if keep_going:
        # Both files are complete before either replaces its target (inputs may be overwritten).
        with atomic_open(out_path, "wb") as good_f, atomic_open(rejects_path, "wb") as bad_f:
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
