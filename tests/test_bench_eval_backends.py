"""bench/bench_eval_backends.py on a tiny random model: the hf configs (multi-LoRA and merged) run both arms on the toy
suite and write rows whose numbers are those of each eval folder's traces. vLLM is left to the real benchmark."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from simplan.evaluation.metrics import aggregate, load_run

BENCH = Path(__file__).resolve().parents[1] / "bench"


@pytest.fixture(scope="module")
def tiny_adapters(tmp_path_factory) -> tuple[str, str]:
    """A tiny model and two random adapters trained on conversation prompts (so the hf prefix cache is used)."""
    from test_merged import SETTINGS, make_adapter  # pytest puts tests/ on sys.path (rootdir-relative imports)

    from simplan.models.tiny import tiny_model

    base = str(tiny_model("llama", final_norm=1.0))
    root = tmp_path_factory.mktemp("adapters")
    decider = make_adapter(base, root / "decider", seed=1, settings=SETTINGS)
    simulator = make_adapter(base, root / "simulator", seed=2, settings=SETTINGS)
    return base, f"decider={decider},simulator={simulator}"


def test_hf_configs_run_both_arms_and_report_trace_numbers(tiny_adapters, tmp_path, monkeypatch) -> None:
    monkeypatch.syspath_prepend(str(BENCH))
    monkeypatch.setenv("SIMPLAN_MERGE_CACHE", str(tmp_path / "merged"))  # a fresh merge cache: merge_s is measured
    import bench_eval_backends

    base, adapters = tiny_adapters
    out = tmp_path / "bench"
    argv = ["--model", base, "--adapters", adapters, "--configs", "hf-lora,hf-merged", "--suite", "toy-dev"]
    argv += ["--limit", "1", "--max-steps", "2", "--concurrency", "1", "--dtype", "float32", "--threads", "1"]
    argv += ["--planner", "{decider_max_tokens: 4, simulator_max_tokens: 4}"]
    assert bench_eval_backends.main(argv + ["--out", str(out)]) == 0

    data = json.loads((out / "bench_eval_backends.json").read_text())
    rows = {(r["config"], r["arm"]): r for r in data["rows"]}
    assert set(rows) == {(c, a) for c in ("hf-lora", "hf-merged") for a in ("reactive", "simplan")}
    assert len(data["config"]["load_before"]) == 3 and len(data["config"]["load_after"]) == 3
    for (config, arm), row in rows.items():
        (m,) = aggregate(load_run(out / config / arm))  # one arm per eval folder
        assert row["episodes"] == m.episodes == 1
        assert row["steps"] == m.real_steps and 0 < row["steps"] <= 2
        assert row["decisions"] == m.decisions >= 1
        seconds = json.loads((out / config / arm / "run.json").read_text())["seconds_total"]  # evaluate's wall
        assert row["episodes_per_hour"] == pytest.approx(3600 / seconds, rel=0.01)
        assert row["prompt_per_real_step"] == pytest.approx(m.prompt_per_real_step)
        assert row["prefilled_per_real_step"] <= row["prompt_per_real_step"]
        for unit in ("decision", "imagined_step", "real_step"):  # prefilled = context prefilled + candidates
            for kind in ("context_prefilled", "candidate_tokens"):
                assert row[f"{kind}_per_{unit}"] == getattr(m, f"{kind}_per_{unit}")
        split = row["context_prefilled_per_real_step"] + row["candidate_tokens_per_real_step"]
        assert split == pytest.approx(row["prefilled_per_real_step"]) and row["uncounted_candidates"] == 0
        assert row["merge_s"] == 0.0 if config == "hf-lora" else row["merge_s"] > 0.0
    reactive = rows[("hf-lora", "reactive")]
    assert reactive["prompt_per_decision"] > 0 and reactive["imagined_steps"] == 0
    assert reactive["candidate_tokens_per_decision"] > 0  # the decider scored the toy's valid actions
    if reactive["decisions"] > 1:  # later decisions reuse the episode's prefix (hf prefix cache)
        assert reactive["prompt_cache_share"] > 0
    md = (out / "bench_eval_backends.md").read_text()
    assert md.startswith("| config | arm | episodes |") and "| hf-merged | simplan | 1 |" in md
    assert "| per decision: context prefilled / candidates |" in md
    assert "load average" in md
