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
  - from systemd (only in a unit's whole journal, ``journalctl -u``): ``Main process exited,
    code=killed, status=9/KILL`` (or a non-zero exit), the OOM killer's line, or, for a restart
    after an end systemd counted clean (it logs a SIGKILL listed in SuccessExitStatus at debug
    level only), "killed by SIGKILL, no error logged": killed from outside.

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
# systemd's messages for the unit (``-o cat``): how it ended, an unplanned end, and where an
# invocation begins (KILLED's first match wins in the search, so the OOM killer's line comes
# before the exit it caused)
KILLED = re.compile(r"(A process of this unit has been killed by the OOM killer\."
                    r"|Main process exited, code=(killed|dumped), status=\S+"
                    r"|Main process exited, code=exited, status=[1-9]\S*)")
RESTARTED = re.compile(r"Scheduled restart job, restart counter is at \d+")
ENDED = re.compile(RESTARTED.pattern + r"|Failed with result '[\w-]+'\.|" + KILLED.pattern)
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
    unit's whole journal the last unplanned end systemd reports (a restart it scheduled, a
    failure) bounds the search: the cause is looked for between it and the start before it,
    never in an earlier crash."""
    end = _last(lines, ENDED)
    if end is None:
        return _sglang_cause(lines)
    start = _last(lines[:end], STARTED) or 0
    own = _sglang_cause(lines[start:end])
    if own:
        return own
    for line in lines[start:end + 1]:
        killed = KILLED.search(_text(line))
        if killed:
            return killed.group(0)
    if RESTARTED.search(_text(lines[end])) and any(
            "Deactivated successfully." in line for line in lines[start:end]):
        # Restart=on-failure restarted an end that SuccessExitStatus counts clean: only
        # RestartForceExitStatus=SIGKILL does that, and systemd logs its exit at debug level.
        return "killed by SIGKILL, no error logged (the OOM killer, or kill -9)"
    return _text(lines[end]).split(": ", 1)[-1]


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
