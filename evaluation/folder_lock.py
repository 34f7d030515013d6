"""One evaluation at a time per run folder: `out/eval.lock`, locked (flock) for the run's duration.

    from simplan.evaluation.folder_lock import FolderLockedError, check_unlocked, lock_folder
    check_unlocked(out)        # refuse at once, before minutes of engine loading
    with lock_folder(out):     # FolderLockedError (naming the pid, host and command that hold it) if busy
        ...

A second `simplan eval` on the same --out refuses at once. The OS drops the lock when its process dies,
so a crashed run never leaves a stale lock behind.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from simplan.core.errors import UsageError

LOCK = "eval.lock"


class FolderLockedError(UsageError, RuntimeError):
    """Another process is writing the run folder."""


@contextlib.contextmanager
def lock_folder(out: Path) -> Iterator[None]:
    """Hold `out/eval.lock` for the block; refuse at once (FolderLockedError) if another process holds it.

    An flock belongs to the open file, so the OS releases it when the process exits, however it
    dies: no stale lock to clean up by hand. The file keeps the holder's pid, host and start time
    for the message; it is never deleted (deleting would let a third run lock a fresh file while a
    second still holds the old one).
    """
    path = out / LOCK
    with open(path, "a+", encoding="utf-8") as f:  # "a+": opening must not erase the holder's note
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            raise FolderLockedError(_locked_message(out, f.read())) from None
        try:
            f.seek(0)
            f.truncate()
            holder = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.strftime("%Y-%m-%dT%H:%M:%S")}
            f.write(json.dumps({**holder, "command": " ".join(sys.argv)}) + "\n")
            f.flush()
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def check_unlocked(out: Path) -> None:
    """Raise FolderLockedError if a run holds `out` now (a quick check before loading an engine for minutes)."""
    if (out / LOCK).exists():
        with lock_folder(out):
            pass


def _locked_message(out: Path, note: str) -> str:
    try:
        holder = json.loads(note)
        who = f"pid {holder['pid']} on {holder['host']}, running since {holder['started']}: {holder['command']}"
    except (json.JSONDecodeError, KeyError, TypeError):
        who = "a process that has not written its details yet"
    return (
        f"{out} is in use by another evaluation ({who}); two runs on one folder would write every episode twice. "
        f"Wait for it to finish (the lock in {out / LOCK} is released when that process exits, even if it "
        "crashes), stop it, or use another --out"
    )
