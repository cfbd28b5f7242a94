"""What the lab needs on this machine, installed with apt when it is missing (Debian, Ubuntu),
saying what it installs; elsewhere it stops with the one command that does.

    ensure(print)        # before `lab up`
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

# command the lab runs → the Debian/Ubuntu package that provides it
NEEDED = {
    "debootstrap": "debootstrap", "systemd-nspawn": "systemd-container", "ssh": "openssh-client",
    "ssh-keygen": "openssh-client", "dpkg-deb": "dpkg-dev", "apt-ftparchive": "apt-utils",
    "gpg": "gnupg", "ip": "iproute2", "ps": "procps",
}
Run = Callable[[list[str]], int]


def missing(which: Callable[[str], str | None] = shutil.which) -> list[str]:
    """The packages whose commands are not on this machine, in a stable order."""
    return sorted({pkg for command, pkg in NEEDED.items() if which(command) is None})


def install_command(packages: list[str]) -> list[str]:
    return ["apt-get", "install", "-y", "--no-install-recommends", *packages]


def _debian_like(os_release: Path = Path("/etc/os-release")) -> bool:
    try:
        text = os_release.read_text()
    except OSError:
        return False
    words = {word for line in text.splitlines() if line.startswith(("ID=", "ID_LIKE="))
             for word in line.split("=", 1)[1].strip().strip('"').split()}
    return bool(words & {"debian", "ubuntu"})


def ensure(say: Callable[[str], None], which: Callable[[str], str | None] = shutil.which,
           run: Run | None = None, debian_like: bool | None = None) -> None:
    """Install what is missing, or raise SystemExit with the command that would."""
    packages = missing(which)
    if not packages:
        return
    command = install_command(packages)
    if (debian_like if debian_like is not None else _debian_like()) is False or \
            os.geteuid() != 0 or which("apt-get") is None:
        raise SystemExit(f"sglang-fleet lab: missing {', '.join(packages)}; install them with: "
                         f"sudo {' '.join(command)}")
    say(f"sglang-fleet lab: installing {', '.join(packages)} with apt-get (the lab needs them)")
    runner = run or (lambda argv: subprocess.run(argv, check=False).returncode)
    env_cmd = ["env", "DEBIAN_FRONTEND=noninteractive"]
    if runner([*env_cmd, "apt-get", "update", "-qq"]) or runner([*env_cmd, *command]):
        raise SystemExit(f"sglang-fleet lab: apt-get could not install {', '.join(packages)}; "
                         f"try: sudo {' '.join(command)}")
