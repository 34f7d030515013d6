"""`simplan counterfactuals`: from every state of recorded trajectories, play other actions for real and record them.

    simplan collect --config recipes/collect/twx-train.yaml
    simplan counterfactuals --inputs runs/data/twx-train.jsonl --per_state 8 --out runs/data/twx-train-cf.jsonl
    simplan counterfactuals --inputs runs/data/shop.jsonl,runs/data/shop-traces.jsonl --families kitchen \\
        --limit 20 --out runs/data/shop-cf.jsonl

Writes the trajectories with their alternatives (`Step.alternatives`, schema version 2) to --out and the
counts per family and outcome class to `{out}.stats.json` and `.md`; re-running resumes. What is played and
how replay is checked: `simplan.data.counterfactual`. Exit status: 0 when every selected trajectory is in
--out or was skipped for a reason the summary gives (diverged, errored), 1 when input lines were bad or some
trajectories could not be finished (an env failed: re-run), 2 for a missing input or an unknown env.
"""

from __future__ import annotations

import sys
from pathlib import Path

from simplan.core.config import parse_config
from simplan.core.errors import EmptyInputError
from simplan.core.io import check_output_file, has_lines
from simplan.data.counterfactual import CounterfactualConfig, collect_counterfactuals
from simplan.scripts.cli import command


@command("simplan counterfactuals")
def main(argv: list[str] | None = None) -> int:
    (cfg,) = parse_config(
        [CounterfactualConfig], argv, description=__doc__.split("\n")[0], prog="simplan counterfactuals"
    )
    check_output_file(cfg.out)
    empty = [path for path in cfg.inputs if Path(path).is_file() and not has_lines(path)]
    if empty:
        raise EmptyInputError(f"{', '.join(empty)}: empty (no line to read); give trajectory JSONL files")
    report = collect_counterfactuals(cfg)
    print(report.summary())
    failed = report.skipped["bad_line"] + report.skipped["env_failed"] + report.unfinished
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
