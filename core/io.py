"""Atomic file writes and JSONL reading with line numbers.

Every simplan writer goes through here so a crash never leaves a half-written file: content is
written to a temporary file in the same folder, flushed, fsynced and renamed over the target.
Append-only logs (collection, evaluation results) use `append_jsonl`, which writes whole lines
with one `write` call and fsyncs, and readers skip a torn last line and report it.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any


@contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "w", encoding: str | None = "utf-8") -> Iterator[IO]:
    """Open a temporary file next to `path`; on success rename it over `path`, on error remove it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, mode, encoding=None if "b" in mode else encoding) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


@contextmanager
def atomic_dir(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary folder next to `path`; on success it replaces `path`, on error it is removed.

    For outputs that are whole folders (converted models, adapters, saved datasets): readers see the
    old folder or the new one, never a half-written one.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        yield tmp
        if path.exists():
            old = path.with_name(f".{path.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(path, old)
            shutil.rmtree(old, ignore_errors=True)
        os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def write_text(path: str | os.PathLike, text: str) -> None:
    with atomic_open(path) as f:
        f.write(text)


def write_json(path: str | os.PathLike, obj: Any) -> None:
    with atomic_open(path) as f:
        json.dump(obj, f, indent=2, ensure_ascii=False, default=str)
        f.write("\n")


def json_line(record: dict[str, Any]) -> str:
    """One JSONL line. Text is kept readable (ensure_ascii=False) unless it holds a lone surrogate, which
    UTF-8 cannot encode: that record is written with \\u escapes, so no content can fail a write."""
    line = json.dumps(record, ensure_ascii=False)
    try:
        line.encode("utf-8")
    except UnicodeEncodeError:
        line = json.dumps(record, ensure_ascii=True)
    return line + "\n"


def write_jsonl(path: str | os.PathLike, records: Iterable[dict[str, Any]]) -> int:
    n = 0
    with atomic_open(path) as f:
        for rec in records:
            f.write(json_line(rec))
            n += 1
    return n


def append_jsonl(path: str | os.PathLike, records: Iterable[dict[str, Any]]) -> None:
    """Append whole lines durably (one write per call), for logs that a resumed run extends."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = "".join(json_line(r) for r in records)
    if not payload:
        return
    with open(path, "a", encoding="utf-8") as f:
        f.write(payload)
        f.flush()
        os.fsync(f.fileno())


class JsonlLineError(ValueError):
    """A line of a JSONL file that cannot be read as text; the message names FILE:LINE and the byte."""


@dataclass(frozen=True)
class JsonlLine:
    """One non-empty line as read from disk: its bytes, and its text when the bytes are UTF-8."""

    lineno: int  # from 1
    raw: bytes  # exactly as on disk, newline included
    text: str | None  # None when the bytes are not UTF-8
    problem: str | None = None  # why `text` is None: "not UTF-8 at byte N (0xNN)"


def iter_jsonl_lines(path: str | os.PathLike) -> Iterator[JsonlLine]:
    """Every non-empty line of `path`, decoded one at a time, so a bad byte spoils only its own line."""
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, start=1):
            if not raw.strip():
                continue
            try:
                yield JsonlLine(lineno, raw, raw.decode("utf-8"))
            except UnicodeDecodeError as e:
                problem = f"not UTF-8 at byte {e.start + 1} (0x{raw[e.start]:02x}); save the file as UTF-8"
                yield JsonlLine(lineno, raw, None, problem)


def iter_jsonl(path: str | os.PathLike) -> Iterator[tuple[int, str]]:
    """Yield (line number, raw line) for every non-empty line; line numbers start at 1.

    A line that is not UTF-8 raises `JsonlLineError` naming FILE:LINE; readers that go on past bad
    lines (`read_jsonl_tolerant`, `simplan validate`, `simplan build`) use `iter_jsonl_lines`.
    """
    for line in iter_jsonl_lines(path):
        if line.text is None:
            raise JsonlLineError(f"{path}:{line.lineno}: {line.problem}")
        yield line.lineno, line.text


def read_jsonl_tolerant(path: str | os.PathLike) -> tuple[list[dict[str, Any]], list[str]]:
    """Read a JSONL log written by `append_jsonl`: returns (records, problems as 'FILE:LINE: why').

    A crashed writer can leave one torn last line, and a damaged file a line of bad bytes or of
    something other than a JSON object: each is reported and skipped, the other lines still read.
    """
    records, problems = [], []
    if not Path(path).exists():
        return records, problems
    for line in iter_jsonl_lines(path):
        where = f"{path}:{line.lineno}"
        if line.text is None:
            problems.append(f"{where}: {line.problem}")
            continue
        try:
            record = json.loads(line.text)
        except json.JSONDecodeError as e:
            problems.append(f"{where}: not valid JSON ({e.msg})")
            continue
        except (ValueError, RecursionError) as e:  # an integer too long to convert, nesting deeper than the stack
            problems.append(f"{where}: not readable ({type(e).__name__}: {str(e)[:120]})")
            continue
        if isinstance(record, dict):
            records.append(record)
        else:
            problems.append(f"{where}: expected a JSON object, got {type(record).__name__}")
    return records, problems
