"""`simplan import`: chat transcripts (OpenAI messages or ShareGPT conversations) as trajectory JSONL.

    simplan import --format openai tests/data/openai_chat.jsonl --out runs/data/imported-openai.jsonl
    simplan import --format sharegpt tests/data/sharegpt.jsonl --env my-tools --fold dev

Each input line is one conversation (the mapping is described in `simplan.data.importers`). A line
that cannot be converted is reported as FILE:LINE: reason and the other lines are still converted
and written. The output validates (`simplan validate`) and builds (`simplan build`). Exit status: 0
when every line converted, 1 if any line failed, 2 for a usage error or a missing file.
"""

from __future__ import annotations

import argparse
import sys

from simplan.core.config import parse_config
from simplan.core.io import check_output_file
from simplan.data.importers import ImportConfig, import_file
from simplan.scripts.cli import command


def _positional(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", help="JSONL file, one conversation per line")


@command("simplan import")
def main(argv: list[str] | None = None) -> int:
    cfg, args = parse_config(
        [ImportConfig], argv, description=__doc__.split("\n")[0], prog="simplan import", extra=_positional
    )
    if cfg.out:
        check_output_file(cfg.out)
    report = import_file(args.file, cfg)
    print(report.summary(), file=sys.stdout if report.ok else sys.stderr)
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
