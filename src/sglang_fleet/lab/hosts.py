"""Lab hosts: one overlay on the cached root, one loopback address and one key-only sshd each,
booted by a supervisor that restarts the guest when it reboots."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from sglang_fleet.lab.state import Host, Lab


def _mounted(path: Path) -> bool:
    mounts = Path("/proc/mounts").read_text().splitlines()
    return any(line.split()[1] == str(path) for line in mounts)


def prepare(host: Host, lower: Path, lab: Lab) -> None:
    """A clean overlay with the host's identity, address, key and hardware description."""
    if _mounted(host.root):
        subprocess.run(["umount", str(host.root)], check=True)
    for part in ("upper", "work"):
        subprocess.run(["rm", "-rf", str(host.dir / part)], check=True)
    for part in ("upper", "work", "root"):
        (host.dir / part).mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "overlay", "overlay", "-o",
                    f"lowerdir={lower},upperdir={host.dir / 'upper'},workdir={host.dir / 'work'}",
                    str(host.root)], check=True)
    root = host.root
    (root / "etc" / "hostname").write_text(host.name + "\n")
    (root / "etc" / "hosts").write_text(f"127.0.0.1 localhost\n{host.address} {host.name}\n")
    (root / "etc" / "ssh" / "sshd_config.d" / "20-lab-listen.conf").write_text(
        f"ListenAddress {host.address}\n")
    ssh = root / "root" / ".ssh"
    ssh.mkdir(mode=0o700, parents=True, exist_ok=True)
    (ssh / "authorized_keys").write_text(lab.ssh_key.with_suffix(".pub").read_text())
    (ssh / "authorized_keys").chmod(0o600)
    # The site's network: hosts trust what this machine trusts (a proxy's CA, if any).
    local_cas = root / "usr" / "local" / "share" / "ca-certificates"
    for ca in Path("/usr/local/share/ca-certificates").glob("*.crt"):
        shutil.copy(ca, local_cas / ca.name)
    shutil.copy("/etc/ssl/certs/ca-certificates.crt", root / "etc/ssl/certs/ca-certificates.crt")
    # What the GPU stubs answer from, as real hardware would: count, model, memory, NVSwitch.
    (root / "etc" / "lab-hardware.json").write_text(json.dumps(
        {"gpus": host.gpus, "name": "NVIDIA B200", "memory_mib": 183359, "hgx": host.hgx}))


def boot(host: Host) -> None:
    log = (host.dir / "console.log").open("ab")
    proc = subprocess.Popen([sys.executable, "-m", "sglang_fleet.lab.supervise", host.name,
                             str(host.root)], stdout=log, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    (host.dir / "supervisor.pid").write_text(str(proc.pid))


def wait_ssh(host: Host, lab: Lab, timeout: float = 60) -> None:
    """Until the host's sshd answers and systemd has finished booting."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            ready = s.connect_ex((host.address, 22)) == 0
        if ready:
            result = ssh(host, lab, "systemctl is-system-running --wait", capture=True)
            if result.returncode == 0 or result.stdout.strip() == "degraded":
                return
        time.sleep(0.2)
    raise RuntimeError(f"{host.name} did not come up in {timeout} s; see {host.dir}/console.log")


def ssh(host: Host, lab: Lab, command: str | None = None, capture: bool = False,
        tty: bool = False) -> subprocess.CompletedProcess[str]:
    argv = ["ssh", "-i", str(lab.ssh_key), "-o", f"UserKnownHostsFile={lab.known_hosts}",
            "-o", "StrictHostKeyChecking=accept-new", "-o", "LogLevel=ERROR",
            "-o", "ConnectTimeout=5", *(["-t"] if tty else []), f"root@{host.address}"]
    if command:
        argv.append(command)
    return subprocess.run(argv, capture_output=capture, text=True)


def _pid(path: Path) -> int | None:
    try:
        return int(path.read_text())
    except (OSError, ValueError):
        return None


def alive(pid: int | None) -> bool:
    """Running (a zombie whose parent is gone counts as exited)."""
    if pid is None:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def running(host: Host) -> bool:
    return alive(_pid(host.dir / "nspawn.pid"))


def stop(host: Host, timeout: float = 30) -> None:
    """Power the guest off (SIGTERM to nspawn via its supervisor), then unmount its overlay."""
    supervisor, nspawn = _pid(host.dir / "supervisor.pid"), _pid(host.dir / "nspawn.pid")
    for pid in (supervisor, nspawn):
        if alive(pid):
            os.kill(pid, signal.SIGTERM)  # type: ignore[arg-type]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and (alive(supervisor) or alive(nspawn)):
        time.sleep(0.1)
    for pid in (nspawn, supervisor):
        if alive(pid):
            os.kill(pid, signal.SIGKILL)  # type: ignore[arg-type]
    if _mounted(host.root):
        subprocess.run(["umount", "-l", str(host.root)], check=True)
    for name in ("supervisor.pid", "nspawn.pid"):
        (host.dir / name).unlink(missing_ok=True)
