"""Resuming an eval run folder: repair its logs and find the episodes already finished.

    from simplan.evaluation.resume import finished_traces, sync_results
    done, notes = finished_traces(out)     # {episode id: EpisodeTrace}: finished runs, errored ones set aside
    sync_results(out, done)                # results.jsonl gets the summary line of each one it lacks

The folder's logs are `TRACES` (every episode's events, inference/planning/trace.py) and `RESULTS` (one
`EpisodeSummary` line per finished episode, a convenience copy: the traces are the source of every metric).
A torn last line (a crashed writer) moves to `FILE.torn`; of traces.jsonl, the events of runs cut short move
to `traces.jsonl.partial`, a second finished run of an episode to `traces.jsonl.duplicate`, and errored runs
to `traces.jsonl.errored` with their result lines dropped, so those episodes run again
(evaluation/runner.py `evaluate` calls this before it runs anything).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from simplan.core.io import append_jsonl, read_jsonl_tolerant, write_jsonl
from simplan.inference.planning.trace import EpisodeTrace, episode_runs, summarize
from simplan.inference.planning.trace_events import TraceVersionError

TRACES = "traces.jsonl"
RESULTS = "results.jsonl"


def repair_tail(path: Path) -> str | None:
    """Move a torn last line (no trailing newline) to `path.torn`; returns a note when it did."""
    if not path.exists() or path.stat().st_size == 0:
        return None
    with open(path, "rb") as f:
        data = f.read()
    if data.endswith(b"\n"):
        return None
    cut = data.rfind(b"\n") + 1
    with open(path.with_name(path.name + ".torn"), "ab") as f:
        f.write(data[cut:] + b"\n")
    with open(path, "r+b") as f:
        f.truncate(cut)
    return f"{path}: torn last line ({len(data) - cut} bytes) moved to {path.name}.torn"


def finished_traces(out: Path) -> tuple[dict[str, EpisodeTrace], list[str]]:
    """Complete traces by episode id, after repairing the files; returns (traces, notes).

    traces.jsonl is left holding one finished run per episode (`episode_runs` picks it: the first
    finished one); the lines of unfinished runs move to traces.jsonl.partial, those of extra
    finished runs to traces.jsonl.duplicate, so no reader ever meets two runs of one episode, and
    those of errored runs to traces.jsonl.errored (with their result lines dropped): a crashed
    episode has no result, so it is not complete and runs again.
    """
    traces_path, notes = out / TRACES, []
    for p in (traces_path, out / RESULTS):
        note = repair_tail(p)
        if note:
            notes.append(note)
    if not traces_path.exists():
        return {}, notes
    records, problems = read_jsonl_tolerant(traces_path)
    notes.extend(problems)
    kept, left_out = episode_runs(records)
    complete = [run for run in kept if _finished(run) and not _errored(run)]
    errored = [run for run in kept if _errored(run)]
    moved = {
        ".partial": [r for run in [*kept, *left_out] if not _finished(run) for r in run],
        ".duplicate": [r for run in left_out if _finished(run) for r in run],
        ".errored": [r for run in errored for r in run],
    }
    if any(moved.values()):
        for suffix, lines in moved.items():
            append_jsonl(out / (TRACES + suffix), lines)
        write_jsonl(traces_path, [r for run in complete for r in run])
        _drop_results(out, {str(run[0].get("episode_id")) for run in errored})
        what = {
            ".partial": "unfinished episode runs",
            ".duplicate": "second finished runs of an episode",
            ".errored": "errored episode runs (they run again)",
        }
        notes.extend(
            f"{traces_path}: {len(lines)} event(s) of {what[suffix]} moved to {TRACES}{suffix}"
            for suffix, lines in moved.items()
            if lines
        )
    try:
        traces = [EpisodeTrace.from_dicts(run) for run in complete]
    except TraceVersionError as e:
        raise TraceVersionError(f"{traces_path}: {e}") from None
    return {t.episode_id: t for t in traces}, notes


def _finished(run: list[dict[str, Any]]) -> bool:
    return run[-1].get("type") == "end"


def _errored(run: list[dict[str, Any]]) -> bool:
    return _finished(run) and run[-1].get("status") == "errored"


def _drop_results(out: Path, episode_ids: set[str]) -> None:
    """Remove the result lines of `episode_ids` from results.jsonl (their episodes run again)."""
    path = out / RESULTS
    if not episode_ids or not path.exists():
        return
    records = read_jsonl_tolerant(path)[0]
    write_jsonl(path, [r for r in records if str(r.get("episode_id")) not in episode_ids])


def sync_results(out: Path, done: dict[str, EpisodeTrace]) -> int:
    """Append the summary of every finished trace missing from results.jsonl; returns how many."""
    have = {str(r.get("episode_id")) for r in read_jsonl_tolerant(out / RESULTS)[0]}
    missing = [summarize(t).to_dict() for eid, t in done.items() if eid not in have]
    append_jsonl(out / RESULTS, missing)
    return len(missing)
