"""The directory a roll shares with its pyinfra runs (root's, 0700, named by
``SGLANG_FLEET_CUTOVER``): the roll writes ``plan.json``, ``<host>.turn``, ``<host>.go``, and
``abort`` when it stops; a run writes ``<host>.prepared``, ``<host>.waiting``, ``<host>.took``
(past its turn: its files may have changed) and ``<host>.json`` (``OutOfRouters``). Each file
is written whole or not at all.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ENV = "SGLANG_FLEET_CUTOVER"
_PLAN = "plan.json"
_ABORT = "abort"


@dataclass
class Wave:
    """Some of a host's servers out of the routers together: when they left and came back."""

    urls: list[str]
    left: float
    back: float | None = None


@dataclass
class OutOfRouters:
    """A host's time out of the routers: when it left them whole (None: only wave by wave),
    each wave of its servers, and what the drains left unfinished.

        OutOfRouters(at=None, waves=[Wave(["http://10.0.0.11:30001"], 1767.0)]).still_out()
        # 1767.0
    """

    at: float | None
    notes: list[str] = field(default_factory=list)
    waves: list[Wave] = field(default_factory=list)

    def still_out(self) -> float | None:
        """Since when some of the host has been out of the routers without coming back (None:
        nothing is out)."""
        out = [w.left for w in self.waves if w.back is None]
        return min([*out, *([self.at] if self.at is not None else [])], default=None)

    def open_wave(self, now: float) -> Wave:
        """The wave still out, or a new one from ``now``."""
        if not self.waves or self.waves[-1].back is not None:
            self.waves.append(Wave([], now))
        return self.waves[-1]


@dataclass
class RollDirectory:
    """The directory a roll shares with its pyinfra runs.

        roll_dir = RollDirectory.create()
        roll_dir.plan({"b200-01": ["http://10.0.0.11:30000"]}, drain_timeout=600)
        subprocess.run(argv, env={**os.environ, **roll_dir.env()})
        roll_dir.out_of_routers("b200-01")   # OutOfRouters(at=...) once it left, else None
    """

    directory: Path

    @classmethod
    def create(cls) -> RollDirectory:
        return cls(Path(tempfile.mkdtemp(prefix="sglang-fleet-roll-")))  # 0700

    def env(self) -> dict[str, str]:
        return {ENV: str(self.directory)}

    def plan(self, hosts: dict[str, list[str]], drain_timeout: float,
             units: dict[str, dict[str, list[str]]] | None = None,
             batch_instances: int | None = None,
             health_timeout: float = 300) -> None:
        """The roll's hosts and the URLs each serves at now (``units``: by server unit); runs
        wait for the roll that wrote it (this process) and give up when it is gone."""
        self._write(_PLAN, {"hosts": hosts, "units": units or {},
                            "drain_timeout": drain_timeout, "health_timeout": health_timeout,
                            "batch_instances": batch_instances, "roll": os.getpid()})

    def give(self, step: str, names: list[str]) -> None:
        """``turn`` (the hosts may change their files) or ``go`` (they may leave the routers
        and restart)."""
        for name in names:
            self._write(f"{name}.{step}", {})

    def has(self, name: str, mark: str) -> bool:
        """Whether ``<name>.<mark>`` was written (turn, go, prepared, waiting, took)."""
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

    def unit_urls(self, name: str) -> dict[str, list[str]]:
        """The URLs a router may know each server unit of the host by: where it serves with
        the inventory, and with the roll's data (a host may run an earlier roll's)."""
        found = (self._read(_PLAN) or {}).get("units", {}).get(name, {})
        return {str(k): [str(u) for u in v] for k, v in found.items()} \
            if isinstance(found, dict) else {}

    def drain_timeout(self) -> float:
        return float((self._read(_PLAN) or {}).get("drain_timeout", 0))

    def health_timeout(self) -> float:
        return float((self._read(_PLAN) or {}).get("health_timeout", 300))

    def batch_instances(self) -> int | None:
        """``--batch-instances``: a host's servers restart this many at a time, each wave out
        of the routers on its own; None: the host leaves whole."""
        value = (self._read(_PLAN) or {}).get("batch_instances")
        return int(value) if isinstance(value, int) else None

    def out_of_routers(self, name: str) -> OutOfRouters | None:
        """When the host left the routers and what its drains left (None: it never left)."""
        record = self._read(f"{name}.json")
        if not record:
            return None
        at = record.get("at")
        return OutOfRouters(None if at is None else float(at), list(record.get("notes", [])),
                    [Wave(list(w["urls"]), float(w["left"]),
                          None if w.get("back") is None else float(w["back"]))
                     for w in record.get("waves", [])])

    def record_out_of_routers(self, name: str, out: OutOfRouters) -> None:
        self._write(f"{name}.json", {"at": out.at, "notes": out.notes, "waves": [
            {"urls": w.urls, "left": w.left, "back": w.back} for w in out.waves]})

    def close(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)

    def _write(self, name: str, data: dict[str, Any]) -> None:
        part = self.directory / f".{name}.part"
        part.write_text(json.dumps(data))
        part.replace(self.directory / name)  # whole or absent for the reader

    def _read(self, name: str) -> dict[str, Any] | None:
        return read_object(self.directory / name)


def read_object(path: Path) -> dict[str, Any] | None:
    """A JSON object a run or the roll wrote; None when missing, cut or not an object."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def current() -> RollDirectory | None:
    """The roll's directory when this run is part of a roll."""
    directory = os.environ.get(ENV)
    return RollDirectory(Path(directory)) if directory else None


def batch_instances() -> int | None:
    """In a roll with ``--batch-instances``: how many of a host's servers restart at a time."""
    roll_dir = current()
    return roll_dir.batch_instances() if roll_dir is not None else None
