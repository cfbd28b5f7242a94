"""``sglang-fleet``: render and check serving profiles, smoke-test servers, roll a fleet through
its router, and run the lab.

Exit status: 0 fine, 1 a problem in the input (the message names file, key and fix),
2 a usage error, 3 an internal error (a bug: one line, and the file holding the traceback).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import traceback
from collections.abc import Sequence

from sglang_fleet.cli import fleet_commands, job_commands, profile_commands, server_commands
from sglang_fleet.errors import InputError, Problem

INTERNAL_ERROR = 3
# The lab's commands: its own package (a workspace member), never imported by the product's.
LAB_PACKAGE = "lab/fleet-lab"
LAB_COMMANDS = {"lab": "simulated B200 hosts on this machine (needs root; the lab package)",
                "demo": "lab up, deploy, router, smoke: the whole product on lab hosts "
                        "(the lab package)"}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sglang-fleet", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    # One module per group of commands, in the order --help lists them.
    profile_commands.add_parsers(sub)
    server_commands.add_parsers(sub)
    fleet_commands.add_parsers(sub)
    job_commands.add_parsers(sub)
    for name, what in LAB_COMMANDS.items():  # listed here, parsed by the lab (run_lab)
        sub.add_parser(name, help=what, add_help=False)
    return parser


def run_lab(argv: list[str]) -> int:
    """``sglang-fleet lab …`` and ``demo``: the lab package's commands, imported only for them
    (the product does not depend on the lab); without the lab, one line on how to install it.

        run_lab(["lab", "status"])  # the lab's hosts, or: the lab is not installed ...
    """
    try:
        from sglang_fleet_lab import cli as lab_cli
    except ModuleNotFoundError as exc:
        if exc.name != "sglang_fleet_lab":  # the lab is there but broken: a bug, said as one
            raise
        print(f"sglang-fleet {argv[0]}: the lab is not installed; it is its own package, "
              f"{LAB_PACKAGE}: run uv sync in a checkout (it is in the dev group), or "
              f"pip install ./{LAB_PACKAGE}", file=sys.stderr)
        return 2
    return lab_cli.main(argv)


def report_problems(problems: list[Problem]) -> None:
    """``error: SOURCE: KEY: what is wrong`` and its ``fix:`` line, for each problem."""
    for problem in problems:
        print(f"error: {problem}", file=sys.stderr)


def report_internal_error(exc: BaseException) -> int:
    """A bug: one line on stderr, the traceback in a file (never a bare traceback)."""
    summary = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]
    try:
        with tempfile.NamedTemporaryFile("w", prefix="sglang-fleet-crash-", suffix=".txt",
                                         delete=False) as out:
            traceback.print_exception(exc, file=out)
        where = f"traceback in {out.name}"
    except OSError as err:
        where = f"and the traceback could not be saved: {err.strerror}"
    print(f"internal error (a bug in sglang-fleet, please report it): {summary}; {where}",
          file=sys.stderr)
    return INTERNAL_ERROR


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    lab = bool(argv) and argv[0] in LAB_COMMANDS
    args = None if lab else _parser().parse_args(argv)
    if args is not None:
        args.argv = argv  # as given: the commands printed back (resume, retry) repeat it
    try:
        code: int = run_lab(argv) if args is None else args.func(args)
    except InputError as exc:
        report_problems(exc.problems)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader went away (| head): not a bug, nothing more to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except Exception as exc:  # every other exception is a bug: say so in one line
        return report_internal_error(exc)
    return code

