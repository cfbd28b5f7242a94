"""GPU health parsed from real output: ``nvidia-smi -q`` of an H200 on driver 580.159.04
(tests/data, captured on a real host) and B200/HGX variants derived from it line by line, Xid
lines as the kernel logs them, and what preflight makes of the findings."""

from __future__ import annotations

import re

import pytest

from sglang_fleet.errors import InputError
from sglang_fleet.facts import gpuhealth
from sglang_fleet.hostconfig import HostConfig
from sglang_fleet.hostconfig.gpu_health import problems, warnings
from tests.conftest import DATA

Q_H200 = (DATA / "nvidia-smi-q-h200-580.159.04.txt").read_text()
M = gpuhealth.MARK


def fact_output(q: str, nvlink: str = "__exit=0", kernel: str = "") -> list[str]:
    """What the GpuHealth fact's command prints."""
    return [f"{M}smi", *q.splitlines(), f"{M}nvlink", *nvlink.splitlines(), f"{M}kernel",
            *kernel.splitlines()]


def edit(q: str, section: str, key: str, value: str) -> str:
    """``q`` with ``key`` (the first one after the line ``section``) set to ``value``."""
    start = q.index(f"    {section}\n")
    match = re.compile(rf"^(\s+{re.escape(key)}\s+: ).*$", re.M).search(q, start)
    assert match, (section, key)
    return q[:match.start()] + match.group(1) + value + q[match.end():]


def b200(q: str = Q_H200, bus: str = "00000000:18:00.0") -> str:
    """A B200 on an HGX board: the H200 sample with a B200's name, memory, bus and a fabric."""
    q = q.replace("NVIDIA H200", "NVIDIA B200").replace("Hopper", "Blackwell")
    q = q.replace("GPU 00000000:00:06.0", f"GPU {bus}")
    q = edit(q, "FB Memory Usage", "Total", "183359 MiB")
    q = edit(q, "FB Memory Usage", "Free", "182743 MiB")
    q = edit(q, "Fabric", "State", "Completed")
    q = edit(q, "Fabric", "Status", "Success")
    return edit(q, "Fabric", "Summary", "Healthy")


def hgx(*gpus: str) -> str:
    """Several GPUs' sections after the sample's header, as ``nvidia-smi -q`` prints them."""
    head, _, _ = Q_H200.partition("GPU 00000000")
    bodies = [g.split("Attached GPUs", 1)[1].split("\n", 1)[1].rsplit("__exit", 1)[0]
              for g in gpus]
    return head + "".join(bodies) + "__exit=0\n"


def test_real_h200_is_healthy_and_read() -> None:
    health = gpuhealth.parse(fact_output(Q_H200))
    assert health is not None and health.error is None
    assert health.findings == ()
    gpu = health.gpus[0]
    assert (gpu.index, gpu.bus_id, gpu.name) == (0, "00000000:00:06.0", "NVIDIA H200")
    assert (gpu.memory_total_mib, gpu.memory_used_mib, gpu.memory_free_mib) == (143771, 0, 143156)


def test_b200_hgx_healthy_then_faulty() -> None:
    eight = hgx(*(b200(bus=f"00000000:{0x18 + i * 0x10:02X}:00.0") for i in range(8)))
    health = gpuhealth.parse(fact_output(eight))
    assert health is not None and len(health.gpus) == 8 and health.findings == ()
    assert health.gpus[7].bus_id == "00000000:88:00.0"
    bad = b200(bus="00000000:28:00.0")
    bad = edit(bad, "Volatile", "DRAM Uncorrectable", "2")
    bad = edit(bad, "Remapped Rows", "Pending", "Yes")
    bad = edit(bad, "Remapped Rows", "Remapping Failure Occurred", "Yes")
    bad = edit(bad, "Clocks Event Reasons", "HW Slowdown", "Active")
    bad = edit(bad, "Clocks Event Reasons", "HW Power Brake Slowdown", "Active")
    bad = edit(bad, "Clocks Event Reasons", "SW Thermal Slowdown", "Active")
    bad = edit(bad, "Fabric", "Status", "Failure")
    health = gpuhealth.parse(fact_output(hgx(b200(), bad)))
    assert health is not None
    found = {(f.id, f.gpu, f.fatal) for f in health.findings}
    assert found == {("ecc-uncorrectable", "1", True), ("remap-pending", "1", True),
                     ("remap-failure", "1", True), ("clocks-hw-slowdown", "1", False),
                     ("clocks-power-brake", "1", False), ("clocks-thermal", "1", False),
                     ("fabric", "1", True)}


