"""How the commands say problems: as lines (``error: SOURCE: KEY: what`` and its ``fix:``) or,
under ``--json``, as objects.

    show([problem], "warning", sys.stdout)         # warning: p.yaml: model.architecture: ...
    as_json([problem])   # [{"source": "p.yaml", "key": "...", "problem": "...", "fix": "..."}]

``check``, ``roll`` and ``status`` take ``--json``; their errors then are one JSON object on
stdout, ``{"errors": [...]}``, with the exit status the lines would have had.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any, TextIO

from sglang_fleet.errors import Problem

# The commands whose --json covers their errors too.
JSON_COMMANDS = ("check", "roll", "status")


def as_json(problems: Iterable[Problem]) -> list[dict[str, str]]:
    return [{"source": p.source, "key": p.key, "problem": p.message, "fix": p.fix}
            for p in problems]


def show(problems: Iterable[Problem], kind: str, out: TextIO) -> None:
    """``KIND: SOURCE: KEY: what is wrong`` and its ``fix:`` line, for each problem."""
    for problem in problems:
        text = str(problem) if problem.fix else str(problem).partition("\n    fix: ")[0]
        print(f"{kind}: {text}", file=out)


def print_errors(problems: Iterable[Problem], out: TextIO, **more: Any) -> None:
    """The errors as a command's JSON document: ``{"errors": [...]}`` (and ``more``)."""
    print(json.dumps({**more, "errors": as_json(problems)}, indent=2), file=out)


def wants_json(argv: list[str]) -> bool:
    """Whether a command line asks a JSON command for JSON (before argparse reads it: a
    usage error is said as JSON too)."""
    words = argv[:argv.index("--")] if "--" in argv else argv
    return bool(words) and words[0] in JSON_COMMANDS and "--json" in words
