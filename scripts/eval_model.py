"""`simplan eval-model`: offline metrics of a base model and/or an adapter on a dataset fold.

    simplan eval-model --role decider --dataset runs/datasets/twx-decider --fold dev \\
        --model smollm2-135m-instruct --adapter runs/train/smollm2-twx-decider/adapter --limit 200

Writes metrics.json, metrics.md (base vs adapter side by side) and predictions.jsonl to --out.
"""

from __future__ import annotations

import sys

from simplan.scripts.config import parse_config
from simplan.training.evaluate import EvalModelConfig


def main(argv: list[str] | None = None) -> int:
    (cfg,) = parse_config(
        [EvalModelConfig],
        argv,
        description="Offline decider/simulator metrics on a dataset fold.",
        prog="simplan eval-model",
    )
    from simplan.training.evaluate import evaluate

    try:
        report = evaluate(cfg)
    except (FileNotFoundError, ValueError) as e:
        print(f"simplan eval-model: {e}", file=sys.stderr)
        return 2
    print((cfg.out_dir() / "metrics.md").read_text())
    print(f"eval-model: wrote {report['out']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
