"""A pipeline folder's stage markers: `out/.stages/STAGE.json` per finished stage, `STAGE.started` per start.

    markers = StageMarkers(Path("runs/pipeline/toy/.stages"))
    markers.read("eval")           # {"stage", "hash", "config", "command", "outputs", "seconds", ...} or None
    markers.start(stage, digest)   # a changed hash since the last start clears the stage's outputs first
    markers.write(stage, digest, seconds=12.3, model_path=None, peak_mb=812)

A stage that completes writes its marker atomically, with the hash of its configuration and of the stages
it depends on (workflows/pipeline.py decides from it whether the stage is complete); `STAGE.started`
holds the hash a stage last started with, so a stage whose configuration changed starts over from empty
outputs instead of resuming.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

from simplan.core.io import write_json
from simplan.workflows.pipeline_stages import Stage


class StageMarkers:
    """The markers in one folder (`out/.stages`)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def path(self, name: str) -> Path:
        return self.folder / f"{name}.json"

    def read(self, name: str) -> dict[str, Any] | None:
        try:
            return json.loads(self.path(name).read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return None

    def measured(self, names: tuple[str, ...]) -> dict[str, float]:
        """Seconds each stage took when it last completed in this folder (before this run changes any marker)."""
        out: dict[str, float] = {}
        for name in names:
            seconds = (self.read(name) or {}).get("seconds")
            if isinstance(seconds, int | float):
                out[name] = float(seconds)
        return out

    def write(
        self, st: Stage, digest: str, seconds: float | None, model_path: str | None, peak_mb: float | None = None
    ) -> None:
        record = {
            "stage": st.name,
            "hash": digest,
            "config": st.config,
            "command": st.command,
            "outputs": [str(p) for p in st.outputs],
            "model_path": model_path,
            "seconds": seconds,
            "peak_mb": None if peak_mb is None else round(peak_mb),
            "finished": time.strftime("%Y-%m-%dT%H:%M:%S"),
        }
        write_json(self.path(st.name), record)

    def mark_started(self, name: str, digest: str) -> None:
        (self.folder / f"{name}.started").write_text(digest + "\n")

    def start(self, st: Stage, digest: str, fresh: bool = False) -> None:
        """Record that the stage started; a configuration change since the last start, or `fresh` (--force), clears
        its outputs, so a forced eval runs its episodes again instead of resuming the finished ones."""
        started = self.folder / f"{st.name}.started"
        previous = started.read_text().strip() if started.exists() else None
        changed = previous is not None and previous != digest
        if changed or fresh:
            for p in st.clear:
                if p.is_dir():
                    shutil.rmtree(p)
                elif p.exists():
                    p.unlink()
            why = "forced (--force)" if fresh else "configuration changed since it last ran"
            print(f"pipeline: {st.name}: {why}; starting it over", flush=True)
        self.path(st.name).unlink(missing_ok=True)
        started.parent.mkdir(parents=True, exist_ok=True)
        started.write_text(digest + "\n")
