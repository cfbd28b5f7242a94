"""Why an SGLang server ended, from its journal lines (standard library only: the gate runs it
on the host; ``status`` reads the same lines over SSH).

A crashed SGLang server's last lines are its cleanup, not its cause: the scheduler logs
``Scheduler hit an exception: Traceback ...`` (the exception's own line ends the traceback,
lines later), the server's SIGQUIT handler logs that a child failed and, from 0.5.13,
``kill_process_tree called: ...``; systemd then says the main process was killed. Within the
one invocation that ended (see ``cause``) the cause is the first of these that is there:

  - the OOM killer's line, from systemd (a child it killed looks like a crash);
  - the first ``... hit an exception: Traceback`` and its exception line, the first after the
    frames (a scheduler, the detokenizer, the tokenizer manager or the DP controller:
    managers/*.py, 0.5.10 - 0.5.23; with tp > 1 the other ranks' errors follow the first);
  - ``Subprocess NAME (pid=P) crashed with exit code C. ...`` (utils/watchdog.py
    SubprocessWatchdog: a child that died outright);
  - ``Scheduler watchdog timeout (...)`` (utils/watchdog.py: a batch that hung);
  - the exception of the last other traceback (an error in the server process itself);
  - from systemd (only in a unit's whole journal, ``journalctl -u``): ``Main process exited,
    code=killed, status=9/KILL`` (or a non-zero exit), or, for a restart after an end systemd
    counted clean (it logs a SIGKILL listed in SuccessExitStatus at debug level only), "killed
    by SIGKILL, no error logged"; else its ``Failed with result '...'``.

    cause(["Scheduler hit an exception: Traceback (most recent call last):",
           '  File "x.py", line 1, in f', "RuntimeError: CUDA out of memory",
           "SIGQUIT received. ... It usually means one child failed."])
    # 'Scheduler hit an exception: RuntimeError: CUDA out of memory'
"""

from __future__ import annotations

import re

# A name is tried only where a word starts ``(?<!\w)``: a server's line is any length, and
# ``\w+`` tried from every letter of a long word costs the square of its length (24K letters:
# 3.6 s); from its first letter alone, the word is read once (bench/crash_regex.py).
HIT = re.compile(r"(?<!\w)(\w+) hit an exception: ?(.*)$")
WATCHDOG_CHILD = re.compile(r"Subprocess \S+ \(pid=\d+\) crashed with exit code -?\d+\.")
WATCHDOG_HANG = re.compile(r"(?<!\w)\w+ watchdog timeout \(")
# systemd's messages for the unit (``-o cat``): how it ended, an unplanned end, and where an
# invocation begins
OOM = re.compile(r"A process of this unit has been killed by the OOM killer\.")
KILLED = re.compile(rf"({OOM.pattern}"
                    r"|Main process exited, code=(killed|dumped), status=\S+"
                    r"|Main process exited, code=exited, status=[1-9]\S*)")
RESTARTED = re.compile(r"Scheduled restart job, restart counter is at \d+")
FAILED = re.compile(r"Failed with result '[\w-]+'\.")
ENDED = re.compile(f"{RESTARTED.pattern}|{FAILED.pattern}|{KILLED.pattern}")
# The invocation is over (whether or not systemd will restart it)
GONE = re.compile(f"Deactivated successfully\\.|{FAILED.pattern}|{KILLED.pattern}")
STARTED = re.compile(r"^Start(ed|ing) [\w@.:-]+\.service\b")
TRACEBACK = re.compile(r"^Traceback \(most recent call last\):")
CHAIN = ("During handling of the above exception", "The above exception was the direct cause",
         "Traceback (most recent call last)")
# A journal line's own prefix, as SGLang formats it: "[2026-12-01 10:33:21 TP0] "
PREFIX = re.compile(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d[^\]]*\] ")


def _text(line: str) -> str:
    return PREFIX.sub("", line.rstrip())


def _exception_after(lines: list[str], start: int) -> str | None:
    """The exception line that ends the traceback whose header is just before ``lines[start]``:
    the first line after its frames (indented) that is not a chaining sentence."""
    for line in lines[start:start + 400]:
        text = _text(line)
        if not text or text[0].isspace() or text.startswith(CHAIN):
            continue
        return text
    return None


def cause(lines: list[str]) -> str | None:
    """The line that says why the server last ended, as above (None: no sign of a crash).

    In a unit's whole journal (systemd's lines in it) the search is bounded to one invocation:
    the last one if it ended (a crash loop waiting out RestartSec), else the one before the
    last unplanned end systemd reports (a restart it scheduled, a failure); never an earlier
    crash, nor a traceback of a server still running."""
    start = _last(lines, STARTED)
    if start is not None:
        tail = lines[start:]
        ended = _last(tail, GONE)
        if ended is not None:
            return _window(tail[:ended + 1])
    end = _last(lines, ENDED)
    if end is None:
        return _sglang_cause(lines, generic=start is None)
    return _window(lines[(_last(lines[:end], STARTED) or 0):end + 1])


def _window(lines: list[str]) -> str | None:
    """The cause of the one invocation ``lines`` hold, up to its end."""
    for line in lines:  # the kernel's word first: a child it killed looks like a crash
        oom = OOM.search(line)
        if oom:
            return oom.group(0)
    own = _sglang_cause(lines, generic=True)
    if own:
        return own
    for line in lines:
        killed = KILLED.search(_text(line))
        if killed:
            return killed.group(0)
    if any(RESTARTED.search(_text(line)) for line in lines) and any(
            "Deactivated successfully." in line for line in lines):
        # Restart=on-failure restarted an end that SuccessExitStatus counts clean: only
        # RestartForceExitStatus=SIGKILL does that, and systemd logs its exit at debug level.
        return "killed by SIGKILL, no error logged (the OOM killer, or kill -9)"
    failed = _last(lines, FAILED)
    return _text(lines[failed]).split(": ", 1)[-1] if failed is not None else None


def _last(lines: list[str], pattern: re.Pattern[str]) -> int | None:
    for i in range(len(lines) - 1, -1, -1):
        if pattern.search(_text(lines[i])):
            return i
    return None


def _sglang_cause(lines: list[str], generic: bool) -> str | None:
    """The first cause SGLang logged in ``lines`` (with tp > 1 the other ranks' errors follow
    the first one's); else, if ``generic``, the exception of the last traceback."""
    for i, line in enumerate(lines):
        text = _text(line)
        hit = HIT.search(text)
        if hit:
            who, rest = hit.groups()
            found = _exception_after(lines, i + 1) if rest.startswith("Traceback") else rest
            return f"{who} hit an exception: {found or rest or 'no exception line'}"
        if WATCHDOG_CHILD.search(text) or WATCHDOG_HANG.search(text):
            return text
    if generic:
        header = _last(lines, TRACEBACK)
        if header is not None:
            return _exception_after(lines, header + 1)
    return None
