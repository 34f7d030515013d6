"""`simplan fit-judge`: fit the outcome judge on dev states and measure the simulator's outcome predictions.

    simplan fit-judge --inputs runs/data/twx-dev-cf.jsonl --engine hf --model smollm2-135m-instruct \\
        --adapters decider=runs/train/decider/adapter,simulator=runs/train/simulator/adapter --write_adapter true

The inputs are dev trajectories with counterfactual alternatives (`simplan counterfactuals`). Writes
metrics.json, metrics.md, rows.jsonl and reliability.png to --out; with --write_adapter true also
outcome_judge.json beside the simulator adapter, which the planner reads (evaluation/judge_fit.py).
`--rows OUT/rows.jsonl` refits from an earlier run's scores without loading a model (`--veto_on
candidates`: the veto's precision over every candidate instead of the decider's first choices, the default).
Exit status 0 on success, 2 on a bad configuration.
"""

from __future__ import annotations

import sys

from simplan.core.config import parse_config
from simplan.core.io import check_output_folder
from simplan.evaluation.judge_fit import FitJudgeConfig
from simplan.inference.engines import EngineConfig, engine_from_config
from simplan.scripts.cli import command


@command("simplan fit-judge")
def main(argv: list[str] | None = None) -> int:
    cfg, engine_cfg = parse_config(
        [FitJudgeConfig, EngineConfig], argv, description=__doc__.split("\n")[0], prog="simplan fit-judge"
    )
    check_output_folder(cfg.out)  # before the engine loads
    from simplan.evaluation.judge_fit import fit_judge

    engine = engine_from_config(engine_cfg) if not cfg.rows else None  # a refit from rows needs no model
    try:
        result = fit_judge(cfg, engine)
    finally:
        if engine is not None:
            engine.close()
    print((result["out"] / "metrics.md").read_text())
    if result["written"]:
        print(f"fit-judge: the planner reads {result['written']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
