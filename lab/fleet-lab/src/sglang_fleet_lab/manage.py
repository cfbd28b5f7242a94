"""``sglang-fleet lab up|down|status|ssh``."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from typing import Any

from sglang_fleet_lab import aptrepo, hostpkgs, hosts, rootfs, site
from sglang_fleet_lab.state import Host, Lab, host_address, load


def _require_root() -> None:
    if os.geteuid() != 0:
        raise SystemExit("sglang-fleet lab: needs root (systemd-nspawn, overlay mounts, "
                         "loopback services); run it with sudo")
    if shutil.which("uv") is None:
        raise SystemExit("sglang-fleet lab: missing uv; install it with: pip install uv")
    hostpkgs.ensure(print)


def _ssh_key(lab: Lab) -> None:
    if not lab.ssh_key.exists():
        lab.ssh_key.parent.mkdir(parents=True, mode=0o700, exist_ok=True)
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "sglang-fleet-lab",
                        "-f", str(lab.ssh_key)], check=True)
    lab.known_hosts.unlink(missing_ok=True)  # hosts are new: their keys may differ


def up(count: int, gpus: int, hgx: bool, sudo_user: str = "") -> Lab:
    """Bring up ``count`` fresh hosts (taking down any running lab first); with ``sudo_user``,
    hosts refuse root's SSH login and that user logs in and has passwordless sudo."""
    _require_root()
    tic = time.monotonic()
    down(quiet=True)
    lower = rootfs.ensure()
    lab = Lab(hosts=[Host(f"lab{i}", host_address(i), gpus, hgx) for i in range(1, count + 1)],
              rootfs=str(lower), sudo_user=sudo_user)
    _ssh_key(lab)
    lab.save()
    site.start(lab)
    for host in lab.hosts:
        hosts.prepare(host, lower, lab)
        hosts.boot(host)
    for host in lab.hosts:
        hosts.wait_ssh(host, lab)
    print(f"lab up: {count} host(s) in {time.monotonic() - tic:.1f} s"
          f"{f' in slot {lab.slot}' if lab.slot else ''} "
          f"({', '.join(f'{h.name} {h.address}' for h in lab.hosts)}), "
          f"logging in as {lab.login}" + (" (sudo)" if sudo_user else ""))
    return lab


def down(quiet: bool = False) -> None:
    """Stop every host and service of this slot's lab; nothing of it mounted, running or
    listening remains (other slots' labs are not touched)."""
    _require_root()
    lab = load()
    for host in lab.hosts:
        hosts.stop(host)
    for name in hosts.guests():  # a guest of an earlier lab of this slot whose state was lost
        if hosts.power_off(name):
            print(f"{name}: a lab guest no lab state knew of: powered off", flush=True)
    site.stop()
    aptrepo.stop_agent()
    if lab.hosts:
        lab.hosts = []
        lab.save()
    if not quiet:
        print("lab down")


def status() -> list[dict[str, Any]]:
    lab = load()
    states = {h.name: hosts.state(h) for h in lab.hosts}
    return [{"name": h.name, "address": h.address, "gpus": h.gpus, "hgx": h.hgx,
             "running": states[h.name] != "stopped", "state": states[h.name]}
            for h in lab.hosts]
