"""How the commands say problems: as lines (``error: SOURCE: KEY: what`` and its ``fix:``) or,
under ``--json`` (``check``, ``roll``, ``status``), as one JSON object on stdout with the exit
status the lines would have had.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, TextIO

from sglang_fleet.errors import Problem

if TYPE_CHECKING:
    from sglang_fleet.config.checking import Report

JSON_COMMANDS = ("check", "roll", "status")


def as_json(problems: Iterable[Problem]) -> list[dict[str, str]]:
    return [{"source": p.source, "key": p.key, "problem": p.message, "fix": p.fix}
            for p in problems]


def show(problems: Iterable[Problem], kind: str, out: TextIO) -> None:
    """``KIND: SOURCE: KEY: what is wrong`` and its ``fix:`` line, for each problem."""
    for problem in problems:
        text = str(problem) if problem.fix else str(problem).partition("\n    fix: ")[0]
        print(f"{kind}: {text}", file=out)


def report_json(report: Report) -> dict[str, Any]:
    """A check's report as ``check --json`` prints it (besides what was checked)."""
    return {"ok": report.ok, "sglang_version": report.launch.version if report.launch else None,
            "architecture": report.architecture,
            **{kind: as_json(getattr(report, kind)) for kind in ("errors", "warnings", "notes")}}


def show_report(report: Report) -> None:
    """Errors on stderr; warnings and notes on stdout."""
    show(report.errors, "error", sys.stderr)
    show(report.warnings, "warning", sys.stdout)
    show(report.notes, "note", sys.stdout)


def print_errors(problems: Iterable[Problem], out: TextIO, **more: Any) -> None:
    """The errors as a command's JSON document: ``{"errors": [...]}`` (and ``more``)."""
    print(json.dumps({**more, "errors": as_json(problems)}, indent=2), file=out)


def wants_json(argv: list[str]) -> bool:
    """Whether a command line asks for JSON (read before argparse, for its usage errors)."""
    words = argv[:argv.index("--")] if "--" in argv else argv
    return bool(words) and words[0] in JSON_COMMANDS and "--json" in words
