"""``sglang-fleet``: render and check serving profiles, smoke-test servers, roll a fleet through
its router, and run the lab.

Exit status: 0 fine, 1 a problem in the input (the message names file, key and fix),
2 a usage error (a command line it cannot run: the usage, then the problem), 3 an internal
error (a bug: one line, and the file holding the traceback); capacity also exits 4 for a
partial report.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import traceback
from collections.abc import Sequence
from importlib import metadata
from typing import Any

from sglang_fleet.cli import (
    fleet_commands,
    job_commands,
    output,
    profile_commands,
    server_commands,
    usage,
)
from sglang_fleet.errors import InputError, Problem

INTERNAL_ERROR = 3
# The lab's commands: its own package (a workspace member), never imported by the product's.
LAB_PACKAGE = "lab/fleet-lab"
LAB_COMMANDS = {"lab": "simulated B200 hosts on this machine (needs root; the lab package)",
                "demo": "lab up, deploy, router, smoke: the whole product on lab hosts "
                        "(the lab package)"}


def version() -> str:
    try:
        return metadata.version("sglang-fleet")
    except metadata.PackageNotFoundError:
        from sglang_fleet import __version__

        return __version__


def _parser() -> usage.Parser:
    parser = usage.Parser(prog="sglang-fleet", description=__doc__,
                          formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    sub: argparse._SubParsersAction[Any] = parser.add_subparsers(dest="command", required=True)
    parser.commands = sub.choices
    # One module per group of commands, in the order --help lists them.
    profile_commands.add_parsers(sub)
    server_commands.add_parsers(sub)
    fleet_commands.add_parsers(sub)
    job_commands.add_parsers(sub)
    for name, what in LAB_COMMANDS.items():  # listed here, parsed by the lab (run_lab)
        sub.add_parser(name, help=what, add_help=False)
    p = usage.command(sub, "completion", help="a shell completion script for sglang-fleet",
                      description="Print the completion script of a shell: the commands, "
                      "their options and the choices of each (made by shtab from this "
                      "command line's own parser).",
                      examples=["sglang-fleet completion bash > "
                                "~/.local/share/bash-completion/completions/sglang-fleet",
                                "sglang-fleet completion zsh > ~/.zfunc/_sglang-fleet  "
                                "# a directory on $fpath"])
    p.add_argument("shell", choices=["bash", "zsh", "tcsh"])
    p.set_defaults(func=cmd_completion)
    return parser


def cmd_completion(args: argparse.Namespace) -> int:
    import shtab

    print(shtab.complete(_parser(), shell=args.shell), end="")
    return 0


def run_lab(argv: list[str]) -> int:
    """``sglang-fleet lab …`` and ``demo``: the lab package's commands, imported only for them
    (the product does not depend on the lab); without the lab, how to install it."""
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


def report_problems(problems: list[Problem], as_json: bool = False) -> None:
    if as_json:
        output.print_errors(problems, sys.stdout)
    else:
        output.show(problems, "error", sys.stderr)


def report_internal_error(exc: BaseException, as_json: bool = False) -> int:
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
    if as_json:
        output.print_errors([Problem("sglang-fleet", "", f"internal error: {summary}",
                                     f"a bug in sglang-fleet, please report it; {where}")],
                            sys.stdout)
    return INTERNAL_ERROR


def _parse(argv: list[str], as_json: bool) -> argparse.Namespace | int:
    """The command line, or the exit status of one that ends here (--help, a usage error)."""
    parser = _parser()
    try:
        args, extra = parser.parse_known_args(argv)
        if extra:  # said by the command's parser, with its usage (argparse: the top one's)
            parser.commands[args.command].error(f"unrecognized arguments: {' '.join(extra)}")
        return args
    except usage.UsageError as err:
        return _usage_error(err, as_json)
    except SystemExit as done:  # --help and --version print, then exit 0
        code = done.code
        return code if isinstance(code, int) else 0


def _usage_error(err: usage.UsageError, as_json: bool) -> int:
    if not as_json:
        return err.report()
    output.print_errors([err.problem()], sys.stdout)
    return usage.USAGE_ERROR


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    lab = bool(argv) and argv[0] in LAB_COMMANDS
    as_json = output.wants_json(argv)
    args = None if lab else _parse(argv, as_json)
    if isinstance(args, int):
        return args
    if args is not None:
        args.argv = argv  # as given: the commands printed back (resume, retry) repeat it
    try:
        code: int = run_lab(argv) if args is None else args.func(args)
    except InputError as exc:
        report_problems(exc.problems, as_json)
        return 1
    except usage.UsageError as err:  # options that only go together, found by the command
        return _usage_error(err, as_json)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader went away (| head): not a bug, nothing more to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except Exception as exc:  # every other exception is a bug: say so in one line
        return report_internal_error(exc, as_json)
    return code

