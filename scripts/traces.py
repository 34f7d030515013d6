"""`simplan traces`: an evaluation's traces as training trajectories (the data flywheel's harvest).

    simplan traces --runs runs/eval/twx-train-small --out runs/data/twx-traces.jsonl
    simplan traces --runs runs/eval/a,runs/eval/b --arms simplan --min_score 0.5 --out runs/data/traces.jsonl

Every finished episode becomes a trajectory: all its real transitions are simulator data, the actions of
won (and recovered) episodes decider targets, mistakes masked context (`simplan.workflows.harvest`
describes which step counts as what). Episodes are replayed in their env to record valid actions and
tools. Prints what was written: episodes, transitions, decider targets, masked steps, skips. Exit
status: 0 when every line was read and a file written, 1 when a line could not be read (the good episodes are
still written) or no episode could be converted, 2 for a missing or empty run folder.
"""

from __future__ import annotations

import sys

from simplan.core.config import parse_config
from simplan.core.io import check_output_file
from simplan.scripts.cli import command
from simplan.workflows.harvest import TracesConfig, harvest


@command("simplan traces")
def main(argv: list[str] | None = None) -> int:
    (cfg,) = parse_config([TracesConfig], argv, description=__doc__.split("\n")[0], prog="simplan traces")
    if cfg.out:
        check_output_file(cfg.out)
    report = harvest(cfg)
    print(report.summary())
    if not report.written:
        print("simplan traces: no episode could be converted; see the skipped counts above", file=sys.stderr)
        return 1
    if report.bad_lines:  # the good episodes were written; as validate, import and build, say it was not all
        print(f"simplan traces: {report.bad_lines} line(s) could not be read; see the ! lines above", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
