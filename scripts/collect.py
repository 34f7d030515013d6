"""`simplan collect`: expert, noisy-expert and random trajectories for any env and fold.

    simplan collect --env twx --fold train --policies expert,noisy_expert,random --limit 20 \\
        --out runs/data/twx-train.jsonl --workers 2
    simplan collect --config recipes/collect/twx-train.yaml --workers 1
    simplan collect --env mypkg.myenv:MyEnv --fold train --policies expert --limit 5 --out runs/data/my.jsonl

--env is a built-in or installed plugin name (`simplan envs list`) or package.module:Class.

Re-running the same command resumes: episodes already in --out are skipped. Policies, noise and
recovery are described in `simplan.data.policies`. Exit status: 0 when every planned episode is in
the file (errored ones included, listed in the summary), 1 when some could not be written.
"""

from __future__ import annotations

import sys

from simplan.core.config import parse_config
from simplan.core.io import check_output_file
from simplan.data.collect import CollectConfig, collect
from simplan.scripts.cli import command, usage_errors


@command("simplan collect")
def main(argv: list[str] | None = None) -> int:
    (cfg,) = parse_config([CollectConfig], argv, description=__doc__.split("\n")[0], prog="simplan collect")
    check_output_file(cfg.out)
    with usage_errors(ImportError):  # an env whose package is missing, found before any episode runs
        report = collect(cfg)
    print(report.summary())
    if report.statuses["errored"]:
        print(
            f"{report.statuses['errored']} episode(s) errored (status 'errored' in {cfg.out}, message in 'error'); "
            "re-run with --retry-errored to collect them again",
            file=sys.stderr,
        )
    return 1 if report.unfinished else 0


if __name__ == "__main__":
    sys.exit(main())
