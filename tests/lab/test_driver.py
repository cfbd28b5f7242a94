"""The driver stage on lab hosts: NVIDIA's repository layout, the open driver held at a version,
reboots only when the loaded module differs, the fabric manager on NVSwitch hosts."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

from tests.lab.conftest import booted_lab, pyinfra, ssh

pytestmark = pytest.mark.lab
OLD, NEW = "580.95.05", "580.105.08"


@pytest.fixture(scope="module")
def lab() -> Iterator[None]:
    yield from booted_lab("--hosts", "2", "--hgx")


def deploy(*data: str) -> tuple[int, str]:
    args = [a for d in data for a in ("--data", d)]
    result = pyinfra("deploys/driver.py", *args)
    return result.returncode, result.stdout + result.stderr


def test_fresh_hosts_converge_with_one_reboot(lab: None) -> None:
    code, out = deploy(f"nvidia_driver_version={OLD}")
    assert code == 0, out[-4000:]
    for host in ("lab1", "lab2"):
        assert out.count(f"[{host}] rebooting: loaded driver none, installed {OLD}") == 1
        assert re.search(rf"\[{host}\] 8 x NVIDIA B200, 183359 MiB, driver {OLD} \(open, "
                         r">= 580\.65\.06 for CUDA 13\.0\), compute capability 10\.0, "
                         r"fabric Completed", out), out[-3000:]
    held = ssh("lab1", "apt-mark showhold").stdout.split()
    assert {"nvidia-open-580", "nvidia-driver-580-open", "nvidia-fabricmanager"} <= set(held)
    blacklist = ssh("lab1", "cat /etc/apt/apt.conf.d/51sglang-fleet-nvidia").stdout
    assert "Unattended-Upgrade::Package-Blacklist" in blacklist and '"nvidia-";' in blacklist
    assert ssh("lab1", "dpkg -s linux-headers-$(uname -r)").returncode == 0
    assert "Enabled" in ssh("lab1", "nvidia-smi --query-gpu=persistence_mode "
                                     "--format=csv,noheader").stdout


def test_second_run_changes_nothing(lab: None) -> None:
    before = ssh("lab1", "cut -d. -f1 /proc/uptime").stdout
    code, out = deploy(f"nvidia_driver_version={OLD}")
    assert code == 0, out[-3000:]
    assert "rebooting" not in out
    total = next(line for line in out.splitlines() if "Grand total" in line).split()
    assert total[3] == "-", f"something changed: {total}"  # the Success column
    assert int(ssh("lab1", "cut -d. -f1 /proc/uptime").stdout) >= int(before)


def test_bump_without_permission_to_reboot_is_refused_before_installing(lab: None) -> None:
    code, out = deploy(f"nvidia_driver_version={NEW}", "allow_reboot=false")
    assert code != 0
    assert f"nvidia_driver_version {NEW}: refused, nothing installed: the loaded driver is " \
           f"{OLD}" in out
    assert "Traceback" not in out
    assert "--> 2 hosts failed: lab1 (" in out
    installed = ssh("lab1", "dpkg-query -W -f '${Version}' nvidia-driver-580-open").stdout
    assert installed.startswith(OLD)
    assert ssh("lab1", "nvidia-smi -L").returncode == 0  # no library/driver mismatch


def test_bump_upgrades_and_reboots_once(lab: None) -> None:
    code, out = deploy(f"nvidia_driver_version={NEW}")
    assert code == 0, out[-4000:]
    for host in ("lab1", "lab2"):
        assert out.count(f"[{host}] rebooting: loaded driver {OLD}, installed {NEW}") == 1
        # the wait names the host and the time left, then how long it took
        assert f"[{host}] waiting for {host} to come back from its reboot: 900 s left" in out
        assert re.search(rf"\[{host}\] back from its reboot after \d+ s", out)
        assert f"[{host}] 8 x NVIDIA B200, 183359 MiB, driver {NEW}" in out
    # the fabric manager followed the driver
    assert f"nvidia-fabricmanager {OLD}-1 does not match the driver {NEW}-1" in out


def test_mismatched_fabric_manager_is_named_and_replaced(lab: None) -> None:
    ssh("lab2", "apt-mark unhold nvidia-fabricmanager >/dev/null; "
        "DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --allow-downgrades "
        f"nvidia-fabricmanager={OLD}-1 >/dev/null; systemctl restart nvidia-fabricmanager")
    assert "In Progress" in ssh("lab2", "nvidia-smi -q -i 0").stdout
    code, out = deploy(f"nvidia_driver_version={NEW}")
    assert code == 0, out[-3000:]
    assert f"[lab2] nvidia-fabricmanager {OLD}-1 does not match the driver {NEW}-1" in out
    assert re.search(rf"\[lab2\] .*driver {NEW} .*fabric Completed", out)
    assert "[lab1] nvidia-fabricmanager" not in out


def test_proprietary_flavour_is_refused_before_any_change(lab: None) -> None:
    code, out = deploy("nvidia_driver_flavour=proprietary")
    assert code == 1
    assert "B200 (Blackwell) runs only on NVIDIA's open kernel modules" in out
    assert "Traceback" not in out and "Starting operation" not in out
