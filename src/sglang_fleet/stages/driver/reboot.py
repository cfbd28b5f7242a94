"""A host's reboot inside an operation, and the wait for it to come back: pyinfra's own
``server.reboot`` (3.10, operations/server.py), with a wait that says which host it waits for
and how long is left, and that fails this host alone (no traceback) when it does not come back
within its bound.

    yield from reboot_and_wait(900)     # in an operation, e.g. the driver stage's load_driver
"""

from __future__ import annotations

import time
from typing import Any

from pyinfra import logger
from pyinfra.api.command import FunctionCommand, StringCommand

# pyinfra internals (pinned <3.11), as its server.reboot: a stale sudo askpass fails the reconnect
from pyinfra.connectors.util import clear_askpass_cache, remove_any_sudo_askpass_file
from pyinfra.facts.server import Uptime

from sglang_fleet.ops import Ops


def reboot_and_wait(timeout: int, delay: int = 5, interval: int = 2,
                    report_every: int = 30) -> Ops:
    """pyinfra's reboot, with a wait that says which host it waits for and how long is left,
    and that fails this host alone (no traceback) when it does not come back in time.

        yield from reboot_and_wait(900)     # in an operation
    """
    before: list[float] = []

    def prepare(state: Any, host: Any) -> bool:
        remove_any_sudo_askpass_file(host)
        before.append(float(host.get_fact(Uptime)))
        return True

    def back(state: Any, host: Any) -> bool:
        return _wait_back(host, before[0], timeout, delay, interval, report_every)

    yield FunctionCommand(prepare, (), {})
    # Detached, so the SSH channel closes at once (as pyinfra's own reboot does it).
    yield StringCommand("( sleep 1 && reboot ) </dev/null >/dev/null 2>&1 &")
    yield FunctionCommand(back, (), {})


def _uptime(host_: Any) -> float | None:
    try:
        return float(host_.get_fact(Uptime))
    except Exception:  # the connection dropped again while the host settles
        host_.disconnect()
        return None


def _wait_back(host_: Any, uptime_before: float, timeout: int, delay: int, interval: int,
               report_every: int) -> bool:
    """Reconnect until the host's uptime shows it rebooted, printing the time left."""
    tic = time.monotonic()
    logger.info(f"{host_.print_prefix}waiting for {host_.name} to come back from its reboot: "
                f"{timeout} s left")
    time.sleep(delay)
    clear_askpass_cache(host_)
    host_.disconnect()
    next_report = float(report_every)
    while True:
        waited = time.monotonic() - tic
        if waited >= next_report:
            logger.info(f"{host_.print_prefix}waiting for {host_.name} to come back from its "
                        f"reboot: {max(timeout - waited, 0):.0f} s left")
            next_report = waited + report_every
        host_.connect(show_errors=False)
        uptime = _uptime(host_) if host_.connected else None
        if uptime is not None and uptime < uptime_before + delay:
            logger.info(f"{host_.print_prefix}back from its reboot after {waited:.0f} s")
            clear_askpass_cache(host_)
            return True
        if waited >= timeout:
            logger.error(f"{host_.print_prefix}error: {host_.name} did not come back within "
                         f"{timeout} s of its reboot (reboot_timeout_seconds): this host "
                         "fails, the others carry on")
            return False
        time.sleep(interval)
