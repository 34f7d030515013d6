"""Metrics from hand-made traces match hand-computed values; Wilson intervals match known values."""

from __future__ import annotations

import pytest

from simplan.evaluation.metrics import aggregate, load_run, records_from_traces, wilson_interval
from simplan.inference.planning.trace import (
    ActEvent,
    CandidateRecord,
    EndEvent,
    EpisodeTrace,
    ImagineEvent,
    PivotEvent,
    ReplanEvent,
    append_trace,
)


def make_trace(
    eid: str,
    arm: str,
    family: str,
    acts: list[dict],
    success: bool,
    pivots: list[str] = (),
    replans: list[str] = (),
    tokens: tuple[int, int] = (100, 10),
    calls: int = 2,
    wall: float = 2.0,
    planning: float = 0.5,
) -> EpisodeTrace:
    t = EpisodeTrace.start(eid, "toy", {"task_id": eid.split("/")[1], "family": family, "fold": "dev"}, arm)
    for i, a in enumerate(acts, start=1):
        t.add(ActEvent(**{"action": "look", "observation": f"o{i}", **a}), step=i)
    for rule in pivots:
        t.add(PivotEvent(rule=rule, severity="error", fired=True))
    t.add(PivotEvent(rule="no_progress", severity="warning", fired=False))  # counted, never fired
    for reason in replans:
        t.add(ReplanEvent(reason=reason))
    t.add(
        EndEvent(
            status="success" if success else "failed",
            success=success,
            score=1.0 if success else 0.0,
            steps=len(acts),
            model_calls=calls,
            prompt_tokens=tokens[0],
            completion_tokens=tokens[1],
            wall_seconds=wall,
            planning_seconds=planning,
        )
    )
    return t


def traces() -> list[EpisodeTrace]:
    return [
        # reactive: 1 success of 2; 3 invalid actions, 1 redundant (look -> o1 twice), one faulted episode (failed)
        make_trace(
            "toy/a/reactive/0",
            "reactive",
            "x",
            [{"error": True}, {"error": True, "fault": "transient"}, {"observation": "o1"}],
            False,
            tokens=(300, 30),
            calls=3,
            wall=3.0,
            planning=0.0,
        ),
        make_trace("toy/b/reactive/0", "reactive", "y", [{"error": True}, {}], True, tokens=(100, 10), calls=1),
        # simplan: 2 of 2, pivots, predictions (2 exact of 3), one faulted success
        make_trace(
            "toy/a/simplan/0",
            "simplan",
            "x",
            [
                {"expectation": "O1", "match": 1.0},
                {"expectation": "wrong", "match": 0.0, "fault": "perturb"},
                {"expectation": " o3 ", "match": 1.0},
            ],
            True,
            pivots=["expectation_mismatch", "error_observation"],
            replans=["expectation_mismatch,error_observation"],
            tokens=(400, 40),
            calls=4,
            wall=4.0,
            planning=2.0,
        ),
        make_trace("toy/b/simplan/0", "simplan", "y", [{}], True, pivots=["error_observation"], replans=["x"]),
    ]


def test_wilson_interval_known_values() -> None:
    lo, hi = wilson_interval(8, 10)
    assert lo == pytest.approx(0.4902, abs=1e-4) and hi == pytest.approx(0.9433, abs=1e-4)
    assert wilson_interval(0, 10)[0] == 0.0 and wilson_interval(0, 10)[1] == pytest.approx(0.2775, abs=1e-4)
    assert wilson_interval(10, 10) == pytest.approx((0.7225, 1.0), abs=1e-4)
    assert wilson_interval(1, 2) == pytest.approx((0.0945, 0.9055), abs=1e-4)
    assert wilson_interval(0, 0) == (0.0, 1.0)
    for n in range(1, 50):  # exact ends: a bound 1e-17 off 0 made a negative error bar that matplotlib refused
        assert wilson_interval(0, n)[0] == 0.0 and wilson_interval(n, n)[1] == 1.0


