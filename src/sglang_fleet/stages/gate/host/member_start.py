"""The gate of a multi-node group's rank >= 1, run ON its host (standard library only): has its
server started, from its journal since the unit's current start?

A rank >= 1 serves no API: its port answers SGLang's dummy health server, 200 on ``/health``
whatever its schedulers and peers do, so its HTTP is no evidence (the project's multi-node
study, section 2). What every release prints once the node's schedulers are ready, after the
rendezvous with rank 0 and the weights, is the start line (0.5.10 utils/common.py:2482, 0.5.23
:3684)::

    Dummy health check server started in background thread at HOST:PORT

The rendezvous' end is logged before it (``Init torch distributed ends.`` up to 0.5.20,
``Init parallel ends.`` from 0.5.21) and is reported as how far a member got when its start
line never comes. A lost peer or a rendezvous timeout is a scheduler exception (``Scheduler hit
an exception``, a Traceback), then SIGKILL and systemd's restart.

    /usr/bin/env PYTHONPATH=/opt/sglang/tools/pythonpath python3 \\
        -m sglang_fleet.stages.gate.host.member_start --unit sglang.service --budget 1800

Prints human lines, then ``MEMBER <json>`` (``ok``, ``pid``: its MainPID then, ``line``,
``error``); exit 0 when it started.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

from sglang_fleet.remote import crash
from sglang_fleet.remote.terminal import printable

MARK = "MEMBER"
START = "Dummy health check server started in background thread at"
RENDEZVOUS = ("Init torch distributed ends", "Init parallel ends")
EXCEPTIONS = ("hit an exception", "Traceback (most recent call last)")
POLL = 1.0


def unit_state(unit: str) -> dict[str, str]:
    out = subprocess.run(["systemctl", "show", unit, "-p", "ActiveState,SubState,Result,"
                          "InvocationID,MainPID,ExecMainStartTimestamp"],
                         capture_output=True, text=True).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def journal(invocation: str) -> list[str]:
    """This invocation's lines only: an earlier start's start line proves nothing."""
    out = subprocess.run(["journalctl", f"_SYSTEMD_INVOCATION_ID={invocation}", "-o", "cat",
                          "--no-pager"], capture_output=True, text=True).stdout
    return out.splitlines()


def _first(lines: list[str], needles: tuple[str, ...], start: int = 0) -> int | None:
    return next((i for i in range(start, len(lines)) if any(n in lines[i] for n in needles)),
                None)


def judge(lines: list[str]) -> tuple[str, str]:
    """``("started", start line)``, ``("failed", why)`` or ``("waiting", how far)``.

        judge(["Init parallel ends. elapsed=1.02 s"])   # ('waiting', 'Init parallel ends...')
    """
    start = _first(lines, (START,))
    # before the start line only a scheduler's exception is fatal (a warning may carry a
    # traceback); after it, any traceback is the group failing under it
    exc = _first(lines, EXCEPTIONS[:1]) if start is None else \
        _first(lines, EXCEPTIONS, start + 1)
    if exc is not None:
        shown = crash.cause(lines) or lines[exc].strip()
        return "failed", (f"an exception after its start line ({lines[start].strip()}): "
                          f"{shown}" if start is not None else
                          f"an exception before its start line: {shown}")
    if start is not None:
        return "started", lines[start].strip()
    init = _first(lines, RENDEZVOUS)
    return "waiting", lines[init].strip() if init is not None else ""


def _no_start(since: str, progress: str) -> str:
    return (f"no start line ({START} ...) since {since or 'its start'}"
            + (f"; the last sign of progress: {progress}" if progress else
               "; not even the rendezvous with rank 0 ended"))


def check(unit: str, budget: float) -> dict[str, object]:
    first = unit_state(unit)
    invocation, since = first.get("InvocationID", ""), first.get("ExecMainStartTimestamp", "")
    if not invocation or first.get("ActiveState") not in ("active", "activating"):
        return {"ok": False, "error": f"{unit} is not running ({first.get('ActiveState')}, "
                f"{first.get('Result')}): {_no_start(since, '')}"}
    deadline = time.monotonic() + budget
    while True:
        now = unit_state(unit)
        lines = journal(invocation)
        verdict, text = judge(lines)
        if verdict == "started" and now.get("InvocationID") == invocation:
            return {"ok": True, "pid": now.get("MainPID", ""), "line": text, "since": since}
        if verdict == "failed":
            return {"ok": False, "error": text}
        if now.get("InvocationID") != invocation or now.get("SubState") == "auto-restart" \
                or now.get("ActiveState") in ("failed", "inactive"):
            why = crash.cause(lines) or f"{now.get('Result')}, no error logged"
            return {"ok": False, "error": f"{unit} went down before its start line (started "
                    f"{since}): {why}"}
        if time.monotonic() >= deadline:
            return {"ok": False, "error": f"{_no_start(since, text)} (waited {budget:.0f} s)"}
        time.sleep(POLL)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="member_start")
    parser.add_argument("--unit", required=True)
    parser.add_argument("--budget", type=float, default=1800)
    args = parser.parse_args(argv)
    result = check(args.unit, args.budget)
    print(printable(f"{args.unit}: {result.get('line') or result.get('error')}"), flush=True)
    print(f"{MARK} {json.dumps(result)}", flush=True)
    return 0 if result.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main())
