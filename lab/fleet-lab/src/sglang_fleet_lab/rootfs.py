"""The lab hosts' shared root file system: Debian 12 with what a server image has, built once
with debootstrap and cached under a name derived from its recipe. Every lab slot's hosts boot on
overlays of it (it is their read-only lower layer); a lock keeps two slots' ``lab up`` from
building it at once."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from pathlib import Path

from sglang_fleet_lab.state import CACHE_DIR, locked

SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
PACKAGES = [
    "systemd", "systemd-sysv", "dbus", "udev", "openssh-server", "sudo", "python3", "iproute2",
    "curl", "ca-certificates", "gnupg", "procps", "kmod", "pciutils", "less", "lsb-release",
    "xz-utils", "unattended-upgrades", "apt-utils", "cron", "logrotate",
]
# Containers share the machine's kernel, so /proc/uptime would not restart with the guest; a
# real host's does, and reboot checks (pyinfra's server.reboot) rely on it.
UPTIME = r"""#!/bin/sh
boot=$(date +%s)
printf '%-40s\n' "0.00 0.00" > /run/lab-uptime
mount --bind /run/lab-uptime /proc/uptime
while :; do
    up=$(( $(date +%s) - boot ))
    printf '%-40s\n' "$up.00 $up.00" 1<> /run/lab-uptime
    sleep 1
done
"""
UPTIME_UNIT = """[Unit]
Description=Uptime of this boot of the lab host
DefaultDependencies=no
Before=sysinit.target

[Service]
ExecStart=/usr/local/lib/lab/uptime

[Install]
WantedBy=sysinit.target
"""
# Run inside the new root (chroot) after debootstrap.
SETUP = f"""
set -e
mkdir -p /usr/local/lib/lab
cat > /usr/local/lib/lab/uptime <<'LAB_EOF'
{UPTIME}LAB_EOF
chmod 755 /usr/local/lib/lab/uptime
cat > /etc/systemd/system/lab-uptime.service <<'LAB_EOF'
{UPTIME_UNIT}LAB_EOF
systemctl enable lab-uptime.service
printf 'PasswordAuthentication no\\nPermitRootLogin prohibit-password\\n' \
    > /etc/ssh/sshd_config.d/10-lab-base.conf
: > /etc/machine-id
rm -f /var/lib/dbus/machine-id
passwd -l root >/dev/null
apt-get clean
rm -rf /var/lib/apt/lists/*
"""


def recipe_id() -> str:
    recipe = json.dumps({"suite": SUITE, "mirror": MIRROR, "packages": PACKAGES, "setup": SETUP})
    return hashlib.sha256(recipe.encode()).hexdigest()[:12]


def _in_use(root: Path) -> bool:
    """Some overlay (a lab host of any slot) has ``root`` as its lower layer."""
    return f"lowerdir={root}," in Path("/proc/mounts").read_text()


def ensure() -> Path:
    """The cached root for the current recipe, built if missing (about a minute; one slot
    builds it while the others wait for it)."""
    root = CACHE_DIR / f"rootfs-{recipe_id()}"
    if (root / ".complete").exists():
        return root
    with locked(CACHE_DIR / ".lock"):
        if not (root / ".complete").exists():
            _build(root)
    return root


def _build(root: Path) -> None:
    building = root.with_name(root.name + ".building")
    shutil.rmtree(building, ignore_errors=True)
    subprocess.run(["debootstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}",
                    SUITE, str(building), MIRROR], check=True, stdout=subprocess.DEVNULL)
    subprocess.run(["chroot", str(building), "sh", "-c", SETUP], check=True)
    (building / ".complete").touch()
    building.rename(root)
    for old in CACHE_DIR.glob("rootfs-*"):  # earlier recipes no lab host runs on
        if old != root and not old.name.endswith(".building") and not _in_use(old):
            shutil.rmtree(old, ignore_errors=True)
