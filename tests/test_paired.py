"""Paired statistics on hand-made outcomes match hand-computed values."""

from __future__ import annotations

import math

import pytest

from simplan.evaluation.metrics import EpisodeRecord
from simplan.evaluation.paired import (
    compare_all,
    compare_arms,
    compare_runs,
    mcnemar_exact,
    pair_key,
    paired_bootstrap,
    task_key,
)
from simplan.inference.planning.trace import EpisodeSummary


def rec(
    task: str, arm: str, success: bool, tokens: int = 100, wall: float = 1.0, repeat: int = 0, score: float = 0.0
) -> EpisodeRecord:
    s = EpisodeSummary(
        episode_id=f"suite/twx/{task}/{arm}/{repeat}",
        env="twx",
        task_id=task,
        arm=arm,
        success=success,
        total_tokens=tokens,
        wall_seconds=wall,
        score=score,
    )
    return EpisodeRecord(s)


def outcomes(both: int, a_only: int, b_only: int, neither: int, a="reactive", b="simplan") -> list[EpisodeRecord]:
    """Hand-made pairs: `both` tasks won by both arms, `a_only` by A alone, ..."""
    wins = [(True, True)] * both + [(True, False)] * a_only + [(False, True)] * b_only + [(False, False)] * neither
    return [r for i, (x, y) in enumerate(wins) for r in (rec(f"t{i}", a, x), rec(f"t{i}", b, y))]


def test_mcnemar_exact_matches_hand_computed_binomial_tails() -> None:
    # b=8, c=2: 10 discordant pairs; p = 2 * (C(10,0) + C(10,1) + C(10,2)) / 2^10 = 2 * 56 / 1024
    assert mcnemar_exact(8, 2) == 0.109375
    assert mcnemar_exact(2, 8) == 0.109375  # two-sided: symmetric
    assert mcnemar_exact(0, 6) == 2 / 64  # only the most extreme split
    assert mcnemar_exact(3, 0) == 0.25
    assert mcnemar_exact(5, 5) == 1.0  # 2 * P[X <= 5] > 1 is capped
    assert mcnemar_exact(0, 0) == 1.0  # no discordant pair: no evidence either way
    with pytest.raises(ValueError, match="must be >= 0"):
        mcnemar_exact(-1, 2)


def test_compare_arms_counts_pairs_and_difference() -> None:
    # 2 won by both, 1 by reactive only, 5 by simplan only, 4 by neither: 12 pairs
    c = compare_arms(outcomes(2, 1, 5, 4), "reactive", "simplan", resamples=2000)
    assert (c.pairs, c.a_successes, c.b_successes, c.a_only, c.b_only) == (12, 3, 7, 1, 5)
    assert c.difference == pytest.approx(4 / 12)
    assert c.p_value == pytest.approx(2 * (1 + 6) / 64)  # 6 discordant, min side 1
    assert c.unpaired == 0
    # The bootstrap interval holds the difference and is close to the normal approximation of the paired
    # differences d (5 x +1, 1 x -1, 6 x 0): sd = sqrt(6/12 - (4/12)^2), se = sd / sqrt(12)
    se = math.sqrt(6 / 12 - (4 / 12) ** 2) / math.sqrt(12)
    assert c.ci_low <= c.difference <= c.ci_high
    assert c.ci_low == pytest.approx(4 / 12 - 1.96 * se, abs=1 / 12 + 1e-9)
    assert c.ci_high == pytest.approx(4 / 12 + 1.96 * se, abs=1 / 12 + 1e-9)


def test_bootstrap_is_seeded_and_degenerate_cases_are_exact() -> None:
    a = [True, False, False, True, False, False, True, False]
    b = [True, True, False, True, True, False, False, True]
    assert paired_bootstrap(a, b, 500, seed=3) == paired_bootstrap(a, b, 500, seed=3)
    assert paired_bootstrap([False] * 5, [True] * 5, 200) == (1.0, 1.0)  # every pair says +1
    assert paired_bootstrap([True, False], [True, False], 200) == (0.0, 0.0)  # identical arms
    assert paired_bootstrap([], [], 10) == (0.0, 0.0)
    with pytest.raises(ValueError, match="pairs need both"):
        paired_bootstrap([True], [], 10)


