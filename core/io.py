"""Atomic file writes, output paths checked before work starts, and JSONL reading with line numbers.

Every simplan writer goes through here so a crash never leaves a half-written file: content is
written to a temporary file in the same folder, flushed, fsynced and renamed over the target; the
file (or folder) then has the permissions the umask gives a new one (or those of the file it replaces).
Append-only logs (collection, evaluation results) use `append_jsonl`, which writes whole lines
with one `write` call and fsyncs, and readers skip a torn last line and report it.

`check_output_folder` / `check_output_file` are called by every command before anything expensive
loads (they create nothing): an --out that is a file, lies under a file, is read-only or on a full disk
is an `OutputPathError` naming it. Every JSON line read goes through `parse_json`, one guard for
validate, build, import and the logs: torn JSON, nesting deeper than MAX_JSON_DEPTH, an integer too
long to read and (for records) NaN are a reason, never an exception from deep inside;
`iter_jsonl_lines` refuses lines over MAX_LINE_BYTES without holding them and reads a UTF-8 BOM
before line 1 as nothing.
"""

from __future__ import annotations

import codecs
import errno
import json
import os
import shutil
import stat
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from simplan.core.errors import OutputPathError

MAX_JSON_DEPTH = 100  # trajectories and traces nest < 10 levels; deeper breaks recursive code downstream
MAX_LINE_BYTES = 256 * 2**20  # one record; a longer line is refused without being held in memory


def _umask() -> int:
    """The process umask, read without changing it where Linux reports it (a set-and-restore races threads)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _new_file_mode(path: Path) -> int:
    """The mode of the file `path` replaces, else what the umask gives a new file (mkstemp makes 0600)."""
    try:
        return stat.S_IMODE(path.stat().st_mode)
    except OSError:
        return 0o666 & ~_umask()


@contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "w", encoding: str | None = "utf-8") -> Iterator[IO]:
    """Open a temporary file next to `path`; on success rename it over `path`, on error remove it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, _new_file_mode(path))
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
        os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp makes 0700: a served adapter folder others could not read
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


def iter_jsonl_lines(path: str | os.PathLike, max_line_bytes: int = MAX_LINE_BYTES) -> Iterator[JsonlLine]:
    """Every non-empty line of `path`, decoded one at a time, so a bad byte spoils only its own line.

    A UTF-8 byte order mark before line 1 (editors on Windows write one) is not part of its text. A line
    longer than `max_line_bytes` is skipped without being held in memory and comes back with `text` None
    and a `problem` (its `raw` is empty: such a line cannot be kept aside)."""
    with open(path, "rb") as f:
        lineno = 0
        while raw := f.readline(max_line_bytes + 1):
            lineno += 1
            if len(raw) > max_line_bytes and not raw.endswith(b"\n"):
                size = len(raw) + _skip_line(f)
                problem = f"a line of {size:,} bytes, over the {max_line_bytes:,} one record may have"
                yield JsonlLine(lineno, b"", None, problem)
                continue
            body = raw[len(codecs.BOM_UTF8) :] if lineno == 1 and raw.startswith(codecs.BOM_UTF8) else raw
            if not body.strip():
                continue
            try:
                yield JsonlLine(lineno, raw, body.decode("utf-8"))
            except UnicodeDecodeError as e:
                problem = f"not UTF-8 at byte {e.start + 1} (0x{body[e.start]:02x}); save the file as UTF-8"
                yield JsonlLine(lineno, raw, None, problem)


def _skip_line(f: IO[bytes]) -> int:
    """Read past the rest of the current line in chunks; the bytes skipped."""
    skipped = 0
    while chunk := f.readline(1 << 20):
        skipped += len(chunk)
        if chunk.endswith(b"\n"):
            break
    return skipped


def has_lines(path: str | os.PathLike) -> bool:
    """Whether `path` holds a non-blank line (an empty or blank-only input is an error, not zero records)."""
    return next(iter_jsonl_lines(path), None) is not None


def iter_jsonl(path: str | os.PathLike) -> Iterator[tuple[int, str]]:
    """Yield (line number, raw line) for every non-empty line; line numbers start at 1.

    A line that is not UTF-8 raises `JsonlLineError` naming FILE:LINE; readers that go on past bad
    lines (`read_jsonl_tolerant`, `simplan validate`, `simplan build`) use `iter_jsonl_lines`.
    """
    for line in iter_jsonl_lines(path):
        if line.text is None:
            raise JsonlLineError(f"{path}:{line.lineno}: {line.problem}")
        yield line.lineno, line.text


class JsonProblem(ValueError):
    """Text that is not one readable JSON value; the message is the reason (callers prefix FILE:LINE or a field)."""


def _refuse_constant(name: str) -> Any:
    raise JsonProblem(f"{name} is not a JSON number; write null or a number")


def json_error_text(e: json.JSONDecodeError, unit: str = "column") -> str:
    """`e` in words: "Unterminated string starting at column 5" (json's own message ends in "at" for some)."""
    where = e.colno if unit == "column" else e.pos + 1
    return f"{e.msg.removesuffix(' at')} at {unit} {where}"


