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

from sglang_fleet_lab.state import SLOT, Host, Lab
from sglang_fleet_lab.supervise import GUEST_MARK, parse_mark


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


def power_on(host: Host, lower: Path, lab: Lab) -> None:
    """Boot a host that was stopped or died, with the disk it had (its overlay's upper layer).

        power_on(host, Path(lab.rootfs), lab)
    """
    if not _mounted(host.root):
        subprocess.run(["mount", "-t", "overlay", "overlay", "-o",
                        f"lowerdir={lower},upperdir={host.dir / 'upper'},"
                        f"workdir={host.dir / 'work'}", str(host.root)], check=True)
    boot(host)
    wait_ssh(host, lab)


def boot(host: Host) -> None:
    log = (host.dir / "console.log").open("ab")
    proc = subprocess.Popen([sys.executable, "-m", "sglang_fleet_lab.supervise", host.name,
                             str(host.root), str(SLOT)], stdout=log, stderr=subprocess.STDOUT,
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


def find(lab: Lab, name: str) -> Host | None:
    """The lab's host called ``name``, if it has one."""
    return next((h for h in lab.hosts if h.name == name), None)


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


def guests(slot: int = SLOT) -> dict[str, int]:
    """Every guest of the lab in ``slot`` (this process's): its init process (the PID 1 of its
    namespace), by host name, found by the mark its supervisor gives it, whoever its parent is
    now. Other slots' guests are not listed.

        guests()    # {"lab1": 48211, "lab2": 48377}
    """
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
            status = (entry / "status").read_text()
        except OSError:
            continue
        marks = [v for v in environ if v.startswith(f"{GUEST_MARK}=".encode())]
        nspid = next((line.split()[1:] for line in status.splitlines()
                      if line.startswith("NSpid:")), [])
        if marks and nspid[-1:] == ["1"] and alive(int(entry.name)):
            guest_slot, name = parse_mark(marks[0].split(b"=", 1)[1].decode())
            if guest_slot == slot:
                found[name] = int(entry.name)
    return found


def _answers(host: Host) -> bool:
    """The guest's sshd accepts connections on the host's address."""
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex((host.address, 22)) == 0


def state(host: Host) -> str:
    """``running``, ``stopped``, or ``running without nspawn`` (its nspawn process died and
    left the guest behind), as ``lab status`` says it.

        state(host)     # "running"
    """
    nspawn = alive(_pid(host.dir / "nspawn.pid"))
    guest = host.name in guests() or _answers(host)  # without root, /proc tells less
    if guest and not nspawn:
        return "running without nspawn"
    return "running" if guest or nspawn else "stopped"


def running(host: Host) -> bool:
    return state(host) != "stopped"


def _wait_gone(pids: list[int | None], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(alive(pid) for pid in pids):
        time.sleep(0.1)


def power_off(name: str, timeout: float = 20) -> bool:
    """Power a guest off through its own systemd (SIGRTMIN+4), killing its whole PID namespace
    when it does not stop in time; True when there was one.

        power_off("lab2")    # after its nspawn process was killed
    """
    init = guests().get(name)
    if init is None:
        return False
    os.kill(init, signal.SIGRTMIN + 4)  # systemd's "poweroff" signal
    _wait_gone([init], timeout)
    if alive(init):
        os.kill(init, signal.SIGKILL)  # the namespace's init: every process in it goes too
        # and the init ends only once they all have (the kernel waits for them): seconds on a
        # busy machine (a loaded local run saw it still alive 5 s after the kill)
        _wait_gone([init], 60)
    return True


def stop(host: Host, timeout: float = 30) -> None:
    """Power the guest off (SIGTERM to nspawn via its supervisor; the guest's own systemd when
    nspawn is gone), then unmount its overlay."""
    supervisor, nspawn = _pid(host.dir / "supervisor.pid"), _pid(host.dir / "nspawn.pid")
    for pid in (supervisor, nspawn):
        if alive(pid):
            os.kill(pid, signal.SIGTERM)  # type: ignore[arg-type]
    _wait_gone([supervisor, nspawn], timeout)
    for pid in (nspawn, supervisor):
        if alive(pid):
            os.kill(pid, signal.SIGKILL)  # type: ignore[arg-type]
    if power_off(host.name):
        print(f"{host.name}: its guest outlived its nspawn process: powered off", flush=True)
    if _mounted(host.root):
        subprocess.run(["umount", "-l", str(host.root)], check=True)
    for name in ("supervisor.pid", "nspawn.pid"):
        (host.dir / name).unlink(missing_ok=True)
