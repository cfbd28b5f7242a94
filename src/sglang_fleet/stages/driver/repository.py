"""NVIDIA's CUDA repository on a host: its keyring package (installed only with its pinned
sha256), and the NVIDIA stack kept out of unattended upgrades.

    url = repository_url(NVIDIA_REPOS)                 # '…/cuda/repos/ubuntu2404/x86_64'
    nvidia_repository(url, given_sha256=None)          # in the driver stage's pyinfra deploy
"""

from __future__ import annotations

from collections.abc import Mapping
from io import StringIO
from typing import Any

from pyinfra.api.operation import OperationMeta
from pyinfra.context import host
from pyinfra.facts.deb import DebPackages
from pyinfra.facts.server import Arch, LinuxDistribution
from pyinfra.operations import apt, files

from sglang_fleet import paths
from sglang_fleet.errors import InputError
from sglang_fleet.paths import KEYRING

# sha256 of NVIDIA's cuda-keyring_1.1-1_all.deb per repository (checked before dpkg runs it as
# root). To update: download <base>/<distro>/<arch>/cuda-keyring_1.1-1_all.deb, check that
# `dpkg-deb -c` shows only the keyring and the sources list and that the key's fingerprint is
# EB693B3035CD5710E231E123A4B469963BF863CC, then `sha256sum` it. Elsewhere host data
# `nvidia_keyring_sha256` gives it.
KEYRING_SHA256 = {
    "ubuntu2204/x86_64": "d93190d50b98ad4699ff40f4f7af50f16a76dac3bb8da1eaaf366d47898ff8df",
    "ubuntu2404/x86_64": "d2a6b11c096396d868758b86dab1823b25e14d70333f1dfa74da5ddaf6a06dba",
    "ubuntu2404/sbsa": "6ea7d2737648936820e85677177957a0f6521b840d98eb0bbae0a4f003fa7249",
    "debian12/x86_64": "e7f219eab6fe4819cdb5c15b98233dc3420302d9c00883219cd3d896857cf48d",
}
SUPPORTED = ("ubuntu2204", "ubuntu2404", "debian12")
ARCHES = {"x86_64": "x86_64", "amd64": "x86_64", "aarch64": "sbsa", "arm64": "sbsa"}
APT_NO_UPGRADE = "/etc/apt/apt.conf.d/51sglang-fleet-nvidia"
NO_UPGRADE = """// sglang-fleet: the NVIDIA stack changes only through its driver stage.
Unattended-Upgrade::Package-Blacklist {
    "nvidia-";
    "libnvidia-";
    "cuda-drivers";
    "nvlsm";
    "datacenter-gpu-manager";
};
"""


def nvidia_repo(distribution: Mapping[str, Any], arch: str) -> str | None:
    """NVIDIA's directory for a host (``ubuntu2404/x86_64``, ``debian12/sbsa``, …) from
    pyinfra's LinuxDistribution fact and the machine's architecture; None if NVIDIA has none
    this stage supports."""
    meta = distribution.get("release_meta") or {}
    name = str(meta.get("ID", distribution.get("name") or "")).lower()
    version = str(meta.get("VERSION_ID", distribution.get("major") or "")).replace(".", "")
    distro = f"{name}{version}"
    return f"{distro}/{ARCHES[arch]}" if distro in SUPPORTED and arch in ARCHES else None


def repo_path() -> str:
    """This host's NVIDIA repository directory; a named error before any change if unsupported."""
    dist, arch = host.get_fact(LinuxDistribution), str(host.get_fact(Arch))
    path = nvidia_repo(dist, arch)
    if path is None:
        meta = dist.get("release_meta") or {}
        raise InputError.one(f"host {host.name}", "distribution",
                             f"{meta.get('PRETTY_NAME', dist.get('name'))} on {arch} is not "
                             "supported by the driver stage",
                             f"use {', '.join(SUPPORTED)} on x86_64 or aarch64 (sbsa)")
    return path


def repository_url(base_url: str) -> str:
    """This host's repository under ``base_url`` (host data ``nvidia_repo_base_url``)."""
    return f"{base_url}/{repo_path()}"


def keyring_sha256(given: str | None) -> str:
    """The keyring package's pinned checksum for this host's repository (``given``: host data
    ``nvidia_keyring_sha256``, which wins)."""
    where = repo_path()
    digest = given or KEYRING_SHA256.get(where)
    if digest is None:
        raise InputError.one(f"pyinfra data of {host.name}", "nvidia_keyring_sha256",
                             f"no pinned checksum of {KEYRING} for {where}",
                             f"set nvidia_keyring_sha256 to the sha256 of {KEYRING} from "
                             f"{where} (docs/stages.md: the driver stage)")
    return digest


def keyring_package(url: str, given_sha256: str | None) -> OperationMeta:
    """NVIDIA's keyring package, downloaded into root's own directory and installed only when
    its sha256 is the pinned one."""
    # Root's alone: a package fetched here cannot be swapped by another local user before
    # dpkg -i runs its scripts as root.
    for path in (paths.KEYRING_DIR.rsplit("/", 1)[0], paths.KEYRING_DIR):
        files.directory(name=f"Root-only directory {path}", path=path, user="root",
                        group="root", mode="700")
    local = f"{paths.KEYRING_DIR}/{KEYRING}"
    files.download(name=f"NVIDIA repository keyring ({KEYRING}, sha256 checked)",
                   src=f"{url}/{KEYRING}", dest=local, sha256sum=keyring_sha256(given_sha256),
                   temp_dir=paths.KEYRING_DIR, mode="600")
    return apt.deb(name="Install the NVIDIA repository keyring", src=local)


def nvidia_repository(url: str, given_sha256: str | None) -> None:
    """The keyring when the host has none (its sources list names the repository), the index
    read once it is new, and the stack out of unattended upgrades.

        nvidia_repository(repository_url(cfg.repo_base_url), cfg.keyring_sha256)
    """
    keyring = None
    if not host.get_fact(DebPackages).get("cuda-keyring"):
        keyring = keyring_package(url, given_sha256)
    apt.update(name="Read the NVIDIA repository",
               _if=keyring.did_change if keyring else lambda: False)
    files.put(name="Keep the NVIDIA stack out of unattended upgrades", src=StringIO(NO_UPGRADE),
              dest=APT_NO_UPGRADE, mode="644")
