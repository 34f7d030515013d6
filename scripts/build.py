"""`simplan build`: the decider or simulator dataset from trajectory JSONL files.

    simplan build --role decider --inputs runs/data/twx-train.jsonl,runs/data/twx-dev.jsonl \\
        --out runs/datasets/twx-decider --model smollm2-135m-instruct
    simplan build --config recipes/build/twx-simulator.yaml --max-prompt-tokens 768

Input lines are checked as `simplan validate` checks them. A bad line stops the build with every
problem reported as FILE:LINE, unless --keep_going true, which builds from the good lines and
reports the bad ones (on stderr and in stats.json). Exit status: 0 when a dataset was written, 1
when no example survived, 2 on a bad input (missing file, bad lines without --keep_going, a task in
two folds, an unknown --env). What each example holds is described in `simplan.data.build`.
"""

from __future__ import annotations

import sys

from simplan.core.config import parse_config
from simplan.core.io import check_output_folder
from simplan.data.build import BuildConfig, build
from simplan.data.build_stats import stats_markdown
from simplan.scripts.cli import command

MAX_PRINTED_PROBLEMS = 20


@command("simplan build")
def main(argv: list[str] | None = None) -> int:
    (cfg,) = parse_config([BuildConfig], argv, description=__doc__.split("\n")[0], prog="simplan build")
    if cfg.out:
        check_output_folder(cfg.out)
    result = build(cfg)
    stats = result.stats
    problems = stats["problems"]
    for line in problems[:MAX_PRINTED_PROBLEMS]:
        print(line, file=sys.stderr)
    if stats["malformed_lines"] > len(problems[:MAX_PRINTED_PROBLEMS]):
        print(
            f"... {stats['malformed_lines']} bad line(s) in all, skipped (--keep_going); see {result.paths['stats']}",
            file=sys.stderr,
        )
    print(stats_markdown(stats))
    print("written:")
    for name, path in result.paths.items():
        print(f"  {name:<8} {path}")
    if not stats["examples"]["total"]:
        print("simplan build: no example survived; see the dropped counts above", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
