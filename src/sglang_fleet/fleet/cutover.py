"""A roll's cutover inside the deploy. A batch's run starts while the batch before it is
still converging. Two permissions come from the roll: the *turn* (the batch before it passed its
gate), before the service stage changes what serves; and *go* (the batch before it back in the
routers), before the first command that would disturb its servers, where the host leaves the
routers and drains, so it is out only for its restart and its gate. With
``--batch-instances`` only the servers about to restart leave, and each wave rejoins before
the next leaves. Outside a roll (no ``SGLANG_FLEET_CUTOVER``) nobody waits and nothing leaves.

Every disruptive command goes through ``disrupt``, which puts the leave right before it
(tests/unit/stages/test_disruption.py checks it).

    turn(name="This host's turn in a roll")      # an operation: waits in a roll only
    yield from disrupt(reboot_and_wait(900))     # in an operation: the host leaves, then reboots
    yield from disrupt(start_command(unit), units=[unit])   # only that server, --batch-instances
    yield from rejoin(["http://10.0.0.11:30003"])      # its wave ready: back, seen healthy
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from typing import Any
from urllib.parse import urlsplit

from pyinfra import logger
from pyinfra.api.command import FunctionCommand, PyinfraCommand
from pyinfra.api.operation import operation

from sglang_fleet.fleet import inventory as fleet
from sglang_fleet.fleet.roll_directory import (
    OutOfRouters,
    RollDirectory,
    batch_instances,
    current,
)
from sglang_fleet.fleet.router_api import RouterError, drained
from sglang_fleet.ops import Ops

POLL = 0.2  # seconds between looks for a turn


@operation(is_idempotent=True)
def turn() -> Ops:
    """In a roll, wait until the roll gives this host its turn; nothing outside a roll.

        turn(name="In a roll, this host's turn")
    """
    if current() is not None:
        yield FunctionCommand(_await_turn, (), {})


@operation(is_idempotent=True)
def prepared() -> Ops:
    """In a roll, tell it this host is prepared: a roll that tolerates failed preparations
    skips the hosts that never say so.

        prepared(name="In a roll, this host prepared")
    """
    if current() is not None:
        yield FunctionCommand(_say_prepared, (), {})


def _say_prepared(state: Any, host: Any) -> bool:
    if (roll_dir := _ours(host)) is not None:
        roll_dir.give("prepared", [host.name])
    return True


def _await_turn(state: Any, host: Any) -> bool:
    if (roll_dir := _ours(host)) is None:
        return True
    roll_dir.give("waiting", [host.name])
    if not _await(roll_dir, host, "turn", "prepared; waiting for its turn in the roll",
                  "nothing that serves was changed"):
        return False
    roll_dir.give("took", [host.name])
    return True


def _await(roll_dir: RollDirectory, host: Any, step: str, waiting: str, failed: str) -> bool:
    said = False
    while (why := roll_dir.waiting_for(host.name, step)) is not None:
        if why:
            logger.error(f"{host.print_prefix}{why}: {failed}")
            return False
        if not said:
            logger.info(f"{host.print_prefix}{waiting}")
            said = True
        time.sleep(POLL)
    return True


# A command an operation yields: a shell string or one of pyinfra's commands.
Command = str | PyinfraCommand


def disrupt(*commands: Command | Iterable[Command], units: list[str] | None = None) -> Ops:
    """Commands that disturb this host's servers, led in a roll by the host out of every
    router, drained (with ``units`` and ``--batch-instances``, only those servers). Each of
    ``commands`` is a command or an iterable of them, consumed only once the leave has run.

        yield from disrupt(start_command("sglang-1.service"), units=["sglang-1.service"])
        yield from disrupt(reboot_and_wait(900))      # the whole host leaves, then reboots
    """
    yield from leave_routers(units)
    for command in commands:
        if isinstance(command, (str, PyinfraCommand)):
            yield command
        else:
            yield from command


def leave_routers(units: list[str] | None = None) -> Iterator[FunctionCommand]:
    """In a roll: a command that takes this host (with ``units`` and ``--batch-instances``,
    only those servers) out of every router and drains it. Stages reach it through ``disrupt``.

        list(leave_routers(["sglang-3.service"]))   # [FunctionCommand(_leave_units, ...)]
    """
    if current() is not None:
        yield (FunctionCommand(_leave, (), {}) if units is None
               else FunctionCommand(_leave_units, (units,), {}))


def rejoin(urls: list[str]) -> Iterator[FunctionCommand]:
    """In a roll with ``--batch-instances``: a command that puts these servers back into every
    router and waits until each sees them healthy. A host that left whole comes back after its
    gate."""
    if batch_instances():
        yield FunctionCommand(_rejoin, (urls,), {})


def _ours(host: Any) -> RollDirectory | None:
    """The roll's directory when this host is one of its hosts."""
    roll_dir = current()
    return roll_dir if roll_dir is not None and host.name in roll_dir.hosts() else None


def _go(roll_dir: RollDirectory, state: Any, host: Any) -> bool:
    """Its turn, then go: the batch before it back in the routers."""
    return _await_turn(state, host) and _await(
        roll_dir, host, "go", "waiting for the batch before it to be back in the routers",
        "its last good files go back, without a restart")