def parse_json(text: str, allow_nan: bool = True, max_depth: int = MAX_JSON_DEPTH, unit: str = "column") -> Any:
    """The JSON value `text` holds, or `JsonProblem` saying why not: the one guard every JSON line passes.

    Refused: torn or invalid JSON (the position in `unit`s: "column" of a line, "character" of an embedded
    string), nesting deeper than `max_depth` (however deep: json's own RecursionError is caught), an integer
    longer than Python reads (4300 digits), and with `allow_nan` False NaN and Infinity (records: a NaN
    `success` would read as false)."""
    try:
        value = json.loads(text, parse_constant=None if allow_nan else _refuse_constant)
    except json.JSONDecodeError as e:
        raise JsonProblem(f"not valid JSON ({json_error_text(e, unit)})") from None
    except RecursionError:
        raise JsonProblem(f"not readable (nested deeper than {max_depth} levels)") from None
    except JsonProblem:
        raise
    except ValueError as e:  # int("9" * 5000): Python refuses integers past sys.get_int_max_str_digits()
        if "integer string conversion" in str(e):
            digits = sys.get_int_max_str_digits()
            raise JsonProblem(f"not readable (an integer of more than {digits} digits)") from None
        raise JsonProblem(f"not readable ({str(e)[:120]})") from None
    if _deeper_than(value, max_depth, text):
        raise JsonProblem(f"not readable (nested deeper than {max_depth} levels)")
    return value


def _deeper_than(value: Any, limit: int, text: str) -> bool:
    """Whether `value` nests more than `limit` containers deep (iteratively; skipped when the text is too
    short in brackets to be that deep)."""
    if text.count("[") + text.count("{") <= limit:
        return False
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            return True
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else ()
        stack.extend((c, depth + 1) for c in children if isinstance(c, (dict, list)))
    return False


class LineProblem(str):
    """A 'FILE:LINE: why' of `read_jsonl_tolerant`; `torn` when it is the unfinished last line a stopped writer
    leaves (no newline after it), which readers of their own logs expect, unlike a bad line among good ones."""

    torn: bool = False

    @classmethod
    def at(cls, where: str, why: str, torn: bool = False) -> LineProblem:
        problem = cls(f"{where}: {why}")
        problem.torn = torn
        return problem


def read_jsonl_tolerant(
    path: str | os.PathLike, check: Callable[[dict[str, Any]], str | None] | None = None
) -> tuple[list[dict[str, Any]], list[LineProblem]]:
    """Read a JSONL log written by `append_jsonl`: returns (records, problems as 'FILE:LINE: why').

    A crashed writer can leave one torn last line, and a damaged file a line of bad bytes or of
    something other than a JSON object: each is reported and skipped, the other lines still read.
    `check(record)` may name why a JSON object is not a record of this log (a trajectory among trace
    events): it is reported and skipped as well.
    """
    records: list[dict[str, Any]] = []
    problems: list[LineProblem] = []
    if not Path(path).exists():
        return records, problems
    for line in iter_jsonl_lines(path):
        where = f"{path}:{line.lineno}"
        if line.text is None:
            problems.append(LineProblem.at(where, str(line.problem)))
            continue
        try:
            record = parse_json(line.text)
        except JsonProblem as e:
            problems.append(LineProblem.at(where, str(e), torn=not line.raw.endswith(b"\n")))
            continue
        why = (check(record) if check else None) if isinstance(record, dict) else None
        if not isinstance(record, dict):
            problems.append(LineProblem.at(where, f"expected a JSON object, got {type(record).__name__}"))
        elif why:
            problems.append(LineProblem.at(where, why))
        else:
            records.append(record)
    return records, problems


# ---------------------------------------------------------------------------------------------
# Output paths, checked before any work
# ---------------------------------------------------------------------------------------------
OS_ERROR_WORDS = {
    errno.ENOSPC: "no space left on the device",
    errno.EDQUOT: "the disk quota is used up",
    errno.EROFS: "a read-only file system",
    errno.EACCES: "permission denied",
    errno.EPERM: "permission denied",
    errno.ENOTDIR: "a part of the path is a file, not a folder",
    errno.EISDIR: "it is a folder",
    errno.EEXIST: "it exists already",
    errno.ENAMETOOLONG: "the name is too long",
}


def describe_os_error(e: OSError) -> str:
    """`e` as words a user acts on ("no space left on the device"), without errno numbers."""
    return OS_ERROR_WORDS.get(e.errno, e.strerror or type(e).__name__)  # type: ignore[arg-type]


def _nearest_existing(path: Path) -> Path:
    """`path` itself or its closest ancestor that exists."""
    return next((p for p in [path, *path.parents] if p.exists()), Path("."))


def check_output_folder(path: str | os.PathLike, what: str = "--out") -> Path:
    """`path` as a folder this process can write into, checked before any work starts; nothing is created.

    Raises `OutputPathError` naming `what` and the path when it is a file, lies under a file, or the folder (or
    the closest existing one above it, where it would be made) is read-only or has no space left: a small file
    is written there, flushed to disk and removed."""
    path = Path(path).expanduser()
    _check_folder(path, f"{what} {path}", is_target=True)
    return path


def check_output_file(path: str | os.PathLike, what: str = "--out") -> Path:
    """`path` as a file this process can write (its folder checked as `check_output_folder` does)."""
    path = Path(path).expanduser()
    if path.is_dir():
        raise OutputPathError(f"{what} {path}: is a folder; give a file path (e.g. {path / 'out.jsonl'})")
    _check_folder(path.parent, f"{what} {path}", is_target=False)
    return path


def _check_folder(folder: Path, label: str, is_target: bool) -> None:
    existing = _nearest_existing(folder)
    if not existing.is_dir():
        if is_target and existing == folder:
            raise OutputPathError(f"{label}: is a file, not a folder; give a folder path (or move the file)")
        raise OutputPathError(f"{label}: {existing} is a file, so no folder can be made under it; give another path")
    try:
        fd, probe = tempfile.mkstemp(prefix=".simplan-write-check.", dir=existing)
        try:
            os.write(fd, b"\0" * 4096)
            os.fsync(fd)
        finally:
            os.close(fd)
            os.unlink(probe)
    except OSError as e:
        where = "" if existing == folder else f" (checked in {existing}, where it would be made)"
        raise OutputPathError(
            f"{label}: cannot be written{where}: {describe_os_error(e)}; give a writable path"
        ) from None
