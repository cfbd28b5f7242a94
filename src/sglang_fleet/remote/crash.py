"""Why an SGLang server ended, from its journal lines (standard library only: the gate runs it
on the host; ``status`` reads the same lines over SSH).

A crashed SGLang server's last lines are its cleanup, not its cause: the scheduler logs
``Scheduler hit an exception: Traceback ...`` (the exception's own line ends the traceback,
lines later), the server's SIGQUIT handler logs that a child failed and, from 0.5.13,
``kill_process_tree called: ...``; systemd then says the main process was killed. The cause is
the last of these, latest first:

  - the exception line that ends a ``... hit an exception: Traceback`` (a scheduler, the
    detokenizer, the tokenizer manager or the DP controller: managers/*.py, 0.5.10 - 0.5.23);
  - ``Subprocess NAME (pid=P) crashed with exit code C. ...`` (utils/watchdog.py
    SubprocessWatchdog: a child that died outright);
  - ``Scheduler watchdog timeout (...)`` (utils/watchdog.py: a batch that hung);
  - the last line of any other traceback (an error in the server process itself);
  - ``Main process exited, code=killed, status=9/KILL`` (or a non-zero exit), the OOM killer's
    line, from systemd (only in a unit's whole journal, ``journalctl -u``): killed from outside.

    cause(["Scheduler hit an exception: Traceback (most recent call last):",
           '  File "x.py", line 1, in f', "RuntimeError: CUDA out of memory",
           "SIGQUIT received. ... It usually means one child failed."])
    # 'Scheduler hit an exception: RuntimeError: CUDA out of memory'
"""

from __future__ import annotations

import re

HIT = re.compile(r"(\w+) hit an exception: ?(.*)$")
WATCHDOG_CHILD = re.compile(r"Subprocess \S+ \(pid=\d+\) crashed with exit code -?\d+\.")
WATCHDOG_HANG = re.compile(r"\w+ watchdog timeout \(")
EXCEPTION_LINE = re.compile(r"^([A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)|[A-Z]\w*Error)"
                            r"(: .*)?$")
KILLED = re.compile(r"(Main process exited, code=(killed|dumped), status=\S+"
                    r"|Main process exited, code=exited, status=[1-9]\S*"
                    r"|A process of this unit has been killed by the OOM killer\."
                    r"|Failed with result '[\w-]+'\.)")
# systemd's job messages for the unit (``-o cat``): where an invocation begins
STARTED = re.compile(r"^Start(ed|ing) [\w@.:-]+\.service\b")
# A journal line's own prefix, as SGLang formats it: "[2026-12-01 10:33:21 TP0] "
PREFIX = re.compile(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d[^\]]*\] ")


def _text(line: str) -> str:
    return PREFIX.sub("", line.rstrip())


def _exception_after(lines: list[str], start: int) -> str | None:
    """The exception line that ends the traceback starting at ``lines[start]``."""
    for line in lines[start:start + 400]:
        text = _text(line)
        if EXCEPTION_LINE.match(text):
            return text
    return None


def cause(lines: list[str]) -> str | None:
    """The line that says why the server last ended, as above (None: no sign of a crash). In a
    unit's whole journal the last end systemd reports bounds the search: the cause is looked
    for between it and the start before it, never in an earlier crash."""
    end = _last(lines, KILLED)
    if end is None:
        return _sglang_cause(lines)
    start = _last(lines[:end], STARTED) or 0
    killed = KILLED.search(_text(lines[end]))
    return _sglang_cause(lines[start:end]) or (killed.group(0) if killed else None)


def _last(lines: list[str], pattern: re.Pattern[str]) -> int | None:
    for i in range(len(lines) - 1, -1, -1):
        if pattern.search(_text(lines[i])):
            return i
    return None


def _sglang_cause(lines: list[str]) -> str | None:
    """The latest cause SGLang itself logged in ``lines``."""
    for i in range(len(lines) - 1, -1, -1):
        text = _text(lines[i])
        hit = HIT.search(text)
        if hit:
            who, rest = hit.groups()
            line = rest if EXCEPTION_LINE.match(rest) else _exception_after(lines, i + 1)
            return f"{who} hit an exception: {line or rest or 'no exception line'}"
        if WATCHDOG_CHILD.search(text) or WATCHDOG_HANG.search(text):
            return text
        if text.startswith("Traceback (most recent call last)"):
            found = _exception_after(lines, i + 1)
            if found:
                return found
    return None
