"""Collection with worker processes from a user script that has no `if __name__ == "__main__":` guard (issue 30).

    .venv/bin/pytest -q tests/test_collect_unguarded.py

Workers start with spawn, which by default runs the parent's main script again in each worker: an unguarded
script that collects at module level then started a pool inside every worker, and each died ("a worker
process died"). Each test writes such a script to tmp_path and runs it in a fresh interpreter.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

COLLECT = (
    "report = collect(CollectConfig(env={env!r}, fold='train', policies=['expert'], limit=2, workers=2, "
    "out={out!r}, progress=False))\n"
    "print(json.dumps({{'written': report.written, 'unfinished': report.unfinished, 'problems': report.problems}}))\n"
)


def _run(script: Path) -> tuple[subprocess.CompletedProcess[str], dict]:
    command = [sys.executable, str(script)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=script.parent)
    assert done.returncode == 0, done.stderr[-3000:]
    return done, json.loads(done.stdout.strip().splitlines()[-1])


def test_an_unguarded_script_collects_with_workers(tmp_path: Path) -> None:
    out = tmp_path / "toy.jsonl"
    script = tmp_path / "collect_at_module_level.py"
    script.write_text(
        "import json\nfrom simplan.data.collect import CollectConfig, collect\n"
        + COLLECT.format(env="toy", out=str(out))
    )
    done, report = _run(script)
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    assert report["problems"] == [] and report["unfinished"] == 0 and report["written"] > 0
    lines = out.read_text().splitlines()
    assert len(lines) == report["written"] and all(json.loads(line)["success"] for line in lines)


def test_a_factory_defined_in_an_unguarded_script_asks_for_the_guard(tmp_path: Path) -> None:
    """A worker must run the script to find a factory defined there: the script needs the guard, and is told so."""
    out = tmp_path / "mine.jsonl"
    script = tmp_path / "register_at_module_level.py"
    script.write_text(
        "import json\nfrom simplan.data.collect import CollectConfig, collect\nfrom simplan.envs.registry import "
        "register\nfrom simplan.envs.toy import ToyEnv\n\n\ndef make(**kwargs):\n    return ToyEnv(**kwargs)\n\n\n"
        "register('mytoy', make)\n" + COLLECT.format(env="mytoy", out=str(out))
    )
    _, report = _run(script)
    assert report["written"] == 0 and report["unfinished"] > 0
    (problem,) = report["problems"]
    assert problem.startswith("a worker process died (") and "add one); re-run the same command" in problem
    assert 'no `if __name__ == "__main__":` guard' in problem

    guarded = script.read_text().replace("register('mytoy'", "if __name__ == '__main__':\n    register('mytoy'")
    guarded = guarded.replace("\nreport = ", "\n    report = ").replace("\nprint(json", "\n    print(json")
    script.write_text(guarded)
    done, report = _run(script)  # the same script with the guard: the workers find `make`
    assert "Traceback" not in done.stderr and report["problems"] == [] and report["written"] > 0
