"""What a host's systemd is and says about a unit, read as an operator would (``systemctl``).

Parsing is kept apart from the pyinfra facts so it can be tested on real output samples.
"""

from __future__ import annotations

import re

from pyinfra.api.facts import FactBase


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
_UNIT = re.compile(r"[A-Za-z0-9@_.:-]+\.service")


class UnitCondition(FactBase[dict[str, str]]):
    """What systemd says about one unit now: ``{"ActiveState": "failed", "Result":
    "start-limit-hit", "NRestarts": "5", "UnitFileState": "enabled", ...}``.

        host.get_fact(UnitCondition, unit="sglang.service")["ActiveState"]
    """

    default = dict

    def command(self, unit: str) -> str:
        if not _UNIT.fullmatch(unit):  # the name reaches a shell
            raise ValueError(f"not a unit name: {unit!r}")
        return f"systemctl show {unit} -p {CONDITION} 2>/dev/null || true"

    def process(self, output: list[str]) -> dict[str, str]:
        return parse_show(output)
