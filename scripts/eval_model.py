"""`simplan eval-model`: offline metrics of a base model and/or an adapter on a dataset fold.

    simplan eval-model --role decider --dataset runs/datasets/twx-decider --fold dev \\
        --model smollm2-135m-instruct --adapter runs/train/smollm2-twx-decider/adapter --limit 200

Writes metrics.json, metrics.md (base vs adapter side by side) and predictions.jsonl to --out; for the
simulator also simulator_accuracy.json (exact predictions per action verb), which
`--write_adapter_accuracy true` copies beside the adapter for the planner's selective router:

    simplan eval-model --role simulator --dataset runs/datasets/twx-simulator --fold dev \
        --adapter runs/train/smollm2-twx-simulator/adapter --write_adapter_accuracy true
"""

from __future__ import annotations

import sys

from simplan.core.config import parse_config
from simplan.core.io import check_output_folder
from simplan.evaluation.offline import EvalModelConfig
from simplan.scripts.cli import command


@command("simplan eval-model")
def main(argv: list[str] | None = None) -> int:
    (cfg,) = parse_config(
        [EvalModelConfig],
        argv,
        description="Offline decider/simulator metrics on a dataset fold.",
        prog="simplan eval-model",
    )
    check_output_folder(cfg.out_dir())
    from simplan.evaluation.offline import evaluate

    report = evaluate(cfg)
    print((cfg.out_dir() / "metrics.md").read_text())
    print(f"eval-model: wrote {report['out']}")
    for path in report.get("accuracy_files", []):
        print(f"eval-model: simulator accuracy per action verb in {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