def test_per_arm_metrics_match_hand_computed() -> None:
    reactive, simplan = aggregate(records_from_traces(traces()))
    assert (reactive.arm, simplan.arm) == ("reactive", "simplan")
    assert (reactive.episodes, reactive.successes, reactive.success_rate) == (2, 1, 0.5)
    assert (reactive.ci_low, reactive.ci_high) == pytest.approx((0.0945, 0.9055), abs=1e-4)
    assert reactive.mean_steps == 2.5
    assert reactive.invalid_actions == 3 and reactive.invalid_per_episode == 1.5
    assert reactive.redundant_per_episode == 0.5  # ("look", "o1") seen twice in episode a
    assert (reactive.faulted_episodes, reactive.recovered, reactive.recovery_rate) == (1, 0, 0.0)
    assert reactive.calls_per_episode == 2.0
    assert reactive.tokens_per_episode == (330 + 110) / 2
    assert reactive.tokens_per_success == 440.0
    assert reactive.wall_per_episode == 2.5
    assert reactive.planning_share == pytest.approx(0.5 / 5.0)
    assert reactive.sim_accuracy is None and reactive.pivots_per_episode == 0.0

    assert (simplan.successes, simplan.success_rate) == (2, 1.0)
    assert simplan.pivots_per_episode == 1.5  # warnings are not pivots
    assert simplan.pivots_by_rule == {"error_observation": 2, "expectation_mismatch": 1}
    assert simplan.replans_per_episode == 1.0
    assert simplan.replans_by_reason == {"error_observation": 1, "expectation_mismatch": 1, "x": 1}
    assert (simplan.sim_exact, simplan.sim_predictions) == (2, 3)  # "O1" and " o3 " match after normalizing
    assert simplan.sim_accuracy == pytest.approx(2 / 3)
    assert (simplan.faulted_episodes, simplan.recovered, simplan.recovery_rate) == (1, 1, 1.0)
    assert simplan.planning_share == pytest.approx(2.5 / 6.0)
    assert simplan.mean_score == 1.0


def test_per_family_and_dedupe(tmp_path) -> None:
    path = tmp_path / "traces.jsonl"
    ts = traces()
    for t in ts + [ts[0]]:  # the same episode written twice counts once
        append_trace(path, t)
    with open(path, "a") as f:
        f.write('{"type": "start", "episode_id": "torn')  # a torn last line is tolerated
    records = load_run(tmp_path)
    assert len(records) == 4
    fams = {(m.arm, m.family): m for m in aggregate(records, by_family=True)}
    assert set(fams) == {("reactive", "x"), ("reactive", "y"), ("simplan", "x"), ("simplan", "y")}
    assert fams[("reactive", "x")].success_rate == 0.0 and fams[("reactive", "y")].success_rate == 1.0
    assert fams[("simplan", "x")].sim_accuracy == pytest.approx(2 / 3)


def test_unfinished_traces_are_not_counted() -> None:
    t = EpisodeTrace.start("toy/c/plan/0", "toy", {"task_id": "c"}, "plan")
    t.add(ActEvent(action="look", observation="o", won=True), step=1)
    assert records_from_traces([t]) == []


def test_wall_per_success_and_loss_classes_per_arm() -> None:
    extra = make_trace("toy/c/reactive/0", "reactive", "x", [{}, {"done": True, "score": -1.0}], False)
    reactive, simplan = aggregate(records_from_traces(traces() + [extra]))
    assert reactive.wall_per_success == (3.0 + 2.0 + 2.0) / 1  # all wall seconds over the one success
    assert simplan.wall_per_success == (4.0 + 2.0) / 2
    # episode a ended "failed" with the game still running; c's last action ended it unwon
    assert reactive.losses == {"irreversible": 1, "other": 1}
    assert simplan.losses == {}
    fams = {(m.arm, m.family): m for m in aggregate(records_from_traces(traces() + [extra]), by_family=True)}
    assert fams[("reactive", "x")].losses == {"irreversible": 1, "other": 1}


# Transient failures and finishes, on the shop (its transient_patterns: 503, "temporarily unavailable", "try again")
SHOP_503 = '{"error": "503 service unavailable: try again"}'
INJECTED = '{"error": "the call failed this time (a transient fault)"}'


def call(key: str, observation: str = "{}", **fields) -> dict:
    return {"action": key, "action_key": key, "observation": observation, **fields}


def shop_trace(eid: str, arm: str, acts: list[dict], success: bool) -> EpisodeTrace:
    t = EpisodeTrace.start(eid, "shop", {"task_id": eid.split("/")[2], "family": "kitchen", "fold": "dev"}, arm)
    for i, a in enumerate(acts, start=1):
        t.add(ActEvent(**a), step=i)
    t.add(EndEvent(status="success" if success else "failed", success=success, steps=len(acts)))
    return t


def shop_traces() -> list[EpisodeTrace]:
    retried = [
        call("buy(x)", SHOP_503, error=True),  # retried and succeeded: through
        call("buy(x)"),
        call("ship(o)", INJECTED, error=True, fault="transient"),  # retried into a real answer: through
        call("ship(o)", '{"error": "x sold out"}', error=True),
        call("search(y)", SHOP_503, error=True),  # never retried: not through
        call("pay(z)", SHOP_503, error=True),  # transient twice more, then through: all three through
        call("pay(z)", INJECTED, error=True, fault="transient"),
        call("pay(z)", SHOP_503, error=True),
        call("pay(z)"),
        call("look()", '{"hint": "try again later"}'),  # the pattern, but no failure: not transient
        call("finish()", done=True, won=True),  # a winning finish
    ]
    premature = [
        call("finish()", INJECTED, error=True, fault="transient"),  # never reached the env: no finish call
        call("finish()", done=True, won=False),  # the env took it with the goal not met
    ]
    return [
        shop_trace("shop-dev/shop/t1/simplan/0", "simplan", retried, True),
        shop_trace("shop-dev/shop/t2/simplan/0", "simplan", premature, False),
        shop_trace("shop-dev/shop/t1/reactive/0", "reactive", [call("buy(x)"), call("finish()", done=True)], False),
    ]


