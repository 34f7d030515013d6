"""The runs a report shows: each run's trace files (size, lines, SHA-256), episode records and metrics.

    from simplan.evaluation.report_data import load_run_data
    run = load_run_data("runs/eval/twx-dev")     # RunData: .files, .records, .arms (GroupMetrics per arm), ...
    print([(m.arm, m.success_rate) for m in run.arms])

Every metric comes from the run's traces.jsonl (evaluation/metrics.py); the files are named with their
size and SHA-256 so each number of a report traces back to them. eval_config.json and run.json, when the
folder has them, ride along as `info` (the suite's name, the invocations).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from simplan.evaluation.metrics import EpisodeRecord, GroupMetrics, aggregate, load_run, trace_files


@dataclass
class RunData:
    name: str
    path: Path
    files: list[dict[str, Any]]  # path, bytes, lines, sha256
    records: list[EpisodeRecord]
    arms: list[GroupMetrics]
    families: list[GroupMetrics]
    info: dict[str, Any] = field(default_factory=dict)  # eval_config.json / run.json when present


def _file_info(path: Path) -> dict[str, Any]:
    h = hashlib.sha256()
    lines = 0
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
            lines += chunk.count(b"\n")
    return {"path": str(path), "bytes": path.stat().st_size, "lines": lines, "sha256": h.hexdigest()}


def load_run_data(run: str | Path, name: str | None = None) -> RunData:
    path = Path(run)
    files = trace_files(path)
    records = load_run(path)
    info: dict[str, Any] = {}
    folder = path if path.is_dir() else path.parent
    for fname in ("eval_config.json", "run.json"):
        if (folder / fname).exists():
            try:
                info[fname] = json.loads((folder / fname).read_text())
            except json.JSONDecodeError:
                pass
    return RunData(
        name=name or (path.name if path.is_dir() else path.stem),
        path=path,
        files=[_file_info(f) for f in files],
        records=records,
        arms=aggregate(records),
        families=aggregate(records, by_family=True),
        info=info,
    )
