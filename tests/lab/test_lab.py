"""The lab: booted hosts with real systemd, sshd and apt, reached by pyinfra over SSH.

Needs root (systemd-nspawn, overlay mounts); CI runs as root. The first run builds the cached
Debian root file system (about a minute); later runs reuse it.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.lab
HOSTS = ("lab1", "lab2", "lab3")


def run(*argv: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def pyinfra(*argv: str) -> subprocess.CompletedProcess[str]:
    return run("pyinfra", "-y", "inventories/lab.py", *argv)


@pytest.fixture(scope="module")
def lab() -> Iterator[None]:
    if os.geteuid() != 0:
        pytest.fail("the lab needs root (systemd-nspawn, overlay mounts): run the tests as root")
    result = run("sglang-fleet", "lab", "up", "--hosts", "3", timeout=900)
    assert result.returncode == 0, result.stdout + result.stderr
    yield
    run("sglang-fleet", "lab", "down")


def test_status_lists_three_running_hosts(lab: None) -> None:
    out = json.loads(run("sglang-fleet", "lab", "status", "--json").stdout)
    assert [(h["name"], h["running"]) for h in out] == [(h, True) for h in HOSTS]
    assert len({h["address"] for h in out}) == 3


def test_pyinfra_reaches_every_host_and_nvidia_smi_is_absent(lab: None) -> None:
    result = pyinfra("exec", "--", "hostname")
    assert result.returncode == 0, result.stderr
    for name in HOSTS:
        assert f"[{name}] {name}" in result.stdout + result.stderr
    result = pyinfra("exec", "--", "nvidia-smi", "-L")
    assert result.returncode != 0


def test_driver_from_the_lab_repository_after_a_reboot(lab: None) -> None:
    result = pyinfra("tests/lab/deploys/stub_driver.py")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    listing = pyinfra("exec", "--", "nvidia-smi", "-L")
    assert listing.returncode == 0, listing.stderr
    output = listing.stdout + listing.stderr
    for name in HOSTS:
        assert f"[{name}] GPU 7: NVIDIA B200 (UUID: GPU-" in output
    query = pyinfra("exec", "--", "nvidia-smi", "--query-gpu=name,memory.total,driver_version,"
                    "compute_cap", "--format=csv,noheader,nounits")
    assert "NVIDIA B200, 183359, 580.95.05, 10.0" in query.stdout + query.stderr
    again = pyinfra("tests/lab/deploys/stub_driver.py")
    assert again.returncode == 0 and "Load the driver" in again.stdout + again.stderr
    assert "No changes" in again.stdout + again.stderr or "Success" in again.stdout


def test_upgrade_without_reboot_is_a_version_mismatch(lab: None) -> None:
    result = run("sglang-fleet", "lab", "ssh", "lab3",
                 "DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nvidia-open-580 "
                 "nvidia-driver-580-open >/dev/null; nvidia-smi -L")
    assert result.returncode == 18
    assert "Failed to initialize NVML: Driver/library version mismatch" in result.stdout


def test_down_leaves_nothing_behind(lab: None) -> None:
    result = run("sglang-fleet", "lab", "down")
    assert result.returncode == 0, result.stderr
    # A zombie holds nothing; reaping it is the init's job (this sandbox's reaps lazily).
    table = run("ps", "-eo", "stat=,args=").stdout.splitlines()
    left = [line for line in table if not line.lstrip().startswith("Z")
            and any(p in line for p in ("systemd-nspawn", "moto_server", "http.server",
                                        "lab.supervise"))]
    assert left == []
    assert "sglang-fleet-lab" not in Path("/proc/mounts").read_text()
    listeners = run("ss", "-Hltn").stdout
    for address in ("127.0.0.2:", "127.0.0.11:", "127.0.0.12:", "127.0.0.13:"):
        assert address not in listeners
