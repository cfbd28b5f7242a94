"""One lab host's supervisor: boots it with systemd-nspawn and boots it again when the guest
reboots (nspawn exits 133), as a machine's firmware would. SIGTERM powers the guest off.

    python -m sglang_fleet_lab.supervise NAME ROOT [SLOT]
"""

from __future__ import annotations

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
    while not stopping:
        child = subprocess.Popen(
            ["systemd-nspawn", "-D", str(root), "--register=no", "--keep-unit", "--boot",
             f"--machine={name}", "--console=passive",
             # How `lab down` finds the guest even when this nspawn process is gone.
             f"--setenv={GUEST_MARK}={mark(slot, name)}"],
            stdin=subprocess.DEVNULL)
        (root.parent / "nspawn.pid").write_text(str(child.pid))
        if stopping:  # SIGTERM arrived while nspawn was starting
            child.send_signal(signal.SIGTERM)
        code = child.wait()
        print(f"{name}: nspawn exited {code}", flush=True)
        if code != REBOOT:
            break
    return 0


if __name__ == "__main__":
    sys.exit(main())