def test_fabric_in_progress_is_a_warning() -> None:
    q = edit(edit(b200(), "Fabric", "State", "In Progress"), "Fabric", "Status", "N/A")
    health = gpuhealth.parse(fact_output(q))
    assert health is not None
    assert [(f.id, f.fatal) for f in health.findings] == [("fabric", False)]


# journald (short-iso) and dmesg spellings of the lines the NVIDIA driver logs
XIDS = (DATA / "kernel-xids.log").read_text()


def test_xids_are_named_per_gpu_with_meaning_and_fix() -> None:
    health = gpuhealth.parse(fact_output(hgx(b200(), b200(bus="00000000:28:00.0")),
                                         kernel=XIDS))
    assert health is not None
    by_id = {f.id: f for f in health.findings}
    assert set(by_id) == {"xid-79", "xid-13", "xid-94", "xid-154"}
    assert by_id["xid-79"].gpu == "0" and by_id["xid-79"].fatal
    assert "fallen off the bus (2 times)" in by_id["xid-79"].what
    assert "reboot" in by_id["xid-79"].fix
    assert by_id["xid-94"].gpu == "1" and by_id["xid-94"].fatal
    assert not by_id["xid-13"].fatal
    assert by_id["xid-154"].gpu == "0000:d8:00" and not by_id["xid-154"].fatal
    for xid in (13, 31, 43, 45, 48, 63, 64, 74, 79, 92, 94, 95, 119, 120):
        assert xid in gpuhealth.XIDS


def test_nvlink_counters() -> None:
    nvlink = ("GPU 0: NVIDIA B200 (UUID: GPU-1)\n\t Link 0: Replay Errors: 0\n"
              "\t Link 0: Recovery Errors: 0\n\t Link 0: CRC Errors: 0\n"
              "GPU 1: NVIDIA B200 (UUID: GPU-2)\n\t Link 3: Replay Errors: 7\n"
              "\t Link 3: CRC Errors: 2\n__exit=0")
    health = gpuhealth.parse(fact_output(b200(), nvlink=nvlink))
    assert health is not None
    [finding] = health.findings
    assert (finding.id, finding.gpu, finding.fatal) == ("nvlink-errors", "1", False)
    assert finding.what == "link 3 replay errors 7, link 3 crc errors 2"


def test_no_nvidia_smi_and_no_driver() -> None:
    assert gpuhealth.parse([f"{M}absent"]) is None
    health = gpuhealth.parse(fact_output(
        "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n"
        "__exit=9"))
    assert health is not None and health.error and "couldn't communicate" in health.error
    assert problems(health, [], "gpu1") == []
    assert "deals with it" in warnings(health, [])[0]


def test_preflight_refuses_fatal_and_lets_ignored_through() -> None:
    health = gpuhealth.parse(fact_output(b200(), kernel=XIDS))
    found = problems(health, [], "gpu1")
    # a device nvidia-smi does not list is named by its PCI address, and still refused
    assert [(p.source, p.key, p.message.split(":")[0]) for p in found] == \
        [("host gpu1", "GPU 0", "xid-79"), ("host gpu1", "GPU 0000:28:00", "xid-94")]
    assert "reboot" in found[0].fix and "gpu_health_ignore = ['xid-79']" in found[0].fix
    assert [p.message.split(":")[0] for p in problems(health, ["xid-79"], "gpu1")] == ["xid-94"]
    assert problems(health, ["xid-79", "xid-94"], "gpu1") == []
    assert any("ignored by gpu_health_ignore" in w for w in warnings(health, ["xid-79"]))


def test_gpu_health_ignore_is_checked() -> None:
    def ignored(data: dict[str, object]) -> tuple[str, ...]:
        return HostConfig.from_data(data, "h").gpu_health_ignore

    assert ignored({"gpu_health_ignore": ["xid-94", "remap-pending"]}) == \
        ("xid-94", "remap-pending")
    assert ignored({}) == ()
    for bad in ("xid-94", ["xid 94; rm -rf /"], [94]):
        with pytest.raises(InputError) as err:
            ignored({"gpu_health_ignore": bad})
        assert err.value.problems[0].key == "gpu_health_ignore"
