"""`simplan validate FILE...`: check trajectory JSONL files against the schema.

    simplan validate runs/data/twx-train.jsonl
    simplan validate runs/data/*.jsonl --keep-going --out runs/data/good.jsonl --rejects runs/data/bad.jsonl

Each bad line is reported as `FILE:LINE: field: problem` (bytes that are not UTF-8, torn JSON, a
schema problem, an id used before); `simplan build` checks lines the same way. The exit status is
1 if any line is bad (also with --keep-going, which additionally writes good lines to --out and bad
ones to --rejects, byte for byte; defaults: X.good.jsonl and X.rejects.jsonl next to the first
file), 2 for a usage error.
"""

from __future__ import annotations

import sys

from simplan.core.config import ShortErrorParser
from simplan.core.io import check_output_file
from simplan.data.validate import validate_files
from simplan.scripts.cli import command


@command("simplan validate")
def main(argv: list[str] | None = None) -> int:
    parser = ShortErrorParser(prog="simplan validate", description=__doc__.split("\n")[0])
    parser.add_argument("files", nargs="+", help="trajectory JSONL files")
    parser.add_argument("--keep-going", action="store_true", help="write good lines to --out, bad ones to --rejects")
    parser.add_argument("--out", default=None, help="good lines (with --keep-going; default X.good.jsonl)")
    parser.add_argument("--rejects", default=None, help="bad lines (with --keep-going; default X.rejects.jsonl)")
    parser.add_argument("--max-problems", type=int, default=50, help="problems to print (all are counted)")
    args = parser.parse_args(argv)
    if (args.out or args.rejects) and not args.keep_going:
        parser.error("--out/--rejects only apply with --keep-going")
    for flag, path in (("--out", args.out), ("--rejects", args.rejects)):
        if path:
            check_output_file(path, flag)
    report = validate_files(args.files, out_path=args.out, rejects_path=args.rejects, keep_going=args.keep_going)
    print(report.summary(args.max_problems), file=sys.stdout if report.ok else sys.stderr)
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
