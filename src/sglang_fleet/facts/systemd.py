"""What a host's systemd says about its units, read as an operator would (``systemctl``,
``journalctl``). Parsing is apart from the facts, to be tested on real output samples.

    host.get_fact(UnitCondition, unit="sglang.service")["ActiveState"]     # 'active'
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass
from typing import Any

from pyinfra.api.facts import FactBase

from sglang_fleet import paths
from sglang_fleet.remote import crash

_UNIT = re.compile(r"[A-Za-z0-9@_.:-]+\.service")  # a unit name, safe to give a shell


def parse_version(lines: list[str]) -> int | None:
    """``systemd 252 (252.39-1~deb12u2)`` -> 252; None when systemctl said nothing usable."""
    for line in lines:
        match = re.match(r"systemd (\d+)\b", line.strip())
        if match:
            return int(match.group(1))
    return None


def parse_show(lines: list[str]) -> dict[str, str]:
    """``systemctl show -p A,B`` output (``A=x`` lines) as a mapping."""
    return dict(line.strip().split("=", 1) for line in lines if "=" in line)


class SystemdVersion(FactBase[int | None]):
    """The major version of the host's systemd (252 on Debian 12, 255 on Ubuntu 24.04)."""

    def command(self) -> str:
        return "systemctl --version 2>/dev/null | head -1 || true"

    def process(self, output: list[str]) -> int | None:
        return parse_version(output)


CONDITION = "ActiveState,SubState,Result,NRestarts,UnitFileState"


class UnitCondition(FactBase[dict[str, str]]):
    """What systemd says about one unit now: ``{"ActiveState": "failed", ...}``."""

    default = dict

    def command(self, unit: str) -> str:
        if not _UNIT.fullmatch(unit):  # the name reaches a shell
            raise ValueError(f"not a unit name: {unit!r}")
        return f"systemctl show {unit} -p {CONDITION} 2>/dev/null || true"

    def process(self, output: list[str]) -> dict[str, str]:
        return parse_show(output)


PROPERTIES = ("Id,LoadState,ActiveState,SubState,ActiveEnterTimestamp,ExecMainPID,ExecStart,"
              "NRestarts,Result,InvocationID")
_RELEASE = re.compile(re.escape(paths.RELEASES) + r"/([^/ ;]+)/")
JOURNAL_LINES = 600  # enough for a crash's traceback and the restart after it


@dataclass(frozen=True)
class UnitState:
    name: str
    load: str  # loaded, not-found
    active: str  # active, activating, failed, inactive
    sub: str  # running, auto-restart, dead
    since: str  # ActiveEnterTimestamp, e.g. "Mon 2026-11-30 23:01:02 UTC" (empty if never)
    pid: int
    argv: tuple[str, ...]  # ExecStart's argv[], no key in it (the launcher reads the keys)
    restarts: int = 0  # NRestarts: automatic restarts since the last deliberate start
    result: str = ""  # Result: success, exit-code, signal, start-limit-hit, ...
    invocation: str = ""  # InvocationID: this start of the unit (the gate records its own)

    @property
    def release(self) -> str | None:
        """The engine release directory the unit runs (``/opt/sglang/releases/<id>/``)."""
        match = _RELEASE.search(" ".join(self.argv))
        return match.group(1) if match else None

    def runs(self, release: str, module: str, flags: tuple[str, ...]) -> bool:
        """Whether the unit runs ``release``'s ``module`` with exactly ``flags`` already.

            unit.runs("sglang-0.5.23-0123456789", "sglang.launch_server", ("--tp-size", "1"))
        """
        if self.release != release or module not in self.argv:
            return False
        return self.argv[self.argv.index(module) + 1:] == flags

    def flag(self, name: str) -> str | None:
        """The value of ``--name VALUE`` in the unit's command line."""
        for i, word in enumerate(self.argv[:-1]):
            if word == name:
                return self.argv[i + 1]
        return None

    @property
    def state(self) -> str:
        return "not installed" if self.load == "not-found" else f"{self.active}/{self.sub}"


def _argv(exec_start: str) -> tuple[str, ...]:
    """``{ path=... ; argv[]=WORDS ; ignore_errors=no ; ... }`` -> WORDS (systemd quotes words
    that hold spaces as a shell would)."""
    match = re.search(r"argv\[\]=(.*?) ; (ignore_errors|start_time)=", exec_start)
    if not match:
        return ()
    try:
        return tuple(shlex.split(match.group(1)))
    except ValueError:
        return tuple(match.group(1).split())


def parse_units(lines: list[str]) -> dict[str, UnitState]:
    """Blocks of ``KEY=VALUE`` separated by blank lines, one per unit (``systemctl show A B``)."""
    blocks: list[dict[str, str]] = [{}]
    for line in lines:
        if not line.strip():
            blocks.append({})
            continue
        key, _, value = line.partition("=")
        blocks[-1][key] = value
    units = {}
    for b in blocks:
        if "Id" not in b:
            continue
        pid, restarts = b.get("ExecMainPID", "0"), b.get("NRestarts", "0")
        units[b["Id"]] = UnitState(b["Id"], b.get("LoadState", ""), b.get("ActiveState", ""),
                                   b.get("SubState", ""), b.get("ActiveEnterTimestamp", ""),
                                   int(pid) if pid.isdigit() else 0,
                                   _argv(b.get("ExecStart", "")),
                                   int(restarts) if restarts.isdigit() else 0,
                                   b.get("Result", ""), b.get("InvocationID", ""))
    return units


class UnitStates(FactBase[dict[str, UnitState]]):
    """The named units' state (names must be unit names: they reach a shell)."""

    def command(self, units: list[str]) -> str:
        names = [u for u in units if _UNIT.fullmatch(u)]
        return f"systemctl show --no-pager -p {PROPERTIES} {' '.join(names)} 2>/dev/null || true"

    def process(self, output: list[str]) -> dict[str, UnitState]:
        return parse_units(output)


class GateRecords(FactBase[dict[str, Any]]):
    """What each named unit's last passed gate measured (``paths.gate_record``), by unit, as
    the file holds it (``eta.from_record`` checks each figure); no record: absent."""

    default = dict  # no record at all: pyinfra gives a fact without output its default

    def command(self, units: list[str]) -> str:
        paths_ = [shlex.quote(paths.gate_record(u)) for u in units if _UNIT.fullmatch(u)]
        return f"grep -H '' -- {' '.join(paths_)} 2>/dev/null || true" if paths_ else "true"

    def process(self, output: list[str]) -> dict[str, Any]:
        found: dict[str, Any] = {}
        prefix = f"{paths.GATE_RECORDS}/"
        for line in output:
            path, _, text = line.partition(":")
            if not (path.startswith(prefix) and path.endswith(".json")):
                continue
            unit = f"{path.removeprefix(prefix).removesuffix('.json')}.service"
            try:
                found[unit] = json.loads(text)
            except ValueError:
                found[unit] = None  # present but unreadable: not measured
        return found


class LastCrash(FactBase[str | None]):
    """Why the unit last ended on its own: the cause in its journal (``remote/crash.py``), or
    None. Reading another unit's journal needs root or the systemd-journal group."""

    def command(self, unit: str) -> str:
        if not _UNIT.fullmatch(unit):
            raise ValueError(f"not a unit name: {unit!r}")
        return f"journalctl -u {unit} -o cat --no-pager -n {JOURNAL_LINES} 2>/dev/null || true"

    def process(self, output: list[str]) -> str | None:
        return crash.cause(output)
