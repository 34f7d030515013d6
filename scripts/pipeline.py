"""`simplan pipeline`: the whole job in one command: collect, build, fetch, train, evaluate, report.

    simplan pipeline --config recipes/pipeline/twx-smollm2.yaml        # `make demo`: ~1 hour on 2 CPU cores
    simplan pipeline --config recipes/pipeline/toy-tiny.yaml           # toy env + tiny model: ~2-3 minutes
    simplan pipeline --config recipes/pipeline/twx-smollm2.yaml --force eval,report --eval '{episodes: 3}'

Stages: collect-train, collect-dev, model, build-decider, build-simulator, train-decider,
train-simulator, eval, report; each is a library call (`simplan.workflows.pipeline`, which describes
them) and prints the `simplan` command that runs it alone. Re-running reuses finished stages
(OUT/.stages/STAGE.json) and resumes an interrupted one; `--force STAGE,...` re-runs stages,
`--stages STAGE,...` runs only those (their inputs must be complete). Before each stage: `[i/N] STAGE`
and the time left; at the end (or when a stage fails) a summary: each stage's status and seconds, the
eval's success by arm, and the path of report.html. Exit status: 0 when every stage finished, 2 when a
configuration is bad or a stage failed on something the user must fix (an unknown env, a missing input), 1 when
one failed otherwise, 130 when interrupted.
"""

from __future__ import annotations

import sys

from simplan.core.config import parse_config
from simplan.core.io import check_output_folder
from simplan.workflows.pipeline import Pipeline, PipelineConfig
from simplan.workflows.pipeline_stages import StageFailed


def main(argv: list[str] | None = None) -> int:
    (cfg,) = parse_config([PipelineConfig], argv, description=__doc__.split("\n")[0], prog="simplan pipeline")
    check_output_folder(cfg.out)
    return run_to_end(Pipeline(cfg), "simplan pipeline")


def run_to_end(pipeline: Pipeline, prog: str) -> int:
    """Run every stage and print the summary; the exit status (also `simplan flywheel`'s)."""
    try:
        pipeline.run()
    except StageFailed as e:
        if pipeline.records:  # a bad configuration fails before any stage: nothing to summarise
            print("\n" + pipeline.summary())
        print(f"{prog}: {e}", file=sys.stderr)
        return 2 if e.usage else 1
    except KeyboardInterrupt:
        print("\n" + pipeline.summary() + f"\n{prog}: interrupted; the same command resumes", file=sys.stderr)
        return 130
    print("\n" + pipeline.summary())
    return 0


if __name__ == "__main__":
    sys.exit(main())
