"""The pipeline reuses finished stages, re-runs changed ones and what depends on them; toy-tiny end to end (slow)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from simplan.scripts import pipeline as pl

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def fake_stages(monkeypatch):
    """Every stage writes one output file and records that it ran; argv follows the config's dicts."""
    ran: list[str] = []

    def stage(self: pl.Pipeline, name: str) -> pl.Stage:
        out = self.out / f"{name}.out"
        idx = pl.STAGES.index(name)
        section = {"collect-train": self.cfg.collect_train, "eval": self.cfg.eval}.get(name, {})

        def run(argv: list[str]) -> int:
            ran.append(name)
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(" ".join(argv))
            return 0

        depends = [pl.STAGES[idx - 1]] if idx else []
        return pl.Stage(name, name, pl.flags(section), [out], run, depends, clear=[out])

    monkeypatch.setattr(pl.Pipeline, "stage", stage)
    monkeypatch.setattr(pl, "resolve_base_model", lambda name, fetch=True: "/fake/model")
    return ran


def test_stages_are_reused_and_changes_propagate(tmp_path, fake_stages) -> None:
    out = str(tmp_path / "p")
    assert pl.main(["--out", out]) == 0
    assert fake_stages == list(pl.STAGES)
    marker = json.loads((tmp_path / "p" / ".stages" / "eval.json").read_text())
    assert marker["stage"] == "eval" and len(marker["hash"]) == 16

    fake_stages.clear()
    assert pl.main(["--out", out]) == 0
    assert fake_stages == []  # everything complete: reused

    fake_stages.clear()
    assert pl.main(["--out", out, "--eval", "{episodes: 3}"]) == 0
    assert fake_stages == ["eval", "report"]  # eval changed, report depends on it

    fake_stages.clear()
    assert pl.main(["--out", out, "--eval", "{episodes: 3}", "--collect_train", "{limit: 2}"]) == 0
    assert fake_stages == list(pl.STAGES)  # a change upstream re-runs everything downstream

    fake_stages.clear()
    assert (
        pl.main(["--out", out, "--eval", "{episodes: 3}", "--collect_train", "{limit: 2}", "--force", "report"]) == 0
    )
    assert fake_stages == ["report"]


def test_missing_output_or_unselected_incomplete_stage(tmp_path, fake_stages, capsys) -> None:
    out = tmp_path / "p"
    assert pl.main(["--out", str(out), "--stages", "collect-train,collect-dev"]) == 0
    assert fake_stages == ["collect-train", "collect-dev"]
    # eval selected, but the stages before it never ran: refused with the command to run
    assert pl.main(["--out", str(out), "--stages", "eval"]) == 1
    assert "not complete" in capsys.readouterr().err
    (out / "collect-dev.out").unlink()  # an output deleted by hand: the stage is not complete any more
    fake_stages.clear()
    assert pl.main(["--out", str(out), "--stages", "collect-train,collect-dev"]) == 0
    assert fake_stages == ["collect-dev"]


def test_flags_and_config_validation() -> None:
    assert pl.flags({"a": [1, 2], "b": None, "c": True, "d": {"x": 1}}) == [
        "--a", "1,2", "--b", "none", "--c", "true", "--d", '{"x": 1}',
    ]  # fmt: skip
    with pytest.raises(ValueError, match="unknown stage"):
        pl.PipelineConfig(force=["trian"])
    with pytest.raises(ValueError, match="set by the pipeline"):
        pl.PipelineConfig(eval={"out": "x"})


def _stages_available() -> bool:
    return (
        importlib.util.find_spec("simplan.scripts.train") is not None
        and (REPO / "recipes/smollm2-135m-instruct/twx/decider.yaml").exists()
        and (REPO / "recipes/smollm2-135m-instruct/twx/simulator.yaml").exists()
    )


@pytest.mark.slow
@pytest.mark.skipif(not _stages_available(), reason="simplan train or its recipes are not there yet")
def test_toy_tiny_pipeline_end_to_end(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(REPO)
    out = tmp_path / "toy-tiny"
    argv = ["--config", "recipes/pipeline/toy-tiny.yaml", "--out", str(out)]
    assert pl.main(argv) == 0
    report = out / "report" / "report.md"
    assert report.exists() and (out / "report" / "report.html").exists()
    assert (out / "train" / "decider" / "adapter" / "adapter_config.json").exists()
    text = report.read_text()
    assert str(out / "eval" / "traces.jsonl") in text
    for arm in ("reactive", "plan", "simplan"):
        assert f"| {arm} |" in text
    lines = (out / "eval" / "results.jsonl").read_text().splitlines()
    assert len(lines) == 6  # 2 toy tasks x 3 arms
    # re-running reuses every stage
    before = {p.name: p.stat().st_mtime for p in (out / ".stages").glob("*.json")}
    assert pl.main(argv) == 0
    assert {p.name: p.stat().st_mtime for p in (out / ".stages").glob("*.json")} == before
