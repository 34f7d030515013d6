"""`simplan fit-grader`: fit the request grader on expert trajectories and measure its accuracy on dev.

    simplan fit-grader --train runs/pipeline/shop/data/train.jsonl --dev runs/pipeline/shop/data/dev.jsonl \\
        --out runs/fit-grader/shop
    simplan eval --suite shop-dev-ambiguous ... \
        --planner '{grading: {mode: fitted, grader: runs/fit-grader/shop/grader.json}}'

Writes grader.json, metrics.json and metrics.md to --out (evaluation/grading_fit.py); no model is loaded.
Exit status 0 on success, 1 on unusable inputs, 2 on a bad configuration.
"""

from __future__ import annotations

import sys

from simplan.core.config import parse_config
from simplan.core.io import check_output_folder
from simplan.evaluation.grading_fit import FitGraderConfig, fit_grader
from simplan.scripts.cli import command


@command("simplan fit-grader")
def main(argv: list[str] | None = None) -> int:
    (cfg,) = parse_config([FitGraderConfig], argv, description=__doc__.split("\n")[0], prog="simplan fit-grader")
    check_output_folder(cfg.out)
    result = fit_grader(cfg)
    print((result["out"] / "metrics.md").read_text())
    print(f"fit-grader: --grading.grader {result['out'] / 'grader.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
