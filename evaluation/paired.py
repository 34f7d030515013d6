"""Paired comparison of two arms that ran the same tasks: exact McNemar test and a paired bootstrap interval.

    from simplan.evaluation.metrics import load_run
    from simplan.evaluation.paired import compare_arms, compare_all
    records = load_run("runs/eval/twx-dev")
    c = compare_arms(records, "reactive", "simplan")
    print(c.difference, c.ci_low, c.ci_high, c.p_value)       # simplan minus reactive, in success rate
    print(c.score_difference, c.score_ci_low, c.score_ci_high, c.score_p_value)   # ... in mean final score
    for c in compare_all(records): ...                        # every pair of arms present, in arm order
    for c in compare_runs(load_run("runs/eval/old"), load_run("runs/eval/new")): ...  # each arm, run vs run

Why paired: every arm of an evaluation runs the same tasks (evaluation/runner.py `plan_episodes`),
and tasks differ far more in difficulty than arms do. Unpaired Wilson intervals of 8 tasks per arm
overlap whatever the arms do; comparing the arms task by task removes the task-to-task spread.

Definitions (arm A against arm B, over the tasks both finished):
    pairs      (task, repeat) episodes finished by both arms; an episode of one arm only is left out
    a_only     pairs A won and B lost;  b_only: pairs B won and A lost (the discordant pairs)
    difference success rate of B minus success rate of A = (b_only - a_only) / pairs
    p_value    exact McNemar test, two-sided: under "the arms are equally good" each discordant pair
               is won by B with probability 1/2, so p = min(1, 2 * P[Binomial(a_only + b_only, 1/2) <= min])
    ci_low/high  paired bootstrap percentile interval of the difference: resample the pairs with
               replacement (`resamples` times, seeded), recompute the difference each time
    tokens/wall per success  per arm over the paired episodes: all tokens (wall seconds) / successes

The final score, for the progress an episode made short of winning (TWX's partial credit: a twc episode that
put two of six objects away ends at 0.33; a failed arithmetic or sorting answer at -1):
    a_score, b_score   each arm's mean final score over the pairs
    score_difference   b_score - a_score;  score_ci_low/high: its paired bootstrap interval (as above)
    a_higher, b_higher pairs whose final score is higher for A (B); ties are left out
    score_p_value      exact two-sided sign test on them: the McNemar formula with the higher-scoring
                       pairs in place of the discordant ones
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from itertools import combinations
from typing import Any

from simplan.evaluation.metrics import ARM_ORDER, EpisodeRecord
from simplan.inference.planning.trace import EpisodeSummary

DEFAULT_RESAMPLES = 10_000
DEFAULT_SEED = 0


def pair_key(s: EpisodeSummary) -> str:
    """The identity of an episode without its arm: eval ids are "{suite}/{env}/{task}/{arm}/{repeat}", so the
    arm's segment is dropped; other ids pair by (env, task id)."""
    parts = s.episode_id.split("/")
    if len(parts) >= 2 and parts[-2] == s.arm:
        return "/".join(parts[:-2] + parts[-1:])
    return f"{s.env}/{s.task_id}"


def mcnemar_exact(a_only: int, b_only: int) -> float:
    """Two-sided exact McNemar p-value on the discordant pairs (a binomial test with p = 1/2); 1.0 without any."""
    if a_only < 0 or b_only < 0:
        raise ValueError(f"mcnemar_exact: discordant counts must be >= 0, got {a_only}, {b_only}")
    n = a_only + b_only
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, k) for k in range(min(a_only, b_only) + 1))
    return min(1.0, 2 * tail / 2**n)


def paired_bootstrap(
    a: Sequence[float],
    b: Sequence[float],
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = DEFAULT_SEED,
    level: float = 0.95,
) -> tuple[float, float]:
    """Percentile interval of mean(b) - mean(a), resampling the pairs (a[i], b[i]) together; (0, 0) without pairs.
    Outcomes (bools) or scores alike."""
    if len(a) != len(b):
        raise ValueError(f"paired_bootstrap: {len(a)} outcomes of A but {len(b)} of B; pairs need both")
    if resamples < 1 or not 0.0 < level < 1.0:
        raise ValueError(f"paired_bootstrap: resamples must be >= 1 and level in (0, 1), got {resamples}, {level}")
    n = len(a)
    if n == 0:
        return 0.0, 0.0
    diffs = [float(y) - float(x) for x, y in zip(a, b)]
    rng = random.Random(seed)
    means = sorted(sum(rng.choices(diffs, k=n)) / n for _ in range(resamples))
    tail = (1.0 - level) / 2
    return means[_rank(tail, resamples)], means[_rank(1.0 - tail, resamples)]


def _rank(q: float, n: int) -> int:
    """Index of the q-quantile in n sorted values (nearest rank)."""
    return min(n - 1, max(0, math.ceil(q * n) - 1))


@dataclass
class ArmCost:
    """What one arm spent over the paired episodes."""

    successes: int = 0
    tokens: int = 0
    wall_seconds: float = 0.0

    @property
    def tokens_per_success(self) -> float | None:
        return self.tokens / self.successes if self.successes else None

    @property
    def wall_per_success(self) -> float | None:
        return self.wall_seconds / self.successes if self.successes else None


