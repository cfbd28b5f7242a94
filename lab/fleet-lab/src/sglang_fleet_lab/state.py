"""Where the lab keeps its state, and what ``lab status`` and ``inventories/lab.py`` read.

Several labs can run on one machine at once, each in its own slot, chosen by
``SGLANG_FLEET_LAB_SLOT`` (0 when unset): slot k has its own state directory, its own addresses
(site 127.0.k.2, host N on 127.0.k.(10+N)), its own site servers and guests marked with k. Slot
0 is the lab as it always was (127.0.0.2, 127.0.0.11.., /var/lib/sglang-fleet-lab). The cached
root file system is shared by every slot, read only (overlay lower layer).

    SGLANG_FLEET_LAB_SLOT=1 sglang-fleet lab up --hosts 2    # 127.0.1.11, 127.0.1.12
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

SLOT_VARIABLE = "SGLANG_FLEET_LAB_SLOT"
SLOTS = 256  # slot k uses 127.0.k.0/24


def slot_from(environ: Mapping[str, str]) -> int:
    """The lab slot ``environ`` chooses (``SGLANG_FLEET_LAB_SLOT``, 0 when unset).

    >>> slot_from({}), slot_from({"SGLANG_FLEET_LAB_SLOT": "1"})
    (0, 1)
    """
    text = environ.get(SLOT_VARIABLE, "").strip() or "0"
    if not text.isdigit() or int(text) >= SLOTS:
        raise SystemExit(f"sglang-fleet lab: {SLOT_VARIABLE}={text!r} is not a lab slot "
                         f"(0..{SLOTS - 1})")
    return int(text)


def state_dir(slot: int) -> Path:
    """Slot 0's state is where the lab always kept it; slot k's beside it."""
    return Path("/var/lib/sglang-fleet-lab" + (f"-{slot}" if slot else ""))


SLOT = slot_from(os.environ)
STATE_DIR = Path(os.environ.get("SGLANG_FLEET_LAB_DIR") or state_dir(SLOT))
CACHE_DIR = Path(os.environ.get("SGLANG_FLEET_LAB_CACHE", "/var/cache/sglang-fleet-lab"))
NETWORK = f"127.0.{SLOT}"  # the slot's addresses: its site on .2, its hosts from .11
SITE_ADDRESS = f"{NETWORK}.2"
HTTP_PORT = 8080  # apt repository (NVIDIA's layout) and wheelhouse
S3_PORT = 9000
S3_BUCKET = "lab-models"
REPO_PATH = "compute/cuda/repos"  # as under developer.download.nvidia.com


@contextlib.contextmanager
def locked(lock_file: Path) -> Iterator[None]:
    """Held alone across every slot and process: a cache built once while the others wait.

        with locked(CACHE_DIR / ".lock"): ...
    """
    lock_file.parent.mkdir(parents=True, exist_ok=True)
    with lock_file.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def host_address(index: int) -> str:
    """Host ``index`` (from 1) of this slot's lab: 127.0.0.11 for lab1 in slot 0."""
    return f"{NETWORK}.{10 + index}"


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
    slot: int = SLOT

    @property
    def dir(self) -> Path:
        """This lab's state directory (its slot's)."""
        return STATE_DIR

    @property
    def site_address(self) -> str:
        """Where the lab's site (repository, wheelhouse, S3) listens: 127.0.k.2 in slot k."""
        return SITE_ADDRESS

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

    def key_file(self, role: str = "api") -> Path:
        """Where the lab keeps its API key for ``role`` (``api`` or ``admin``)."""
        return STATE_DIR / "ssh" / f"{role}-key"

    def api_key(self, role: str = "api") -> str:
        """The lab's API key for ``role`` (root-only file, created on first use)."""
        path = self.key_file(role)
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
                                   "rootfs": self.rootfs, "sudo_user": self.sudo_user,
                                   "slot": self.slot},
                                  indent=2))
        tmp.replace(path)


def load() -> Lab:
    """The lab as last brought up; empty when there is none."""
    path = STATE_DIR / "lab.json"
    if not path.exists():
        return Lab()
    data = json.loads(path.read_text())
    return Lab(hosts=[Host(**h) for h in data["hosts"]], rootfs=data.get("rootfs", ""),
               sudo_user=data.get("sudo_user", ""), slot=data.get("slot", SLOT))
