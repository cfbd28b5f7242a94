"""One lab host's supervisor: boots it with systemd-nspawn and boots it again when the guest
reboots (nspawn exits 133), as a machine's firmware would. SIGTERM powers the guest off.

    python -m sglang_fleet_lab.supervise NAME ROOT [SLOT]
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path
from types import FrameType

REBOOT = 133
GUEST_MARK = "SGLANG_FLEET_LAB_GUEST"  # in the environment of each guest's init


def mark(slot: int, name: str) -> str:
    """The value of a guest's mark: its slot and name (``0/lab1``).

    >>> mark(1, "lab2"), parse_mark(mark(1, "lab2")), parse_mark("lab1")
    ('1/lab2', (1, 'lab2'), (0, 'lab1'))
    """
    return f"{slot}/{name}"


def parse_mark(value: str) -> tuple[int, str]:
    """(slot, name) of a mark; a bare name (a guest booted before slots) is slot 0's."""
    slot, _, name = value.rpartition("/")
    return (int(slot) if slot.isdigit() else 0), name


def cgroups(slot: int, name: str) -> list[Path]:
    """The guest's own control group in each hierarchy nspawn puts a guest in (cgroup2, and
    cgroup v1's ``name=systemd`` on a hybrid host), under this process's own.

    Without it every guest booted from one cgroup gets the same ``payload`` group from nspawn
    (``--keep-unit``, no machined here), so all guests' systemd share one tree: lab1's
    ``system.slice/sglang.service`` is lab2's too, and one guest's stop or clean-up of a unit
    breaks the same unit's start on another (``Failed to kill control group ...: Input/output
    error``, then ``Failed to attach to cgroup ...: No such file or directory``, status
    219/CGROUP). A machine has a tree of its own; so does a lab host.
    """
    own: dict[str, str] = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, hierarchy, path = line.split(":", 2)
        own[hierarchy] = path
    found = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        _, point, kind, options = line.split()[:4]
        tree = "" if kind == "cgroup2" else None
        if kind == "cgroup" and "name=systemd" in options.split(","):
            tree = "name=systemd"
        if tree is not None and tree in own:
            found.append(Path(point, own[tree].lstrip("/"), f"sglang-fleet-lab-{slot}", name))
    return found


def enter(groups: list[Path]) -> None:
    """In the nspawn child before it runs: join the guest's groups (``0``: the writer)."""
    for group in groups:
        (group / "cgroup.procs").write_text("0")


def remove(groups: list[Path]) -> None:
    """The guest's groups once it is off, deepest first, then the slot's if no other guest
    is in it; a group still in use stays."""
    for group in groups:
        for top, dirs, _ in os.walk(group, topdown=False):
            for sub in dirs:
                with contextlib.suppress(OSError):
                    os.rmdir(os.path.join(top, sub))
        for empty in (group, group.parent):
            with contextlib.suppress(OSError):
                empty.rmdir()


def main() -> int:
    name, root = sys.argv[1], Path(sys.argv[2])
    slot = int(sys.argv[3]) if len(sys.argv) > 3 else 0
    stopping = False
    child: subprocess.Popen[bytes] | None = None

    def stop(signum: int, frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True
        if child is not None and child.poll() is None:
            child.send_signal(signal.SIGTERM)  # nspawn turns it into a clean poweroff

    signal.signal(signal.SIGTERM, stop)
    groups = cgroups(slot, name)
    for group in groups:
        group.mkdir(parents=True, exist_ok=True)
    while not stopping:
        child = subprocess.Popen(
            ["systemd-nspawn", "-D", str(root), "--register=no", "--keep-unit", "--boot",
             f"--machine={name}", "--console=passive",
             # A host's root manages its firewall (nftables: the servers' own ports); nspawn
             # keeps CAP_NET_ADMIN only with a network of the guest's own otherwise.
             "--capability=CAP_NET_ADMIN",
             # How `lab down` finds the guest even when this nspawn process is gone.
             f"--setenv={GUEST_MARK}={mark(slot, name)}"],
            stdin=subprocess.DEVNULL, preexec_fn=lambda: enter(groups))
        (root.parent / "nspawn.pid").write_text(str(child.pid))
        if stopping:  # SIGTERM arrived while nspawn was starting
            child.send_signal(signal.SIGTERM)
        code = child.wait()
        print(f"{name}: nspawn exited {code}", flush=True)
        if code != REBOOT:
            break
    remove(groups)
    return 0


if __name__ == "__main__":
    sys.exit(main())
