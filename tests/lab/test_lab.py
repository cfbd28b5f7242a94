"""The lab: booted hosts with real systemd, sshd and apt, reached by pyinfra over SSH.

Needs root (systemd-nspawn, overlay mounts); CI runs as root. The first run builds the cached
Debian root file system (about a minute); later runs reuse it.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator

import pytest

from sglang_fleet_lab import state, supervise
from tests.lab.conftest import LAB, SITE, address, booted_lab, mounted_here, pyinfra, run, ssh

pytestmark = pytest.mark.lab
HOSTS = ("lab1", "lab2", "lab3")


@pytest.fixture(scope="module")
def lab() -> Iterator[None]:
    yield from booted_lab("--hosts", "3", "--hgx")


def test_status_lists_three_running_hosts(lab: None) -> None:
    out = json.loads(run("sglang-fleet", "lab", "status", "--json").stdout)
    assert [(h["name"], h["running"]) for h in out] == [(h, True) for h in HOSTS]
    assert len({h["address"] for h in out}) == 3


def test_each_host_has_control_groups_of_its_own(lab: None) -> None:
    """A unit on lab1 is not in lab2's cgroup tree: hosts that shared one (nspawn's payload
    group) broke each other's starts of the same unit (supervise.cgroups)."""
    probe = "find /sys/fs/cgroup -maxdepth 4 -name cg-probe.service"
    assert ssh("lab1", "systemd-run --unit=cg-probe sleep 300").returncode == 0
    try:
        assert "cg-probe.service" in ssh("lab1", probe).stdout
        for other in HOSTS[1:]:
            assert ssh(other, probe).stdout == ""
    finally:
        ssh("lab1", "systemctl stop cg-probe")


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


def fabric_state(host: str) -> str:
    out = ssh(host, "nvidia-smi -q -i 0").stdout
    return next(line.split(":", 1)[1].strip() for line in out.splitlines()
                if line.strip().startswith("State"))


def test_fabric_completes_with_matching_fabric_manager_and_nvlsm(lab: None) -> None:
    assert fabric_state("lab1") == "In Progress"
    install = ssh("lab1", "DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "
                  "nvidia-fabricmanager=580.95.05-1 nvlsm >/dev/null && "
                  "systemctl start nvidia-fabricmanager")
    assert install.returncode == 0, install.stderr
    assert fabric_state("lab1") == "In Progress"  # no subnet manager yet
    assert ssh("lab1", "systemctl start nvlsm").returncode == 0
    assert fabric_state("lab1") == "Completed"


def test_fabric_manager_of_another_version_fails(lab: None) -> None:
    result = ssh("lab2", "DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "
                 "nvidia-fabricmanager=580.105.08-1 nvlsm >/dev/null; systemctl start nvlsm; "
                 "systemctl start nvidia-fabricmanager")
    assert result.returncode != 0
    journal = ssh("lab2", "journalctl -u nvidia-fabricmanager --no-pager").stdout
    assert "fabric manager NVIDIA GPU driver interface version 580.105.08 don't match with " \
           "driver version 580.95.05" in journal
    assert fabric_state("lab2") == "In Progress"


def test_site_serves_wheels_and_the_model(lab: None) -> None:
    import boto3

    from sglang_fleet_lab.site import S3_CREDENTIALS
    from sglang_fleet_lab.state import load

    wheels = ssh("lab1", f"curl -fsS http://{SITE}:8080/wheels/").stdout
    assert "sglang_sim-0.5.23-py3-none-any.whl" in wheels
    anonymous = ssh("lab1", "curl -s -o /dev/null -w '%{http_code}' "
                    f"http://{SITE}:9000/lab-models/qwen3.6-27b/config.json").stdout
    assert anonymous == "403"  # reachable from the hosts, and private like a real bucket
    s3 = boto3.client("s3", endpoint_url=load().s3_url, region_name="us-east-1",
                      **S3_CREDENTIALS)
    objects = {o["Key"]: o["Size"] for o in
               s3.list_objects_v2(Bucket="lab-models", Prefix="qwen3.6-27b/")["Contents"]}
    assert "qwen3.6-27b/config.json" in objects
    assert "qwen3.6-27b/model.safetensors.index.json" in objects
    shards = [size for key, size in objects.items() if key.endswith(".safetensors")]
    assert len(shards) == 4 and sum(shards) > 250 << 20  # a few hundred MB of real bytes


def test_upgrade_without_reboot_is_a_version_mismatch(lab: None) -> None:
    result = run("sglang-fleet", "lab", "ssh", "lab3",
                 "DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nvidia-open-580 "
                 "nvidia-driver-580-open >/dev/null; nvidia-smi -L")
    assert result.returncode == 18
    assert "Failed to initialize NVML: Driver/library version mismatch" in result.stdout


def test_proprietary_flavour_finds_no_devices(lab: None) -> None:
    ssh("lab3", "DEBIAN_FRONTEND=noninteractive apt-get install -y -qq cuda-drivers-580 "
        ">/dev/null; systemctl reboot")
    assert run("sglang-fleet", "lab", "status").returncode == 0
    result = subprocess.CompletedProcess([], 1, "", "")
    for _ in range(60):
        result = ssh("lab3", "systemctl is-system-running --wait >/dev/null; nvidia-smi")
        if result.returncode in (0, 6):
            break
        time.sleep(1)
    assert result.returncode == 6 and "No devices were found" in result.stdout


def test_down_leaves_nothing_behind(lab: None) -> None:
    result = run("sglang-fleet", "lab", "down")
    assert result.returncode == 0, result.stderr
    # A zombie holds nothing; reaping it is the init's job (this sandbox's reaps lazily).
    table = run("ps", "-eo", "stat=,args=").stdout.splitlines()
    # Other tests may run moto or http.server beside the lab, and other slots their own labs:
    # this lab's supervisors and nspawn name its state directory, its servers bind its site.
    left = [line for line in table if not line.lstrip().startswith("Z")
            and ((any(p in line for p in ("systemd-nspawn", "lab.supervise", "gpg-agent"))
                  and f"{LAB.dir}/" in line)
                 or (any(p in line for p in ("moto_server", "http.server"))
                     and f"{SITE} " in line))]
    assert left == []
    assert mounted_here() == []
    # nor the hosts' control groups
    assert [g.parent for g in supervise.cgroups(state.SLOT, "lab1") if g.parent.exists()] == []
    listeners = run("ss", "-Hltn").stdout
    for bound in (SITE, *(address(h) for h in HOSTS)):
        assert f"{bound}:" not in listeners