def test_transient_failures_got_through_and_premature_finishes(shop_on_path) -> None:
    from simplan.evaluation.metrics import RetryAccount, retry_account

    retried, premature, plain = shop_traces()
    assert retry_account(retried) == RetryAccount(
        transient_failures=6, injected_transient=2, got_through=5, finish_calls=1, premature_finishes=0
    )
    assert retry_account(premature) == RetryAccount(
        transient_failures=1, injected_transient=1, got_through=1, finish_calls=1, premature_finishes=1
    )
    reactive, simplan = aggregate(records_from_traces(shop_traces()))
    assert (simplan.transient_failures, simplan.injected_transient, simplan.got_through) == (7, 3, 6)
    assert simplan.got_through_share == pytest.approx(6 / 7)
    assert (simplan.finish_calls, simplan.premature_finishes, simplan.premature_finish_episodes) == (2, 1, 1)
    assert (reactive.transient_failures, reactive.got_through_share) == (0, None)  # none: no share, not 0
    assert (reactive.finish_calls, reactive.premature_finishes, reactive.premature_finish_episodes) == (1, 1, 1)


def test_injected_transient_faults_count_without_env_patterns() -> None:
    # the toy env declares no transient patterns; its injected transient "look" is retried by a later "look"
    # (traces without action keys: the rendered action is the call's identity)
    reactive, simplan = aggregate(records_from_traces(traces()))
    assert (reactive.transient_failures, reactive.injected_transient, reactive.got_through) == (1, 1, 1)
    assert (simplan.transient_failures, simplan.got_through_share, simplan.finish_calls) == (0, None, 0)


def judged(*candidates: tuple[str, float | None, dict[str, float]], chosen: int) -> ImagineEvent:
    """A decision's imagined candidates: (first action, decider logprob, judge parts); `chosen` is committed."""
    return ImagineEvent(
        candidates=[
            CandidateRecord(index=i, actions=[a], logprob=lp, parts=parts, chosen=i == chosen)
            for i, (a, lp, parts) in enumerate(candidates)
        ]
    )


def with_decisions(trace: EpisodeTrace, *decisions: ImagineEvent) -> None:
    """Add the decisions to a finished trace, before its end event."""
    end = trace.events.pop()
    for e in decisions:
        trace.add(e)
    trace.events.append(end)


def departure_traces() -> list[EpisodeTrace]:
    won = make_trace("toy/a/simplan/0", "simplan", "x", [{}, {}], True)
    with_decisions(
        won,
        judged(("look", -0.1, {"likelihood": 0.45}), ("go", -2.0, {"likelihood": 0.07}), chosen=0),  # the top
        judged(("look", -0.1, {"likelihood": 0.45}), chosen=0),  # one proposal: nothing to judge
    )
    lost = make_trace("toy/b/simplan/0", "simplan", "x", [{}, {}, {}], False)
    with_decisions(
        lost,
        # the decider's top failed before: the judge takes the second (failed decides, repeat also moved)
        judged(
            ("take key", -0.2, {"failed": -1.0, "repeat": -0.5, "likelihood": 0.41}),
            ("open door", -1.5, {"failed": 0.0, "repeat": 0.0, "likelihood": 0.11}),
            chosen=1,
        ),
        judged(("look", -0.7, {}), ("go", -0.7, {}), chosen=1),  # a tie: the decider's too
        judged(("look", None, {}), ("go", None, {}), chosen=1),  # no likelihood known: not judged
        judged(("look", -0.1, {"error": -2.0}), ("look", -0.1, {}), chosen=1),  # one first action twice
    )
    return [won, lost]


def test_departures_from_the_decider_count_where_the_judge_left_its_top_action() -> None:
    from simplan.evaluation.metrics import DepartureAccount, departure_account

    won, lost = departure_traces()
    assert departure_account(won) == DepartureAccount(judged_choices=1, departures=0)
    acc = departure_account(lost)
    assert (acc.judged_choices, acc.departures, dict(acc.by_part)) == (2, 1, {"failed": 1})
    (m,) = aggregate(records_from_traces([won, lost]))
    assert (m.judged_choices, m.departures, m.departures_by_part) == (3, 1, {"failed": 1})
    assert (m.departure_episodes, m.departure_won_episodes) == (1, 0)
    (reactive, _) = aggregate(records_from_traces(traces()))  # no imagine event: nothing judged
    assert (reactive.judged_choices, reactive.departures, reactive.departures_by_part) == (0, 0, {})
