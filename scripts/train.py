"""`simplan train`: LoRA-train the decider or the simulator from a YAML recipe.

    simplan train --config recipes/smollm2-135m-instruct/twx/decider.yaml
    simplan train --config recipes/smollm2-135m-instruct/twx/decider.yaml --max_steps 3 --output_dir runs/smoke
    accelerate launch --config_file recipes/accelerate/ddp.yaml -m simplan.scripts.cli train --config ...

The recipe gives defaults, flags override them (`simplan train --help` lists every field).
Rerunning the same command resumes from the last checkpoint in output_dir.
"""

from __future__ import annotations

import sys

from simplan.core.config import parse_config
from simplan.core.io import check_output_folder
from simplan.scripts.cli import command
from simplan.training.config import DataArguments, LoraArguments, ModelArguments, TrainArguments


@command("simplan train")
def main(argv: list[str] | None = None) -> int:
    model_args, lora_args, data_args, train_args = parse_config(
        [ModelArguments, LoraArguments, DataArguments, TrainArguments],
        argv,
        description="LoRA-train a decider or simulator adapter on a dataset from `simplan build`.",
        prog="simplan train",
    )
    check_output_folder(train_args.output_dir, "--output_dir")
    from simplan.training.trainer import train  # heavy imports only once the flags parsed

    result = train(model_args, lora_args, data_args, train_args)
    print(result.adapter_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
