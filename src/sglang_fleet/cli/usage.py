"""The command line's conventions: every command's help, usage errors (exit 2), and the
``type=`` of each option whose value can be judged from its text alone.

A problem in what an option names (a profile, a log) is an input problem (exit 1); a value
wrong as written (a count below 1, a URL without a scheme) a usage error, before anything is read.
"""

from __future__ import annotations

import argparse
import math
import sys
import textwrap
from collections.abc import Callable
from typing import Any, NoReturn

from sglang_fleet.config import releases, validators
from sglang_fleet.errors import InputError, Problem
from sglang_fleet.roll import scale

USAGE_ERROR = 2
HELP_WIDTH = 88
# shtab's completion of a file name argument (its shtab.FILE), without importing shtab here.
FILE = {"bash": "_shtab_compgen_files", "zsh": "_files", "tcsh": "f"}


class UsageError(Exception):
    """A command line argparse refuses: the parser that refused it, and why."""

    def __init__(self, parser: argparse.ArgumentParser, message: str) -> None:
        super().__init__(message)
        self.parser = parser
        self.message = message

    def problem(self) -> Problem:
        """The refusal as a problem: source the command, key the argument it names."""
        key, message = "", self.message
        if message.startswith("argument ") and ": " in message:
            key, _, message = message.removeprefix("argument ").partition(": ")
        return Problem(self.parser.prog, key, message,
                       f"see {self.parser.prog} --help for its usage")

    def report(self) -> int:
        """argparse's own report: the usage, then ``PROG: error: PROBLEM``."""
        self.parser.print_usage(sys.stderr)
        print(f"{self.parser.prog}: error: {self.message}", file=sys.stderr)
        return USAGE_ERROR


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are raised (``UsageError``), not exits, to be said as
    lines or JSON. ``commands``: the subcommands' parsers by name (on the top parser)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.commands: dict[str, argparse.ArgumentParser] = {}

    def error(self, message: str) -> NoReturn:
        raise UsageError(self, message)


def command(sub: argparse._SubParsersAction[Any], name: str, *,
            help: str, description: str, examples: list[str],
            exit_codes: list[str] | None = None) -> argparse.ArgumentParser:
    """A subcommand whose ``--help`` has its description, examples and ``exit_codes``
    (``"1  what it means"`` each)."""
    epilog = "examples:\n" + "\n".join(f"  {example}" for example in examples)
    if exit_codes:
        epilog += "\n\nexit status:\n" + "\n".join(
            textwrap.fill(code, HELP_WIDTH, initial_indent="  ", subsequent_indent="     ")
            for code in exit_codes)
    parser: argparse.ArgumentParser = sub.add_parser(
        name, help=help, description=textwrap.fill(description, HELP_WIDTH), epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    return parser


def files(action: argparse.Action) -> argparse.Action:
    action.complete = FILE  # type: ignore[attr-defined]  # read by shtab
    return action


def _typed(name: str, check: Callable[[str], Any]) -> Callable[[str], Any]:
    check.__name__ = name
    return check


def count(low: int, example: str) -> Callable[[str], int]:
    def read(text: str) -> int:
        try:
            value = int(text.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a whole number, got {text!r} "
                                             f"(e.g. {example})") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be at least {low}, got {value} "
                                             f"(e.g. {example})")
        return value

    return _typed("count", read)


def share(low: int, example: str) -> Callable[[str], str]:
    """A count of at least ``low``, or a percentage from 1% to 100% (of hosts)."""
    def read(text: str) -> str:
        try:  # the roll's own reading of it, with no fleet yet to take the percentage of
            scale.amount(example.split()[0], text, total=0, minimum=low)
        except InputError:
            raise argparse.ArgumentTypeError(
                f"must be a count of at least {low} or a percentage from 1% to 100%, got "
                f"{text!r} (e.g. {example})") from None
        return text.strip()

    return _typed("count or percentage", read)


def seconds(low: float, high: float | None, example: str) -> Callable[[str], float]:
    span = f"from {low:g} to {high:g}" if high is not None else f"of at least {low:g}"

    def read(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not math.isfinite(value) or value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"must be seconds {span}, got {text!r} "
                                             f"(e.g. {example})")
        return value

    return _typed("seconds", read)


def release(text: str) -> str:
    wrong = releases.version_problem(text)
    if wrong:
        raise argparse.ArgumentTypeError(wrong)
    return text


def url(example: str) -> Callable[[str], str]:
    """An http(s) URL with a host (never echoed whole: it may hold user:password@)."""
    def read(text: str) -> str:
        wrong = validators.url_problem(text, allow_http=True)
        if wrong:
            raise argparse.ArgumentTypeError(f"{wrong}; e.g. {example}")
        return text

    return _typed("url", read)


def data_pair(text: str) -> str:
    """A ``--data KEY=VALUE`` pair as pyinfra reads it (the key's own rules come later, with
    the host's data: a value its key refuses is an input problem)."""
    from sglang_fleet.errors import InputError
    from sglang_fleet.fleet.inventory import parse_data

    try:
        parse_data([text])
    except InputError as err:
        problem = err.problems[0]
        raise argparse.ArgumentTypeError(f"{problem.key}: {problem.message} "
                                         f"({problem.fix})") from None
    return text
