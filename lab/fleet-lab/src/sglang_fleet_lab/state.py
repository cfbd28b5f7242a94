"""Where the lab keeps its state, and what ``lab status`` and ``inventories/lab.py`` read."""

from __future__ import annotations

import json
import os
import secrets
from dataclasses import asdict, dataclass, field
from pathlib import Path

STATE_DIR = Path(os.environ.get("SGLANG_FLEET_LAB_DIR", "/var/lib/sglang-fleet-lab"))
CACHE_DIR = Path(os.environ.get("SGLANG_FLEET_LAB_CACHE", "/var/cache/sglang-fleet-lab"))
SITE_ADDRESS = "127.0.0.2"
HTTP_PORT = 8080  # apt repository (NVIDIA's layout) and wheelhouse
S3_PORT = 9000
S3_BUCKET = "lab-models"
REPO_PATH = "compute/cuda/repos"  # as under developer.download.nvidia.com


def host_address(index: int) -> str:
    return f"127.0.0.{10 + index}"


@dataclass
class Host:
    name: str
    address: str
    gpus: int
    hgx: bool

    @property
    def dir(self) -> Path:
        return STATE_DIR / "hosts" / self.name

    @property
    def root(self) -> Path:
        return self.dir / "root"


@dataclass
class Lab:
    hosts: list[Host] = field(default_factory=list)
    rootfs: str = ""
    sudo_user: str = ""  # set: root's SSH login is refused, this user logs in and sudoes

    @property
    def login(self) -> str:
        """Who the lab and its inventory log in as."""
        return self.sudo_user or "root"

    @property
    def ssh_key(self) -> Path:
        return STATE_DIR / "ssh" / "id_ed25519"

    @property
    def known_hosts(self) -> Path:
        return STATE_DIR / "ssh" / "known_hosts"

    def api_key(self, role: str = "api") -> str:
        """The lab's API key for ``role`` (root-only file, created on first use)."""
        path = STATE_DIR / "ssh" / f"{role}-key"
        if not path.exists():
            path.parent.mkdir(parents=True, mode=0o700, exist_ok=True)
            path.write_text(secrets.token_urlsafe(24))
            path.chmod(0o600)
        return path.read_text().strip()

    @property
    def repo_url(self) -> str:
        return f"http://{SITE_ADDRESS}:{HTTP_PORT}/{REPO_PATH}"

    @property
    def wheels_url(self) -> str:
        return f"http://{SITE_ADDRESS}:{HTTP_PORT}/wheels/"

    @property
    def s3_url(self) -> str:
        return f"http://{SITE_ADDRESS}:{S3_PORT}"

    def save(self) -> None:
        STATE_DIR.mkdir(parents=True, exist_ok=True)
        path = STATE_DIR / "lab.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"hosts": [asdict(h) for h in self.hosts],
                                   "rootfs": self.rootfs, "sudo_user": self.sudo_user},
                                  indent=2))
        tmp.replace(path)


def load() -> Lab:
    """The lab as last brought up; empty when there is none."""
    path = STATE_DIR / "lab.json"
    if not path.exists():
        return Lab()
    data = json.loads(path.read_text())
    return Lab(hosts=[Host(**h) for h in data["hosts"]], rootfs=data.get("rootfs", ""),
               sudo_user=data.get("sudo_user", ""))
