"""`simplan flywheel`: one round of the data flywheel: harvest, traces, rebuild, continue both adapters, eval.

    simplan flywheel --config recipes/pipeline/flywheel-toy.yaml
    simplan flywheel --data runs/data/twx-train.jsonl,runs/data/twx-dev.jsonl \\
        --decider runs/train/decider/adapter --simulator runs/train/simulator/adapter \\
        --harvest_suite twx-train-small --suite twx-dev --before runs/eval/twx-dev --out runs/flywheel/r1

Stages: model, harvest, traces, build-decider, build-simulator, train-decider, train-simulator, eval,
simulator-check (the old and the new simulator, paired, on `--before`'s states), report
(`simplan.workflows.flywheel` describes them); each prints the `simplan` command that runs it alone,
finished stages are reused and `--force` / `--stages` work as in `simplan pipeline`. Exit status: 0
when every stage finished, 1 when one failed or a configuration is bad, 130 when interrupted.
"""

from __future__ import annotations

import sys

from simplan.core.config import parse_config
from simplan.core.io import check_output_folder
from simplan.scripts.pipeline import run_to_end
from simplan.workflows.flywheel import Flywheel, FlywheelConfig


def main(argv: list[str] | None = None) -> int:
    (cfg,) = parse_config([FlywheelConfig], argv, description=__doc__.split("\n")[0], prog="simplan flywheel")
    check_output_folder(cfg.out)
    return run_to_end(Flywheel(cfg), "simplan flywheel")


if __name__ == "__main__":
    sys.exit(main())
