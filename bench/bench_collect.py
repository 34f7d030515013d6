"""Collection throughput on TextWorld-Express: `simplan collect` against the raw TWX loop, in one run.

    OMP_NUM_THREADS=1 .venv/bin/python bench/bench_collect.py                 # 8 games x 5 train seeds
    OMP_NUM_THREADS=1 .venv/bin/python bench/bench_collect.py --seeds 10 --repeats 3 --workers 1

Both sides play the same tasks (TWX train, every game, the first `--seeds` seeds, the adapter's
game parameters), grouped by game, each in a fresh JVM whose start-up is timed too:

- raw: textworld_express's own `TextWorldExpressEnv`: `load` once per game, then per episode
  `reset(generateGoldPath=True)`, `getGoldActionSequence()` and the gold steps until done; each task
  is played once per collected policy, so both sides run the same number of episodes;
- collect: `simplan.data.collect.collect` (the code behind `simplan collect`) with
  expert + noisy_expert, writing and fsyncing the JSONL file as it goes. Transitions are the real
  steps recorded (a noisy run's replayed prefix after a split-off mistake counts once).

The sides alternate `--repeats` times; the best time of each is reported (the machine is shared).
Target: collect transitions/s >= 50% of raw steps/s.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

from simplan.data.collect import CollectConfig, collect  # noqa: E402
from simplan.envs.base import Task  # noqa: E402
from simplan.envs.registry import make_env  # noqa: E402


def list_tasks(seeds: int) -> list[Task]:
    env = make_env("twx")
    try:
        tasks = env.tasks("train")
    finally:
        env.close()
    by_game: dict[str, list[Task]] = {}
    for t in tasks:
        by_game.setdefault(t.family, []).append(t)
    return [t for game in by_game.values() for t in game[:seeds]]


def raw_twx(tasks: list[Task], episodes_per_task: int) -> tuple[int, float]:
    """(steps, seconds) for TWX's own loop over the tasks' gold paths, JVM start included."""
    from textworld_express import TextWorldExpressEnv

    t0 = time.perf_counter()
    env = TextWorldExpressEnv(envStepLimit=10**9)
    steps, loaded = 0, None
    try:
        for _ in range(episodes_per_task):
            for task in tasks:
                game, params = task.params["game"], task.params["game_params"]
                if loaded != (game, params):
                    env.load(game, params)
                    loaded = (game, params)
                env.reset(seed=int(task.params["seed"]), gameFold=task.fold, generateGoldPath=True)
                for command in env.getGoldActionSequence():
                    _, _, done, _ = env.step(command)
                    steps += 1
                    if done:
                        break
    finally:
        env.close()
    return steps, time.perf_counter() - t0


def simplan_collect(tasks: list[Task], workers: int, out_dir: Path) -> tuple[int, int, float]:
    """(transitions, env steps, seconds) for expert + noisy_expert through `collect`."""
    out = out_dir / f"collect-{time.time_ns()}.jsonl"
    seeds = max(int(t.task_id.rsplit("-", 1)[-1]) for t in tasks) + 1
    cfg = CollectConfig(
        env="twx",
        fold="train",
        limit=seeds,
        policies=["expert", "noisy_expert"],
        workers=workers,
        out=str(out),
        progress=False,
    )
    report = collect(cfg)
    if report.unfinished or report.statuses["errored"]:
        raise RuntimeError(f"collection incomplete: {report.summary()}")
    return report.transitions, report.env_steps, report.elapsed_s


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=5, help="train seeds per game")
    parser.add_argument("--repeats", type=int, default=2, help="alternating runs of each side; best time is kept")
    parser.add_argument("--workers", type=int, default=1, help="collect workers (the raw loop is one process)")
    args = parser.parse_args(argv)
    if shutil.which("java") is None:
        print("bench_collect: needs Java for TextWorld-Express", file=sys.stderr)
        return 2
    tasks = list_tasks(args.seeds)
    raw_best = coll_best = None
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.repeats):
            steps, secs = raw_twx(tasks, episodes_per_task=2)
            if raw_best is None or secs < raw_best[1]:
                raw_best = (steps, secs)
            transitions, env_steps, csecs = simplan_collect(tasks, args.workers, Path(tmp))
            if coll_best is None or csecs < coll_best[2]:
                coll_best = (transitions, env_steps, csecs)
    raw_rate = raw_best[0] / raw_best[1]
    coll_rate = coll_best[0] / coll_best[2]
    games = sorted({t.family for t in tasks})
    print("=== bench_collect: TWX collection throughput ===")
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}")
    print(f"tasks: TWX train, {len(games)} games x {args.seeds} seeds = {len(tasks)} tasks; best of {args.repeats}")
    print(
        f"raw TWX loop (reset+gold path, 2 episodes/task): {raw_best[0]} steps in {raw_best[1]:.2f} s "
        f"= {raw_rate:.1f} steps/s"
    )
    print(
        f"simplan collect (expert+noisy_expert, workers={args.workers}): {coll_best[0]} transitions in "
        f"{coll_best[2]:.2f} s = {coll_rate:.1f} transitions/s ({coll_best[1]} env steps incl. replays)"
    )
    ratio = coll_rate / raw_rate
    print(f"ratio: {ratio:.0%} of raw (target >= 50%): {'PASS' if ratio >= 0.5 else 'FAIL'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