def _leave(state: Any, host: Any) -> bool:
    roll_dir = _ours(host)
    if roll_dir is None:
        return True
    out = roll_dir.out_of_routers(host.name)
    if out is not None and out.at is not None:  # out already
        return True
    if not _go(roll_dir, state, host):
        return False
    out = out or OutOfRouters(None)
    out.at = time.time()
    # what the routers may know: its URLs now, with the roll's data, and of waves back already
    urls = list(dict.fromkeys([*roll_dir.hosts()[host.name],
                               *(u for us in roll_dir.unit_urls(host.name).values() for u in us),
                               *(u for w in out.waves for u in w.urls)]))
    return _take_out(roll_dir, state, host, urls, out, None)


def _leave_units(state: Any, host: Any, units: list[str]) -> bool:
    roll_dir = _ours(host)
    if roll_dir is None:
        return True
    if not roll_dir.batch_instances():
        return _leave(state, host)
    out = roll_dir.out_of_routers(host.name)
    if out is not None and out.at is not None:  # the whole host is out already
        return True
    if not _go(roll_dir, state, host):
        return False
    known = roll_dir.unit_urls(host.name)
    if any(unit not in known for unit in units):  # e.g. from an earlier roll's --data
        logger.info(f"{host.print_prefix}{', '.join(u for u in units if u not in known)}: "
                    "a server the roll does not know the URL of: the host leaves whole")
        return _leave(state, host)
    urls = list(dict.fromkeys(u for unit in units for u in known[unit]))
    return _take_out(roll_dir, state, host, urls, out or OutOfRouters(None), time.time())


def _take_out(roll_dir: RollDirectory, state: Any, host: Any, urls: list[str], out: OutOfRouters,
         wave_from: float | None) -> bool:
    """``urls`` out of every router, then drained; recorded either way (the roll puts back
    what may be out), as a wave from ``wave_from`` if given."""
    removed: list[str] = []
    try:
        for router in (config.api() for config in fleet.routers(state.inventory)):
            # a host leaving whole: every worker at its address, whatever its port
            for url in (urls if wave_from is not None else _at_host(router, urls)):
                if router.remove(url):
                    logger.info(f"{host.print_prefix}{url} out of the router {router.url}")
                    removed = list(dict.fromkeys([*removed, url]))
    except RouterError as err:
        logger.error(f"{host.print_prefix}taking {', '.join(urls)} out of the routers: {err}")
        return _noted(roll_dir, host, out, wave_from, urls, ok=False)
    drain_timeout = roll_dir.drain_timeout()
    for url in removed:
        tic = time.monotonic()
        done, unfinished = drained(url, drain_timeout)
        if done:
            logger.info(f"{host.print_prefix}{url} drained in {time.monotonic() - tic:.1f} s")
            continue
        note = (f"{url}: {unfinished} requests still in flight after {drain_timeout:.0f} s; "
                "its own SIGTERM drain finishes them" if unfinished
                else f"{url}: no metrics to drain by")
        logger.warning(f"{host.print_prefix}{note}")
        out.notes.append(note)
    return _noted(roll_dir, host, out, wave_from, removed, ok=True)


def _at_host(router: Any, urls: list[str]) -> list[str]:
    """``urls`` and every worker the router has at one of their addresses (servers the host
    runs from an earlier roll's data, say, which the inventory does not name).

        _at_host(router, ["http://10.0.0.11:30000"])   # + 'http://10.0.0.11:30001', ...
    """
    hosts = {urlsplit(url).hostname for url in urls}
    return list(dict.fromkeys([*urls, *(url for url in router.workers()
                                        if urlsplit(url).hostname in hosts)]))


def _noted(roll_dir: RollDirectory, host: Any, out: OutOfRouters, wave_from: float | None,
           removed: list[str], ok: bool) -> bool:
    """The host's record, with ``removed`` in its open wave when servers left wave by wave."""
    if wave_from is not None and removed:
        wave = out.open_wave(wave_from)
        wave.urls = list(dict.fromkeys([*wave.urls, *removed]))
    if out.at is not None or out.waves:
        roll_dir.record_out_of_routers(host.name, out)
    return ok


def _rejoin(state: Any, host: Any, urls: list[str]) -> bool:
    roll_dir = _ours(host)
    if roll_dir is None or not roll_dir.batch_instances():
        return True
    out = roll_dir.out_of_routers(host.name) or OutOfRouters(None)
    if out.at is not None:  # out whole: the roll puts it back after its gate
        return True
    timeout = roll_dir.health_timeout()
    try:
        for router in (config.api() for config in fleet.routers(state.inventory)):
            for url in router.rejoin(urls, timeout):
                logger.info(f"{host.print_prefix}{url} back, healthy in the router {router.url}")
    except RouterError as err:
        logger.error(f"{host.print_prefix}putting {', '.join(urls)} back: {err}")
        return False
    if out.waves and out.waves[-1].back is None:  # new servers only: nothing was out
        out.waves[-1].back = time.time()
        out.waves[-1].urls = list(dict.fromkeys([*out.waves[-1].urls, *urls]))
        roll_dir.record_out_of_routers(host.name, out)
    return True