@dataclass
class PairedComparison:
    """Arm B against arm A on the episodes both ran (module docstring for definitions)."""

    arm_a: str
    arm_b: str
    pairs: int
    a_successes: int
    b_successes: int
    a_only: int
    b_only: int
    difference: float
    ci_low: float
    ci_high: float
    p_value: float
    a_cost: ArmCost
    b_cost: ArmCost
    a_score: float = 0.0  # mean final scores over the pairs, and B's minus A's with its interval
    b_score: float = 0.0
    score_difference: float = 0.0
    score_ci_low: float = 0.0
    score_ci_high: float = 0.0
    a_higher: int = 0  # pairs whose final score is higher for A (B); the sign test's counts
    b_higher: int = 0
    score_p_value: float = 1.0
    unpaired: int = 0  # episodes of either arm without a partner (left out)
    resamples: int = DEFAULT_RESAMPLES
    seed: int = DEFAULT_SEED

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for side, cost in (("a", self.a_cost), ("b", self.b_cost)):
            d[f"{side}_cost"].update(
                tokens_per_success=cost.tokens_per_success, wall_per_success=cost.wall_per_success
            )
        return d


def _by_pair(
    records: list[EpisodeRecord], arm: str, key: Callable[[EpisodeSummary], str] = pair_key
) -> dict[str, EpisodeSummary]:
    out: dict[str, EpisodeSummary] = {}
    for r in records:
        if r.summary.arm == arm:
            out.setdefault(key(r.summary), r.summary)
    return out


def _cost(summaries: list[EpisodeSummary]) -> ArmCost:
    return ArmCost(
        successes=sum(bool(s.success) for s in summaries),
        tokens=sum(s.total_tokens for s in summaries),
        wall_seconds=sum(s.wall_seconds for s in summaries),
    )


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


def _higher(a: Sequence[float], b: Sequence[float]) -> tuple[int, int]:
    """The pairs where A's value is higher and those where B's is (ties left out): for outcomes, the discordant
    pairs A won alone and B won alone; for scores, the sign test's counts."""
    return sum(x > y for x, y in zip(a, b)), sum(y > x for x, y in zip(a, b))


def compare_arms(
    records: list[EpisodeRecord],
    arm_a: str,
    arm_b: str,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = DEFAULT_SEED,
) -> PairedComparison:
    """Arm B against arm A over the (task, repeat) episodes both finished."""
    return compare_pairs(_by_pair(records, arm_a), _by_pair(records, arm_b), arm_a, arm_b, resamples, seed)


def compare_pairs(
    a: dict[str, EpisodeSummary],
    b: dict[str, EpisodeSummary],
    arm_a: str,
    arm_b: str,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = DEFAULT_SEED,
) -> PairedComparison:
    """B against A over the keys both hold (one episode per key on each side)."""
    keys = sorted(set(a) & set(b))
    wins_a = [bool(a[k].success) for k in keys]
    wins_b = [bool(b[k].success) for k in keys]
    a_only, b_only = _higher(wins_a, wins_b)  # the discordant pairs: won by one arm only
    scores_a = [a[k].score for k in keys]
    scores_b = [b[k].score for k in keys]
    a_higher, b_higher = _higher(scores_a, scores_b)
    mean_a, mean_b = _mean(scores_a), _mean(scores_b)
    n = len(keys)
    low, high = paired_bootstrap(wins_a, wins_b, resamples, seed)
    score_low, score_high = paired_bootstrap(scores_a, scores_b, resamples, seed)
    return PairedComparison(
        arm_a=arm_a,
        arm_b=arm_b,
        pairs=n,
        a_successes=sum(wins_a),
        b_successes=sum(wins_b),
        a_only=a_only,
        b_only=b_only,
        difference=(b_only - a_only) / n if n else 0.0,
        ci_low=low,
        ci_high=high,
        p_value=mcnemar_exact(a_only, b_only),
        a_cost=_cost([a[k] for k in keys]),
        b_cost=_cost([b[k] for k in keys]),
        a_score=mean_a,
        b_score=mean_b,
        score_difference=mean_b - mean_a,
        score_ci_low=score_low,
        score_ci_high=score_high,
        a_higher=a_higher,
        b_higher=b_higher,
        score_p_value=mcnemar_exact(a_higher, b_higher),
        unpaired=len(a) + len(b) - 2 * n,
        resamples=resamples,
        seed=seed,
    )


def arms_in_order(records: list[EpisodeRecord]) -> list[str]:
    """The arms present, reactive, plan, simplan first, then others by name."""
    present = {r.summary.arm for r in records}
    return [a for a in ARM_ORDER if a in present] + sorted(present - set(ARM_ORDER))


def task_key(s: EpisodeSummary) -> str:
    """The identity of an episode across runs: env, task and repeat, without the suite or the arm ("twx-dev" and
    "twx-dev-small" run the same task "twx/coin-dev-0" under the same name)."""
    parts = s.episode_id.split("/")
    repeat = parts[-1] if len(parts) >= 2 and parts[-2] == s.arm else "0"
    return f"{s.env}/{s.task_id}/{repeat}"


def compare_runs(
    before: list[EpisodeRecord],
    after: list[EpisodeRecord],
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = DEFAULT_SEED,
) -> list[PairedComparison]:
    """Each arm present in both runs, `after` against `before` over the tasks both ran (a flywheel round's old
    and new adapters, say): the same statistics as between arms, with the run in place of the arm."""
    played_after = set(arms_in_order(after))
    arms = [a for a in arms_in_order(before) if a in played_after]
    return [
        compare_pairs(_by_pair(before, a, task_key), _by_pair(after, a, task_key), a, a, resamples, seed) for a in arms
    ]


def compare_all(
    records: list[EpisodeRecord], resamples: int = DEFAULT_RESAMPLES, seed: int = DEFAULT_SEED
) -> list[PairedComparison]:
    """Every pair of arms present (the later arm against the earlier: plan - reactive, simplan - reactive, ...)."""
    arms = arms_in_order(records)
    return [compare_arms(records, a, b, resamples, seed) for a, b in combinations(arms, 2)]
