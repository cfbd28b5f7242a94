"""Lab hosts: one overlay on the cached root, one loopback address and one key-only sshd each,
booted by a supervisor that restarts the guest when it reboots."""

from __future__ import annotations

import json
import os
import shlex
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
    if lab.sudo_user:
        sudo_user(root, lab)
    else:
        authorize(root, "/root", lab)
    # The site's network: hosts trust what this machine trusts (a proxy's CA, if any).
    local_cas = root / "usr" / "local" / "share" / "ca-certificates"
    for ca in Path("/usr/local/share/ca-certificates").glob("*.crt"):
        shutil.copy(ca, local_cas / ca.name)
    shutil.copy("/etc/ssl/certs/ca-certificates.crt", root / "etc/ssl/certs/ca-certificates.crt")
    # What the GPU stubs answer from, as real hardware would: count, model, memory, NVSwitch.
    (root / "etc" / "lab-hardware.json").write_text(json.dumps(
        {"gpus": host.gpus, "name": "NVIDIA B200", "memory_mib": 183359, "hgx": host.hgx}))


def authorize(root: Path, home: str, lab: Lab, owner: str = "root") -> None:
    """The lab's key may log in to ``owner``, whose home is ``home`` inside ``root``."""
    ssh = root / home.lstrip("/") / ".ssh"
    ssh.mkdir(mode=0o700, parents=True, exist_ok=True)
    (ssh / "authorized_keys").write_text(lab.ssh_key.with_suffix(".pub").read_text())
    (ssh / "authorized_keys").chmod(0o600)
    subprocess.run(["chroot", str(root), "chown", "-R", f"{owner}:{owner}", f"{home}/.ssh"],
                   check=True)


def sudo_user(root: Path, lab: Lab) -> None:
    """As a cloud image: root's SSH login refused, ``lab.sudo_user`` logs in by key and has
    passwordless sudo."""
    name = lab.sudo_user
    subprocess.run(["chroot", str(root), "useradd", "-m", "-s", "/bin/bash", name], check=True)
    authorize(root, f"/home/{name}", lab, owner=name)
    sudoers = root / "etc" / "sudoers.d" / f"90-{name}"
    sudoers.write_text(f"{name} ALL=(ALL) NOPASSWD:ALL\n")
    sudoers.chmod(0o440)
    (root / "etc" / "ssh" / "sshd_config.d" / "05-lab-no-root.conf").write_text(
        "PermitRootLogin no\n")


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
            "-o", "ConnectTimeout=5", *(["-t"] if tty else []), f"{lab.login}@{host.address}"]
    if command and lab.sudo_user:
        argv.append(f"sudo -n sh -c {shlex.quote(command)}")
    elif command:
        argv.append(command)
    elif lab.sudo_user:
        argv += ["-t", "sudo -i"]
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
