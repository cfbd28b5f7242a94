"""Who listens on a TCP port: each process's user, start time, command line and systemd unit
(from its control group), read with ``ss`` and ``/proc``.

    [p.describe() for p in host.get_fact(PortListeners, port=30000)]
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from pyinfra.api.facts import FactBase

SEP = "\x1f"  # between fields: a command line may hold anything but this and a newline


@dataclass(frozen=True)
class Listener:
    pid: int
    user: str
    started: str  # as ps prints lstart, e.g. "Mon Nov 30 22:40:01 2026"
    unit: str | None  # the systemd service it runs in, None for a session (nohup, tmux, setsid)
    command: str

    def describe(self) -> str:
        where = f"unit {self.unit}" if self.unit else "no systemd unit (started by hand)"
        return (f"pid {self.pid} ({self.user}, started {self.started}, {where}): "
                f"{self.command[:200]}")


def unit_of(cgroup: str) -> str | None:
    """The service a process runs in, from ``/proc/PID/cgroup`` (v2 or v1 lines)."""
    for line in cgroup.splitlines():
        path = line.rsplit(":", 1)[-1]
        match = re.search(r"/system\.slice/(?:[^/]+\.slice/)*([^/]+\.service)(?:/|$)", path)
        if match:
            return match.group(1)
    return None


def parse(lines: list[str]) -> list[Listener]:
    """Lines of ``PID SEP USER SEP LSTART SEP CGROUP(one line) SEP COMMAND``."""
    found = []
    for line in lines:
        parts = line.split(SEP)
        if len(parts) != 5 or not parts[0].strip().isdigit():
            continue
        pid, user, started, cgroup, command = parts
        found.append(Listener(int(pid), user.strip(), " ".join(started.split()),
                              unit_of(cgroup.replace("|", "\n")), command.strip()))
    return found


class PortListeners(FactBase[list[Listener]]):
    """Processes listening on TCP ``port`` (any address), pids from ``ss -p`` (needs root)."""

    def command(self, port: int) -> str:
        sep = "\\037"
        return (f"for pid in $(ss -Htlnp 'sport = :{int(port)}' | grep -o 'pid=[0-9]*' | "
                "cut -d= -f2 | sort -un); do "
                f"printf '%s{sep}%s{sep}%s{sep}%s{sep}%s\\n' \"$pid\" "
                "\"$(ps -o user= -p $pid)\" \"$(ps -o lstart= -p $pid)\" "
                "\"$(tr '\\n' '|' < /proc/$pid/cgroup)\" "
                "\"$(tr '\\0\\n' '  ' < /proc/$pid/cmdline)\"; done")

    def requires_command(self, port: int) -> str:
        return "ss"

    def process(self, output: list[str]) -> list[Listener]:
        return parse(output)
