"""A table of text cells that fits the terminal: the essential columns always (cut with ``…``
only when even they do not fit), the others as columns while they fit, the rest of a row folded
under it as ``name value`` lines, wrapped; a value every row shares is said once after the
table instead of in every row. No line is longer than the width.

    >>> print(fit(["host", "state", "release", "notes"],
    ...           [["gpu1", "active", "0.5.23", ""],
    ...            ["gpu2", "failed", "0.5.23", "FATAL xid-79 (GPU 0): reset the GPU or reboot"]],
    ...           essential=["host", "state"], width=40))
    host  state
    gpu1  active
    gpu2  failed
        notes FATAL xid-79 (GPU 0): reset
          the GPU or reboot
    every row: release 0.5.23

The width is the terminal's (``COLUMNS`` when set, else 80 when it is no terminal), at
least 40 (``terminal_width()``).
"""

from __future__ import annotations

import shutil
import textwrap
from collections.abc import Sequence

MIN_WIDTH = 40
GAP = "  "  # between two columns
FOLD = "    "  # before a folded ``name value`` line
# A cell that says nothing, never folded: "" does not apply to its row (not counted when a
# value is shared), "-" is a value not known (then no value is shared).
BLANK = ("", "-")


def terminal_width() -> int:
    """The terminal's columns (``COLUMNS`` honoured; 80 when none is known), at least 40."""
    return max(MIN_WIDTH, shutil.get_terminal_size((80, 24)).columns)


def cut(text: str, room: int) -> str:
    """``text`` in ``room`` characters: cut with ``…`` when longer.

        >>> cut("active/running", 8)
        'active/…'
    """
    return text if len(text) <= room else text[:max(room - 1, 0)] + "…"


def _shared(columns: Sequence[str], rows: Sequence[Sequence[str]],
            essential: set[str]) -> list[int]:
    """The columns (not essential) whose value is the same in every row it applies to, two
    rows or more."""
    found = []
    for i, name in enumerate(columns):
        said = [row[i] for row in rows if row[i] != ""]
        if name not in essential and len(said) > 1 and len(set(said)) == 1 and \
                said[0] not in BLANK:
            found.append(i)
    return found


def _squeeze(widths: list[int], room: int) -> list[int]:
    """Column widths cut, widest first, until they and their gaps fit in ``room``."""
    widths = list(widths)
    while sum(widths) + len(GAP) * (len(widths) - 1) > room and max(widths) > 1:
        widths[widths.index(max(widths))] -= 1
    return widths


def _wrapped(text: str, room: int, indent: str) -> list[str]:
    return textwrap.wrap(text, room, initial_indent=indent, subsequent_indent=indent + "  ",
                         break_long_words=True, break_on_hyphens=False) or [indent.rstrip()]


def _folded(pairs: list[str], room: int) -> list[str]:
    """``name value`` pairs under a row: as many to a line as fit (two spaces apart), a pair
    too long for a line wrapped on lines of its own."""
    lines: list[str] = []
    line = ""
    for pair in pairs:
        if line and len(line) + len(GAP) + len(pair) <= room:
            line += GAP + pair
            continue
        if line:
            lines.append(line)
        line = FOLD + pair
        if len(line) > room:
            lines += _wrapped(pair, room, FOLD)
            line = ""
    return [*lines, *([line] if line else [])]


def wrap(lines: Sequence[str], width: int | None = None) -> list[str]:
    """Lines of prose wrapped to ``width`` (the terminal's), a long line's rest indented."""
    room = max(width or terminal_width(), MIN_WIDTH)
    return [part for line in lines for part in _wrapped(line, room, "")]


def fit(columns: Sequence[str], rows: Sequence[Sequence[str]], *,
        essential: Sequence[str], width: int | None = None,
        shared_label: str = "every row") -> str:
    """``rows`` (cells in the order of ``columns``) as text at most ``width`` wide (the
    terminal's by default). Columns join the table in the order given (so put the important
    ones first) while they fit; ``essential`` ones always. A cell empty or ``-`` is not folded
    and a column whose value every row shares (rows where it is empty aside) is said once,
    after the table, as ``SHARED_LABEL: name value``."""
    room = max(width or terminal_width(), MIN_WIDTH)
    keep = set(essential)
    shared = _shared(columns, rows, keep)
    rest = [i for i in range(len(columns)) if i not in shared]
    natural = {i: max([len(columns[i]), *(len(row[i]) for row in rows)]) for i in rest}
    shown = [i for i in rest if columns[i] in keep]
    used = sum(natural[i] for i in shown) + len(GAP) * (len(shown) - 1)
    for i in rest:
        if i not in shown and used + len(GAP) + natural[i] <= room:
            shown.append(i)
            used += len(GAP) + natural[i]
    shown.sort()
    widths = dict(zip(shown, _squeeze([natural[i] for i in shown], room), strict=True))
    lines = []
    for n, cells in enumerate([list(columns), *rows]):
        lines.append(GAP.join(cut(cells[i], widths[i]).ljust(widths[i]) for i in shown)
                     .rstrip())
        if n:  # the header has nothing to fold
            lines += _folded([f"{columns[i]} {cells[i]}" for i in rest
                              if i not in shown and cells[i] not in BLANK], room)
    for i in shared:
        value = next(row[i] for row in rows if row[i] not in BLANK)
        lines += _wrapped(f"{shared_label}: {columns[i]} {value}", room, "")
    return "\n".join(lines)