def test_final_scores_are_compared_pair_by_pair_with_a_sign_test() -> None:
    """Partial progress: no task won by either arm, B ends higher on three, A on one, one tie."""
    scores = [(0.0, 0.5), (0.0, 0.33), (0.17, 0.5), (0.5, 0.17), (-1.0, -1.0)]
    records = [
        r
        for i, (x, y) in enumerate(scores)
        for r in (rec(f"t{i}", "reactive", False, score=x), rec(f"t{i}", "simplan", False, score=y))
    ]
    c = compare_arms(records, "reactive", "simplan", resamples=2000)
    assert (c.difference, c.a_only, c.b_only) == (0.0, 0, 0)  # no success differs
    assert c.a_score == pytest.approx(-0.33 / 5) and c.b_score == pytest.approx(0.5 / 5)
    assert c.score_difference == pytest.approx((0.5 + 0.33 + 0.33 - 0.33) / 5)
    assert (c.a_higher, c.b_higher) == (1, 3)  # the tie is left out
    assert c.score_p_value == mcnemar_exact(1, 3) == 0.625
    assert c.score_ci_low <= c.score_difference <= c.score_ci_high
    # the interval's ends are means of 5 resampled differences, each one of the five pairs' own
    diffs = [y - x for x, y in scores]
    assert min(diffs) <= c.score_ci_low and c.score_ci_high <= max(diffs)
    assert c.to_dict()["score_p_value"] == 0.625


def test_bootstrap_of_scores_is_not_rounded_to_outcomes() -> None:
    assert paired_bootstrap([0.0] * 4, [0.25] * 4, 100) == (0.25, 0.25)
    assert paired_bootstrap([0.5, 0.5], [0.0, 0.0], 100) == (-0.5, -0.5)


def test_only_episodes_both_arms_finished_are_paired() -> None:
    records = outcomes(1, 0, 1, 0)  # t0 both won, t1 simplan only
    records.append(rec("t9", "reactive", True))  # no simplan partner: left out
    records += [rec("t0", "reactive", False, repeat=1), rec("t0", "simplan", True, repeat=1)]  # a second repeat
    c = compare_arms(records, "reactive", "simplan", resamples=100)
    assert (c.pairs, c.unpaired, c.a_only, c.b_only) == (3, 1, 0, 2)
    assert pair_key(records[0].summary) == "suite/twx/t0/0" == pair_key(records[1].summary)


def test_tokens_and_wall_per_success_per_arm() -> None:
    records = [
        rec("t0", "reactive", True, tokens=100, wall=2.0),
        rec("t1", "reactive", False, tokens=300, wall=4.0),
        rec("t0", "simplan", True, tokens=500, wall=5.0),
        rec("t1", "simplan", True, tokens=700, wall=7.0),
    ]
    c = compare_arms(records, "reactive", "simplan", resamples=10)
    assert c.a_cost.tokens_per_success == 400.0 and c.a_cost.wall_per_success == 6.0
    assert c.b_cost.tokens_per_success == 600.0 and c.b_cost.wall_per_success == 6.0
    none = compare_arms([rec("t0", "plan", False), rec("t0", "simplan", False)], "plan", "simplan", resamples=10)
    assert none.a_cost.tokens_per_success is None and none.to_dict()["b_cost"]["wall_per_success"] is None


def test_compare_all_orders_arms() -> None:
    records = outcomes(1, 0, 0, 1, a="simplan", b="reactive") + outcomes(1, 0, 0, 1, a="plan", b="simplan")[::2]
    pairs = [(c.arm_a, c.arm_b) for c in compare_all(records, resamples=10)]
    assert pairs == [("reactive", "plan"), ("reactive", "simplan"), ("plan", "simplan")]


def test_compare_runs_pairs_each_arm_on_the_tasks_both_runs_played() -> None:
    """A flywheel round: the old run played 6 tasks (two arms), the new one 4 of them under another suite name."""

    def run(suite: str, arm: str, wins: list[bool], tokens: int = 100) -> list[EpisodeRecord]:
        records = [rec(f"t{i}", arm, w, tokens=tokens) for i, w in enumerate(wins)]
        for r in records:
            r.summary.episode_id = r.summary.episode_id.replace("suite/", f"{suite}/", 1)
        return records

    before = run("twx-dev", "reactive", [True, False, False, False, True, True])
    before += run("twx-dev", "simplan", [False] * 6)
    after = run("twx-dev-small", "reactive", [True, True, True, False], tokens=50)
    assert task_key(after[0].summary) == task_key(before[0].summary) == "twx/t0/0"
    (c,) = compare_runs(before, after, resamples=10)  # simplan is in one run only: no row
    assert (c.arm_a, c.arm_b, c.pairs, c.unpaired) == ("reactive", "reactive", 4, 2)
    assert (c.a_successes, c.b_successes, c.a_only, c.b_only) == (1, 3, 0, 2)
    assert c.difference == 0.5 and c.p_value == 0.5  # 2 discordant pairs, both the new run's: 2 * 1/4
    assert (c.a_cost.tokens_per_success, c.b_cost.tokens_per_success) == (400, 200 / 3)
