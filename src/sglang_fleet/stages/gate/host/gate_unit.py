"""The served unit as systemd sees it, for the gate: its state, one invocation's journal (never
an earlier launch's lines) with the secrets masked, and the wait until it is healthy (or down).

    invocation = wait_healthy("sglang.service", "http://127.0.0.1:30000", budget=1800)
    journal(invocation, lines=40)              # the last 40 lines of that start
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable

from sglang_fleet.remote import crash, readiness
from sglang_fleet.remote.terminal import printable

from .gate_http import GateError, request

SECRETS: list[str] = []  # values never to print (the API key)


def shown(line: str, width: int = 240) -> str:
    """A journal line fit for the deploy's output: secrets masked, control characters shown
    as codes (``terminal``), long lines cut."""
    for secret in SECRETS:
        line = line.replace(secret, "***")
    line = printable(line)
    return line if len(line) <= width else line[:width] + " …"


def unit_state(unit: str) -> dict[str, str]:
    out = subprocess.run(["systemctl", "show", unit, "-p", "ActiveState,SubState,Result,"
                          "InvocationID,ExecMainStatus"], capture_output=True, text=True).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def journal(invocation: str, lines: int = 40) -> list[str]:
    """The journal of one invocation of the unit: never an earlier launch's lines."""
    out = subprocess.run(["journalctl", f"_SYSTEMD_INVOCATION_ID={invocation}", "-o", "cat",
                          "--no-pager"], capture_output=True, text=True).stdout
    return out.splitlines()[-lines:] if lines else out.splitlines()


def time_to_ready(invocation: str, tries: int = 5) -> readiness.Timing:
    """This invocation's time to ready, in parts, from its journal (PID 1 logs its "Started"
    message with the invocation as INVOCATION_ID); read again for a moment while the first
    generation's line is not in it yet."""
    argv = ["journalctl", "-o", "json", "--no-pager", f"_SYSTEMD_INVOCATION_ID={invocation}",
            "+", f"INVOCATION_ID={invocation}"]
    timing = readiness.Timing()
    for _ in range(tries):
        out = subprocess.run(argv, capture_output=True, text=True).stdout
        timing = readiness.parse(readiness.entries(out.splitlines()))
        if "first_generation" in timing.marks or "ready" not in timing.marks:
            break
        time.sleep(0.5)
    return timing


def unit_down(unit: str, invocation: str, state: dict[str, str], what: str) -> GateError:
    """The error for a unit that went down: its crash's cause (else its last line) and journal."""
    lines = journal(invocation, lines=0)
    tail = [line for line in lines[-40:] if line.strip()]
    last = crash.cause(lines) or (tail[-1].strip() if tail else
                                  f"{state.get('Result')}, no output")
    return GateError(f"{unit} {what}: {shown(last, 160)}",
                     [f"invocation {invocation}:", *tail[-15:]])


def wait_healthy(unit: str, url: str, budget: float,
                 probe: Callable[[], bool] | None = None, what: str = "") -> str:
    """Until ``url/health_generate`` answers 200 (or ``probe`` says healthy): the unit's invocation;
    a GateError as soon as the unit fails or restarts, or after ``budget`` seconds."""
    invocation = unit_state(unit).get("InvocationID", "")
    deadline = time.monotonic() + budget
    while time.monotonic() < deadline:
        state = unit_state(unit)
        restarted = state.get("InvocationID") != invocation
        if state.get("ActiveState") == "failed" or restarted or \
                state.get("SubState") == "auto-restart":
            raise unit_down(unit, invocation, state, "failed to start")
        if probe() if probe else request(f"{url}/health_generate", None, timeout=25)[0] == 200:
            return invocation
        time.sleep(1)
    raise GateError(f"{what or url + '/health_generate'} not healthy within {budget:.0f} s")
