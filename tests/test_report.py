"""The report renders Markdown + self-contained HTML whose numbers are those of the traces."""

from __future__ import annotations

import base64
import re

import pytest
from test_metrics import traces  # pytest puts tests/ on sys.path (rootdir-relative imports)

from simplan.inference.metrics import aggregate, load_run
from simplan.inference.report import pct, write_report
from simplan.inference.trace import append_trace
from simplan.scripts.report import main as report_main


@pytest.fixture
def run_dir(tmp_path):
    run = tmp_path / "runA"
    for t in traces():
        append_trace(run / "traces.jsonl", t)
    return run


def test_report_renders_numbers_from_traces(run_dir, tmp_path) -> None:
    paths = write_report([run_dir], tmp_path / "report")
    md = paths["md"].read_text()
    html = paths["html"].read_text()
    metrics = {m.arm: m for m in aggregate(load_run(run_dir))}
    # reactive 1/2 with its Wilson interval, simplan 2/2; sim accuracy 2/3; tokens per episode
    assert "50.0% [9.5%, 90.5%] (1/2)" in md
    assert f"{pct(metrics['simplan'].success_rate)} [" in md and "(2/2)" in md
    assert "66.7% (2/3)" in md
    assert "220" in md  # reactive tokens/ep: (330 + 110) / 2
    assert "expectation_mismatch" in md and "error_observation" in md
    assert str(run_dir / "traces.jsonl") in md  # the source file is named
    for p in paths["plots"]:
        assert p.exists() and p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"plots/{p.name}" in md
    # self-contained HTML: the same tables, plots embedded, no external references
    assert "50.0% [9.5%, 90.5%] (1/2)" in html
    imgs = re.findall(r"src='data:image/png;base64,([A-Za-z0-9+/=]+)'", html)
    assert len(imgs) == 3 and all(base64.b64decode(i)[:4] == b"\x89PNG" for i in imgs)
    assert "src='plots/" not in html and "http" not in html.replace("http-equiv", "")


def test_report_compares_runs_side_by_side(run_dir, tmp_path, capsys) -> None:
    other = tmp_path / "sub" / "runA"  # same folder name: disambiguated
    for t in traces()[:2]:
        append_trace(other / "traces.jsonl", t)
    assert report_main([str(run_dir), str(other), "--out", str(tmp_path / "cmp")]) == 0
    md = (tmp_path / "cmp" / "report.md").read_text()
    assert "| runA | reactive |" in md and "| runA#2 | reactive |" in md
    assert "| runA#2 | simplan |" not in md
    assert "report.html" in capsys.readouterr().out


def test_report_refuses_empty_runs(tmp_path) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "traces.jsonl").write_text("")
    with pytest.raises(ValueError, match="no finished episode"):
        write_report([tmp_path / "empty"], tmp_path / "out")
    assert report_main([str(tmp_path / "missing"), "--out", str(tmp_path / "o")]) == 2
