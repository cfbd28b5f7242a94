"""Print the host-data table, or write it into a Markdown file between its markers.

    python -m sglang_fleet.hostconfig                    # the table, on stdout
    python -m sglang_fleet.hostconfig --write docs/host-data.md  # the doc's table, made anew
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from sglang_fleet.hostconfig.table import table, with_table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sglang_fleet.hostconfig",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--write", metavar="FILE", type=Path,
                        help="replace the table between the markers in this file")
    args = parser.parse_args(argv)
    if args.write is None:
        sys.stdout.write(table())
        return 0
    try:
        args.write.write_text(with_table(args.write.read_text()))
    except (OSError, ValueError) as err:
        print(f"error: {args.write}: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
