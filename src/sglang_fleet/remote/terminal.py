"""Text a host gave (journal lines, a server's answers and errors, unit names read back) made
safe for a terminal (standard library only: the host programs import it relatively, and the
CLI imports it from here).

A control character in that text would reach the operator's terminal as a command: ESC or
CSI (0x9b) starts an escape sequence that can move the cursor, rewrite the line before it or
set the window title, and a carriage return or backspace lets a server's log line overwrite
what the gate printed (a forged crash cause). Every C0 and C1 control character and DEL is
shown instead as its code, ``\\x`` and two hex digits; a tab stays, and a newline stays only in
text meant to span lines:

    printable("\\x1b[2K\\rScheduler hit an exception: fake")
    # '\\\\x1b[2K\\\\x0dScheduler hit an exception: fake'
"""

from __future__ import annotations

_CONTROLS = [*range(0x20), *range(0x7F, 0xA0)]
_ONE_LINE = {code: f"\\x{code:02x}" for code in _CONTROLS if code != 0x09}
_LINES = {code: shown for code, shown in _ONE_LINE.items() if code != 0x0A}


def printable(text: str, lines: bool = False) -> str:
    """``text`` with its control characters shown as codes (``lines``: its newlines kept)."""
    return text.translate(_LINES if lines else _ONE_LINE)
