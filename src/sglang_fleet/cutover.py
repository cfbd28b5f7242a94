"""A roll's cutover inside the deploy. A batch's run starts while the batch before it is
still converging: its facts, uploads and checks run then. Two permissions come from the roll:
the *turn* (the batch before it passed its gate), before the service stage changes any unit,
environment file or ``current``; and *go* (the batch before it back in the routers, every other
host healthy), before the first command that would disturb its servers (a restart, a stopped
instance, a driver change, a reboot). At that command the host leaves the routers and drains,
so it is out only for its restart and its gate. Outside a roll (no ``SGLANG_FLEET_CUTOVER`` in
the environment) nobody waits and nothing leaves anything.

The roll and its pyinfra runs share a directory (root's, 0700) named by ``SGLANG_FLEET_CUTOVER``.
The roll writes ``plan.json`` (every host of the roll, the worker URLs it serves at now, the
drain bound, the roll's pid), ``<host>.turn``, ``<host>.go``, and ``abort`` when it stops; a run
writes ``<host>.waiting`` (prepared, at its turn), ``<host>.took`` (past its turn: its files
may have changed) and ``<host>.json`` (when it left the routers, what the drain left).

    turn(name="This host's turn in a roll")      # an operation: waits in a roll only
    yield from leave_routers()      # in an operation, right before a disruptive command
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyinfra import logger
from pyinfra.api.command import FunctionCommand
from pyinfra.api.operation import operation

from sglang_fleet import fleet
from sglang_fleet.ops import Ops
from sglang_fleet.routerctl import RouterError, drained

ENV = "SGLANG_FLEET_CUTOVER"
_PLAN = "plan.json"
_ABORT = "abort"
POLL = 0.2  # seconds between looks for a turn


@dataclass
class Left:
    """When a host left the routers (wall clock) and what its drain left unfinished."""

    at: float
    notes: list[str] = field(default_factory=list)


@dataclass
class Handoff:
    """The directory a roll shares with its pyinfra runs.

        handoff = Handoff.create()
        handoff.plan({"b200-01": ["http://10.0.0.11:30000"]}, drain_timeout=600)
        subprocess.run(argv, env={**os.environ, **handoff.env()})
        handoff.left("b200-01")     # Left(at=..., notes=[]) once it left, else None
    """

    directory: Path

    @classmethod
    def create(cls) -> Handoff:
        return cls(Path(tempfile.mkdtemp(prefix="sglang-fleet-roll-")))  # 0700

    def env(self) -> dict[str, str]:
        return {ENV: str(self.directory)}

    def plan(self, hosts: dict[str, list[str]], drain_timeout: float) -> None:
        """The roll's hosts and the URLs each serves at now; runs wait for the roll that wrote
        it (this process) and give up when it is gone."""
        self._write(_PLAN, {"hosts": hosts, "drain_timeout": drain_timeout,
                            "roll": os.getpid()})

    def give(self, step: str, names: list[str]) -> None:
        """``turn`` (the hosts may change their files) or ``go`` (they may leave the routers
        and restart)."""
        for name in names:
            self._write(f"{name}.{step}", {})

    def has(self, name: str, mark: str) -> bool:
        """Whether ``<name>.<mark>`` was written (turn, go, waiting, took)."""
        return (self.directory / f"{name}.{mark}").exists()

    def abort(self) -> None:
        """The roll stopped: a run still waiting for its turn fails there, having changed
        nothing that serves."""
        self._write(_ABORT, {})

    def waiting_for(self, name: str, step: str) -> str | None:
        """None once ``name`` has ``step`` (turn, go), else why not yet ("" while it waits)."""
        if self.has(name, step):
            return None
        if (self.directory / _ABORT).exists():
            return ("the roll stopped before this host's turn" if step == "turn" else
                    "the roll stopped before this host could restart")
        roll = (self._read(_PLAN) or {}).get("roll")
        if roll != os.getppid():
            return f"the roll (pid {roll}) that started this run is gone"
        return ""

    def hosts(self) -> dict[str, list[str]]:
        """The roll's hosts, and the URLs each leaves the routers with."""
        found = (self._read(_PLAN) or {}).get("hosts", {})
        return {str(k): list(v) for k, v in found.items()} if isinstance(found, dict) else {}

    def drain_timeout(self) -> float:
        return float((self._read(_PLAN) or {}).get("drain_timeout", 0))

    def left(self, name: str) -> Left | None:
        record = self._read(f"{name}.json")
        return Left(float(record["at"]), list(record.get("notes", []))) if record else None

    def record(self, name: str, left: Left) -> None:
        self._write(f"{name}.json", {"at": left.at, "notes": left.notes})

    def close(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)

    def _write(self, name: str, data: dict[str, Any]) -> None:
        part = self.directory / f".{name}.part"
        part.write_text(json.dumps(data))
        part.replace(self.directory / name)  # whole or absent for the reader

    def _read(self, name: str) -> dict[str, Any] | None:
        try:
            data = json.loads((self.directory / name).read_text())
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None


