"""The gate's host program, ``check_server``, run on the host for one server: the gate's full
checks, or one of its waits (health within the startup budget, a smoke generation). The gate
and the service stage's restart waves both run it.

    ok, lines = check(profile, launch, "--health-only", budget=1800)
"""

from __future__ import annotations

import shlex
from typing import Any

from pyinfra import logger
from pyinfra.context import host

from sglang_fleet.config.profile import Profile
from sglang_fleet.config.render import Launch
from sglang_fleet.ops import result_line, run
from sglang_fleet.ops.host_programs import program
from sglang_fleet.paths import env_file
from sglang_fleet.remote.check_server import RESULT_MARK
from sglang_fleet.rollout.fleet import ANY_ADDRESS

CHECKER = "check_server"  # the host program (remote/check_server.py), run by the system python


def url(profile: Profile, launch: Launch) -> str:
    """Where the gate on the host reaches the server: its loopback when it listens on any
    address (the same set ``fleet`` uses for the address routers reach)."""
    address = profile.server.host
    return f"http://{'127.0.0.1' if address in ANY_ADDRESS else address}:{launch.port}"


def check(profile: Profile, launch: Launch, *flags: str, budget: int | None = None,
          show: bool = True, label: str = "") -> tuple[bool, list[str]]:
    """Run check_server on the host for one launch; show its human lines (after ``label``)."""
    argv = program("python3", CHECKER, "--unit", launch.unit, "--url", url(profile, launch),
                   "--env-file", env_file(launch.unit), "--model", profile.model.served_name,
                   *(["--budget", str(budget)] if budget is not None else []), *flags)
    ok, output = run(shlex.join(argv))  # the gate itself, not a read of state: no fact for it
    lines = list(output.stdout_lines)
    for line in lines if show else ():
        if not line.startswith(f"{RESULT_MARK} "):  # the result line: for result_of
            logger.info(f"{host.print_prefix}{label}{line}")
    return ok, lines


def result_of(lines: list[str]) -> dict[str, Any]:
    """check_server's result: its ``GATE {json}`` line (``RESULT_MARK``), {} without one.

        result_of(['soak: ...', 'GATE {"ok": true, "measured": {...}}'])["ok"]   # True
    """
    return result_line(lines, RESULT_MARK) or {}


def error_of(lines: list[str]) -> str:
    """What check_server found wrong, from its result line.

        error_of(['GATE {"ok": false, "error": "sglang.service failed to start: ..."}'])
    """
    return str(result_of(lines).get("error", "gate failed"))
