"""Print the host-data table, or write it into a Markdown file between its markers.

    python -m sglang_fleet.hostconfig                    # the table, on stdout
    python -m sglang_fleet.hostconfig --write docs/host-data.md  # the doc's table, made anew
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from sglang_fleet.hostconfig.table import TABLE


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sglang_fleet.hostconfig",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--write", metavar="FILE", type=Path,
                        help="replace the table between the markers in this file")
    args = parser.parse_args(argv)
    if args.write is None:
        sys.stdout.write(TABLE.text())
        return 0
    wrong = TABLE.write(args.write)
    if wrong:
        print(f"error: {wrong}", file=sys.stderr)
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
