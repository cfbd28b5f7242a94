"""One lab host's supervisor: boots it with systemd-nspawn and boots it again when the guest
reboots (nspawn exits 133), as a machine's firmware would. SIGTERM powers the guest off.

    python -m sglang_fleet_lab.supervise NAME ROOT
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path
from types import FrameType

REBOOT = 133
GUEST_MARK = "SGLANG_FLEET_LAB_GUEST"  # in the environment of each guest's init


def main() -> int:
    name, root = sys.argv[1], Path(sys.argv[2])
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
             f"--setenv={GUEST_MARK}={name}"],
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
