"""The lab's own packages on a fresh machine: installed with apt and said so, or the one command
that installs them."""

from __future__ import annotations

from pathlib import Path

import pytest

from sglang_fleet_lab import hostpkgs


def only(*present: str):  # type: ignore[no-untyped-def]
    return lambda command: f"/usr/bin/{command}" if command in present else None


def test_nothing_missing_runs_nothing() -> None:
    ran: list[list[str]] = []
    hostpkgs.ensure(print, which=only(*hostpkgs.NEEDED, "apt-get"), run=ran.append)  # type: ignore[arg-type]
    assert ran == []


def test_missing_packages_are_installed_and_named() -> None:
    said: list[str] = []
    ran: list[list[str]] = []

    def run(argv: list[str]) -> int:
        ran.append(argv)
        return 0

    present = [c for c in hostpkgs.NEEDED if c not in ("debootstrap", "systemd-nspawn")]
    hostpkgs.ensure(said.append, which=only(*present, "apt-get"), run=run, debian_like=True)
    assert said == ["sglang-fleet lab: installing debootstrap, systemd-container with apt-get "
                    "(the lab needs them)"]
    assert ran[-1][-2:] == ["debootstrap", "systemd-container"] and ran[0][-2:] == ["update", "-qq"]


def test_elsewhere_it_stops_with_the_command() -> None:
    with pytest.raises(SystemExit, match=r"missing gnupg; install them with: sudo apt-get "
                                         r"install -y --no-install-recommends gnupg"):
        hostpkgs.ensure(print, which=only(*[c for c in hostpkgs.NEEDED if c != "gpg"]),
                        run=lambda argv: 0, debian_like=False)


def test_a_failed_install_says_what_to_try() -> None:
    with pytest.raises(SystemExit, match="apt-get could not install iproute2"):
        hostpkgs.ensure(print, which=only(*[c for c in hostpkgs.NEEDED if c != "ip"], "apt-get"),
                        run=lambda argv: 100, debian_like=True)


def test_debian_and_ubuntu_are_told_apart(tmp_path: Path) -> None:
    release = tmp_path / "os-release"
    for text, want in (('ID=ubuntu\nID_LIKE=debian\n', True), ("ID=debian\n", True),
                       ('ID="rocky"\nID_LIKE="rhel centos fedora"\n', False)):
        release.write_text(text)
        assert hostpkgs._debian_like(release) is want
