"""`simplan report RUN... --out DIR`: Markdown + self-contained HTML report comparing eval runs.

    simplan report runs/eval/twx-dev --out runs/report
    simplan report runs/eval/before runs/eval/after --out runs/report/compare --title "before vs after"

RUN is an eval run folder (`simplan eval --out`) or a traces.jsonl file. Every number is computed
from the runs' trace files (named with their SHA-256 in the report). See `simplan.evaluation.report`.
"""

from __future__ import annotations

import sys

from simplan.core.config import ShortErrorParser
from simplan.core.io import check_output_folder
from simplan.evaluation.report import write_report
from simplan.scripts.cli import command


@command("simplan report")
def main(argv: list[str] | None = None) -> int:
    parser = ShortErrorParser(prog="simplan report", description=__doc__.split("\n")[0])
    parser.add_argument("runs", nargs="+", help="eval run folders or traces.jsonl files")
    parser.add_argument("--out", required=True, help="folder for report.md, report.html and plots/")
    parser.add_argument("--title", default="simplan evaluation report", help="report title")
    args = parser.parse_args(argv)
    check_output_folder(args.out)
    paths = write_report(args.runs, args.out, title=args.title)
    print(f"report: {paths['md']}\nreport: {paths['html']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
