"""The report renders Markdown + self-contained HTML whose numbers are those of the traces."""

from __future__ import annotations

import base64
import json
import re

import pytest
from test_metrics import (  # pytest puts tests/ on sys.path (rootdir-relative imports)
    departure_traces,
    make_trace,
    shop_traces,
    traces,
)

from simplan.evaluation.metrics import aggregate, load_run
from simplan.evaluation.report import write_report
from simplan.evaluation.report_tables import pct
from simplan.inference.planning.trace import append_trace
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


def test_report_pairs_runs_arm_by_arm(tmp_path) -> None:
    # before: 4 tasks, reactive wins t0; after (another suite name, 3 of the tasks): reactive wins t0, t1, t2
    runs = {"before": ("twx-dev", [True, False, False, False]), "after": ("twx-dev-small", [True, True, True])}
    for name, (suite, wins) in runs.items():
        for i, won in enumerate(wins):
            trace = make_trace(f"{suite}/t{i}/reactive/0", "reactive", "coin", [{}], won, tokens=(90, 10))
            append_trace(tmp_path / name / "traces.jsonl", trace)
    md = write_report([tmp_path / "before", tmp_path / "after"], tmp_path / "report")["md"].read_text()
    table = md.split("### Paired differences between runs (same arm, same tasks)")[1].split("###")[0]
    row = next(line for line in table.splitlines() if line.startswith("| before -> after |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1:5] == ["reactive", "3 (1 unpaired left out)", "1 -> 3", "0 / 2"]
    assert cells[5].startswith("+66.7 [") and cells[6] == "0.5"
    one = write_report([tmp_path / "before"], tmp_path / "one")["md"].read_text()
    assert "between runs" not in one  # one run: nothing to pair


def test_report_refuses_empty_runs(tmp_path) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "traces.jsonl").write_text("")
    with pytest.raises(ValueError, match="no finished episode"):
        write_report([tmp_path / "empty"], tmp_path / "out")
    assert report_main([str(tmp_path / "missing"), "--out", str(tmp_path / "o")]) == 2


def test_report_pairs_arms_and_classifies_losses(tmp_path) -> None:
    # 10 tasks: simplan alone wins 8, reactive alone wins 2 -> difference +60 points, McNemar p = 0.109375
    # (2 * (C(10,0) + C(10,1) + C(10,2)) / 2^10); reactive's 8 losses end on a game-ending wrong action.
    run = tmp_path / "paired"
    for i in range(10):
        fam = "sorting" if i < 5 else "coin"
        reactive_wins = i < 2
        lost_act = [{}] if reactive_wins else [{"done": True, "score": -1.0}]
        for arm, won, acts in (("reactive", reactive_wins, lost_act), ("simplan", not reactive_wins, [{}, {}])):
            trace = make_trace(f"s/t{i}/{arm}/0", arm, fam, acts, won, tokens=(90, 10), wall=2.0)
            append_trace(run / "traces.jsonl", trace)
    md = write_report([run], tmp_path / "report")["md"].read_text()
    main = md.split("## Plots")[0]
    row = next(line for line in main.splitlines() if line.startswith("| paired | simplan - reactive |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[2:5] == ["10", "2 -> 8", "2 / 8"]
    assert cells[5].startswith("+60.0 [") and cells[6] == "0.109"
    low, high = (float(x) for x in cells[5].split("[")[1].rstrip("]").split(","))
    # A resample of the 10 pairs holds k ~ Binomial(10, 0.2) of reactive's wins and differs by 10 * (10 - 2k) points:
    # P[k >= 5] = 3.3% and P[k >= 6] = 0.6% put the 2.5% quantile at k = 5 (0 points); P[k = 0] = 10.7% puts the
    # 97.5% quantile at +100. The interval touches 0, as McNemar's p > 0.05 says.
    assert (low, high) == (0.0, 100.0)
    # final scores: 1 won, 0 lost here, so the sign test counts the same tasks as McNemar
    assert cells[7:9] == ["0.20 -> 0.80", "+0.60 [+0.00, +1.00]"]
    assert cells[9:11] == ["2 / 8", "0.109"]
    assert cells[11] == "500 -> 125" and cells[12] == "10.00 -> 2.50"  # 10 x 100 tokens / 2 wins, / 8 wins
    # per game breakdown (main section) and the loss table: 8 irreversible reactive losses, 2 simplan "other"
    assert "| sorting | 40.0% (2/5) | 60.0% (3/5) |" in main and "| coin | 0.0% (0/5) | 100.0% (5/5) |" in main
    header = next(line for line in main.splitlines() if line.startswith("| run | arm | lost |"))
    assert "irreversible wrong action" in header and "loop / no progress" in header
    assert "| paired | reactive | 8/10 | 8 | 0 | 0 | 0 | 0 | 0 | 0 |" in main
    assert "| paired | simplan | 2/10 | 0 | 0 | 0 | 0 | 0 | 0 | 2 |" in main
    # each lost episode is listed with its evidence in the details
    listed = "| paired | reactive | coin | s/t9/reactive/0 | irreversible wrong action | step 1 'look' ended the game"
    assert listed in md.split("## Details")[1]
    # The report opens with the paired difference (before any table), then per game, then the loss classes.
    lead = md.split("###")[0]
    assert "paired: **simplan - reactive = +60.0 points** [+0.0, +100.0]" in lead
    assert "on 10 paired tasks: 8/10 against 2/10; won by simplan only 8, by reactive only 2" in lead
    assert "exact McNemar p = 0.109" in lead
    assert (
        "Mean final score 0.20 -> 0.80 (+0.60 [+0.00, +1.00]): higher for simplan on 8 tasks, for reactive on 2"
        in lead
    )
    order = [main.index(t) for t in ("### Paired differences", "| sorting |", "### Lost episodes", "### Arms")]
    assert order == sorted(order)


def test_report_leads_with_what_imagination_adds_to_the_pivots(tmp_path) -> None:
    # 4 tasks: reactive wins 1, reactive-pivots 3, simplan 3 (the same ones), plan 2: the pivots made the gain
    run = tmp_path / "ablation"
    wins = {"reactive": {0}, "reactive-pivots": {0, 1, 2}, "simplan": {0, 1, 2}, "plan": {0, 3}}
    for i in range(4):
        for arm, won in wins.items():
            acts = [{}] if i in won else [{"done": True, "score": -1.0}]
            append_trace(run / "traces.jsonl", make_trace(f"s/t{i}/{arm}/0", arm, "coin", acts, i in won))
    lead = write_report([run], tmp_path / "report")["md"].read_text().split("###")[0]
    firsts = [f"**{arm} - reactive = " for arm in ("reactive-pivots", "plan", "simplan")]
    ablation = "**simplan - reactive-pivots = +0.0 points**"
    assert all(f in lead for f in firsts) and ablation in lead
    assert lead.index(firsts[-1]) < lead.index(ablation)  # against the baseline first, then the ablation
    assert "ablation: what imagination adds to the pivots, " + ablation in lead
    assert "**plan - reactive-pivots" not in lead  # plan does not pivot: no ablation of the pivots


@pytest.mark.parametrize("simplan_pivots", [True, False])
def test_the_pivots_ablation_line_reads_the_settings_the_episodes_ran(tmp_path, simplan_pivots) -> None:
    """An arm override that turns simplan's pivots off makes simplan - reactive-pivots something other than what
    imagination adds to the pivots: the line follows the episodes' recorded settings, not the arms' presets."""
    run = tmp_path / "override"
    played = {"reactive": (False, 0), "reactive-pivots": (True, 0), "simplan": (simplan_pivots, 1)}
    for i in range(3):
        for arm, (pivots, horizon) in played.items():
            trace = make_trace(f"s/t{i}/{arm}/0", arm, "coin", [{}], arm != "reactive")
            trace.events[0].config = {"arm": arm, "pivots": pivots, "horizon": horizon}
            append_trace(run / "traces.jsonl", trace)
    lead = write_report([run], tmp_path / "report")["md"].read_text().split("###")[0]
    assert ("what imagination adds to the pivots, **simplan - reactive-pivots" in lead) == simplan_pivots


def test_report_shows_transient_failures_and_finishes_only_for_runs_with_any(tmp_path, shop_on_path) -> None:
    shop, plain = tmp_path / "shop", tmp_path / "plain"
    for t in shop_traces():
        append_trace(shop / "traces.jsonl", t)
    for t in traces()[2:]:  # simplan's toy episodes: no transient failure, no finish
        append_trace(plain / "traces.jsonl", t)
    md = write_report([plain], tmp_path / "plain-report")["md"].read_text()
    assert "Transient failures and finishes" not in md  # a TWX-like run does not grow an empty table

    paths = write_report([shop, plain], tmp_path / "report")
    main = paths["md"].read_text().split("## Plots")[0]
    table = main.split("### Transient failures and finishes")[1].split("###")[0]
    assert "| shop | simplan | 7 | 6 [85.7%] | 3 / 4 | 1/2 | 2 |" in table
    assert "| shop | reactive | 0 | - | 0 / 0 | 1/1 | 1 |" in table
    assert "| plain |" not in table  # only the runs with a transient failure or a finish call
    assert "Transient failures and finishes" in paths["html"].read_text()
    arms = {m["arm"]: m for m in json.loads(paths["json"].read_text())["runs"][0]["arms"]}
    assert (arms["simplan"]["transient_failures"], arms["simplan"]["got_through"]) == (7, 6)
    assert arms["simplan"]["got_through_share"] == pytest.approx(6 / 7)
    assert (arms["simplan"]["injected_transient"], arms["simplan"]["premature_finish_episodes"]) == (3, 1)
    assert (arms["reactive"]["finish_calls"], arms["reactive"]["got_through_share"]) == (1, None)


def test_report_shows_where_the_judge_departed_from_the_decider_only_for_runs_where_it_did(tmp_path) -> None:
    departed, plain = tmp_path / "departed", tmp_path / "plain"
    for t in departure_traces():
        append_trace(departed / "traces.jsonl", t)
    for t in traces():
        append_trace(plain / "traces.jsonl", t)
    assert "departed from the decider" not in write_report([plain], tmp_path / "plain-report")["md"].read_text()

    paths = write_report([departed, plain], tmp_path / "report")
    table = paths["md"].read_text().split("### Where the judge departed from the decider")[1].split("###")[0]
    assert "| departed | simplan | 1/3 [33.3%] | 0/1 [0.0%] | 1/1 [100.0%] | failed 1 |" in table
    assert "| plain |" not in table
    (arm,) = json.loads(paths["json"].read_text())["runs"][0]["arms"]
    assert (arm["departures"], arm["judged_choices"], arm["departures_by_part"]) == (1, 3, {"failed": 1})