def current() -> Handoff | None:
    """The roll's handoff when this run is part of a roll."""
    directory = os.environ.get(ENV)
    return Handoff(Path(directory)) if directory else None


@operation(is_idempotent=True)
def turn() -> Ops:
    """In a roll, wait until the roll gives this host its turn (the batch before it back in
    the routers and healthy); nothing outside a roll. What comes after it may change what
    serves.

        turn(name="In a roll, this host's turn")
    """
    if current() is not None:
        yield FunctionCommand(_await_turn, (), {})


def _await_turn(state: Any, host: Any) -> bool:
    handoff = current()
    if handoff is None or host.name not in handoff.hosts():
        return True
    handoff.give("waiting", [host.name])
    if not _await(handoff, host, "turn", "prepared; waiting for its turn in the roll",
                  "nothing that serves was changed"):
        return False
    handoff.give("took", [host.name])
    return True


def _await(handoff: Handoff, host: Any, step: str, waiting: str, failed: str) -> bool:
    said = False
    while (why := handoff.waiting_for(host.name, step)) is not None:
        if why:
            logger.error(f"{host.print_prefix}{why}: {failed}")
            return False
        if not said:
            logger.info(f"{host.print_prefix}{waiting}")
            said = True
        time.sleep(POLL)
    return True


def leave_routers() -> Iterator[FunctionCommand]:
    """In a roll: a command that takes this host out of every router and drains it, the first
    time one of its operations is about to disturb its servers. Nothing outside a roll."""
    if current() is not None:
        yield FunctionCommand(_leave, (), {})


def _leave(state: Any, host: Any) -> bool:
    handoff = current()
    if handoff is None:
        return True
    hosts = handoff.hosts()
    if host.name not in hosts or handoff.left(host.name) is not None:  # not ours, or out
        return True
    urls, drain_timeout = hosts[host.name], handoff.drain_timeout()
    if not (_await_turn(state, host) and _await(
            handoff, host, "go", "waiting for the batch before it to be back in the routers",
            "its last good files go back, without a restart")):
        return False
    left = Left(time.time())
    try:
        for router in (config.api() for config in fleet.routers(state.inventory)):
            for url in urls:
                if router.remove(url):
                    logger.info(f"{host.print_prefix}{url} out of the router {router.url}")
    except RouterError as err:
        logger.error(f"{host.print_prefix}taking {host.name} out of the routers: {err}")
        handoff.record(host.name, left)  # possibly out of some: the roll puts it back
        return False
    for url in urls:
        tic = time.monotonic()
        done, unfinished = drained(url, drain_timeout)
        if done:
            logger.info(f"{host.print_prefix}{url} drained in {time.monotonic() - tic:.1f} s")
            continue
        note = (f"{url}: {unfinished} requests still in flight after {drain_timeout:.0f} s; "
                "its own SIGTERM drain finishes them" if unfinished
                else f"{url}: no metrics to drain by")
        logger.warning(f"{host.print_prefix}{note}")
        left.notes.append(note)
    handoff.record(host.name, left)
    return True
