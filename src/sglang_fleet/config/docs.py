"""The profile keys, described from their declarations (``config/profile.py``): the table of
docs/profile.md, and one key's help.

    uv run python -m sglang_fleet.config.docs                     # the table, in Markdown
    uv run python -m sglang_fleet.config.docs memory.page_size    # one key, as --help says it
    uv run python -m sglang_fleet.config.docs --write docs/profile.md   # the doc's table, made anew

``sglang-fleet keys [KEY ...]`` prints the first two as well.
"""

from __future__ import annotations

import difflib
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sglang_fleet.config.keys import REQUIRED, Declared, Table, declared
from sglang_fleet.config.profile import Profile


def _yaml(value: Any) -> str:
    """A default as a profile would write it."""
    if value is REQUIRED:
        return "required"
    if value is None:
        return "`null`"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, tuple | list):
        return f"`[{', '.join(map(str, value))}]`"
    if isinstance(value, dict):
        return "`{}`" if not value else f"`{value}`"
    return f"`{value}`"


def _flag(key: Declared) -> str:
    if key.flag is None:
        return ""
    return f"`{key.flag}` when false" if key.negated else f"`{key.flag}`"


def row(key: Declared) -> tuple[str, ...]:
    """(key, type, default, flag, meaning) of one key, as the table shows them.

    >>> row(find("parallel.tp"))
    ('`parallel.tp`', 'integer', '`1`', '`--tp-size`', 'GPUs per tensor-parallel group.')
    """
    kind = re.sub(r"\ban? ", "", key.type_name)  # "an integer or null" → "integer or null"
    return f"`{key.name}`", kind, _yaml(key.default), _flag(key), key.doc


TABLE = Table("profile-keys", ("Key", "Type", "Default", "SGLang flag", "Meaning"), row, Profile)


def find(name: str) -> Declared:
    for key in declared(Profile):
        if key.name == name:
            return key
    raise KeyError(name)


def unknown(name: str) -> str | None:
    """None for a key's name; else the fix for a misspelt one: its closest key.

    >>> unknown("memory.pagesize")
    'did you mean memory.page_size?'
    """
    names = [k.name for k in declared(Profile)]
    if name in names:
        return None
    close = difflib.get_close_matches(name, names, n=1)
    return f"did you mean {close[0]}?" if close else "sglang-fleet keys lists them all"


def describe(name: str) -> str:
    """One key as ``--help`` would say it: type, default, flag, meaning and how to write it.

    >>> print(describe("memory.page_size"))
    memory.page_size: integer or null, default null (SGLang --page-size)
      Tokens per KV cache page.
      write: tokens per KV page, e.g. 64
    """
    key = find(name)
    _, kind, default, flag, doc = row(key)
    flag = f" (SGLang {flag.replace('`', '')})" if flag else ""
    text = f"{name}: {kind}, default {default.replace('`', '')}{flag}\n  {doc}"
    return text + (f"\n  write: {key.fix}" if key.fix else "")


def main(argv: Sequence[str]) -> int:
    if argv[:1] == ["--write"] and len(argv) == 2:
        wrong = TABLE.write(Path(argv[1]))
        if wrong:
            print(wrong, file=sys.stderr)
        return 2 if wrong else 0
    if not argv:
        sys.stdout.write(TABLE.text())
        return 0
    for name in argv:
        fix = unknown(name)
        if fix:
            print(f"{name}: no such profile key; {fix}", file=sys.stderr)
            return 2
        print(describe(name))
    return 0

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
