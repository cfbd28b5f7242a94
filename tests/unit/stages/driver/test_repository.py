"""The driver stage's distributions, from the release files real hosts have (read through
pyinfra's own LinuxDistribution fact): NVIDIA's repository directory, the pinned keyring
checksum, and a named refusal elsewhere."""

from __future__ import annotations

import pytest
from pyinfra.facts.server import LinuxDistribution

from sglang_fleet.stages.driver.repository import KEYRING_SHA256, nvidia_repo

UBUNTU_2404 = """/etc/lsb-release
DISTRIB_ID=Ubuntu
DISTRIB_RELEASE=24.04
DISTRIB_CODENAME=noble
DISTRIB_DESCRIPTION="Ubuntu 24.04.1 LTS"
---
/etc/os-release
PRETTY_NAME="Ubuntu 24.04.1 LTS"
NAME="Ubuntu"
VERSION_ID="24.04"
VERSION="24.04.1 LTS (Noble Numbat)"
VERSION_CODENAME=noble
ID=ubuntu
ID_LIKE=debian
HOME_URL="https://www.ubuntu.com/"
UBUNTU_CODENAME=noble
LOGO=ubuntu-logo
---
"""
UBUNTU_2204 = UBUNTU_2404.replace("24.04.1", "22.04.5").replace("24.04", "22.04").replace(
    "noble", "jammy").replace("Noble Numbat", "Jammy Jellyfish")
DEBIAN_12 = """/etc/os-release
PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"
NAME="Debian GNU/Linux"
VERSION_ID="12"
VERSION="12 (bookworm)"
VERSION_CODENAME=bookworm
ID=debian
HOME_URL="https://www.debian.org/"
---
"""
ROCKY_9 = """/etc/os-release
NAME="Rocky Linux"
VERSION="9.4 (Blue Onyx)"
ID="rocky"
ID_LIKE="rhel centos fedora"
VERSION_ID="9.4"
PRETTY_NAME="Rocky Linux 9.4 (Blue Onyx)"
---
"""
UBUNTU_2004 = UBUNTU_2404.replace("24.04.1", "20.04.6").replace("24.04", "20.04")


def fact(text: str) -> dict[str, object]:
    return dict(LinuxDistribution().process(text.splitlines()))


@pytest.mark.parametrize(("release", "arch", "repo"), [
    (UBUNTU_2404, "x86_64", "ubuntu2404/x86_64"), (UBUNTU_2404, "aarch64", "ubuntu2404/sbsa"),
    (UBUNTU_2204, "x86_64", "ubuntu2204/x86_64"), (UBUNTU_2204, "arm64", "ubuntu2204/sbsa"),
    (DEBIAN_12, "x86_64", "debian12/x86_64"), (DEBIAN_12, "amd64", "debian12/x86_64"),
])
def test_supported_hosts_get_their_repository(release: str, arch: str, repo: str) -> None:
    assert nvidia_repo(fact(release), arch) == repo


@pytest.mark.parametrize(("release", "arch"), [
    (ROCKY_9, "x86_64"), (UBUNTU_2004, "x86_64"), (UBUNTU_2404, "ppc64le"), ("", "x86_64"),
])
def test_other_hosts_have_none(release: str, arch: str) -> None:
    assert nvidia_repo(fact(release), arch) is None


def test_pinned_keyrings_are_for_supported_repositories() -> None:
    repos = {nvidia_repo(fact(r), a) for r in (UBUNTU_2204, UBUNTU_2404, DEBIAN_12)
             for a in ("x86_64", "aarch64")}
    assert set(KEYRING_SHA256) <= repos
    assert all(len(d) == 64 and int(d, 16) >= 0 for d in KEYRING_SHA256.values())
