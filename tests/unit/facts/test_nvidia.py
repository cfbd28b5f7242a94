"""Facts parsed from real nvidia-smi and /proc output (samples from B200 and H100 hosts)."""

from __future__ import annotations

from sglang_fleet.facts import nvidia

B200_QUERY = [f"{i}, NVIDIA B200, 183359, 580.95.05, 10.0, Enabled" for i in range(8)]
MISMATCH = ["Failed to initialize NVML: Driver/library version mismatch",
            "NVML library version: 580.105", "__exit=18"]
NO_DRIVER = ["NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
             "Make sure that the latest NVIDIA driver is installed and running.", "__exit=9"]
OPEN = ("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  Release Build  "
        "(dvs-builder@U22-I3-AF03-09-1)  Sun Sep 21 10:11:12 UTC 2025\n"
        "GCC version:  gcc version 12.3.0 (Ubuntu 12.3.0-1ubuntu1~22.04.2)\n")
PROPRIETARY = ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  570.133.20  Thu Mar 13 "
               "21:32:37 UTC 2025\nGCC version:  gcc version 11.4.0\n")
Q_HGX = """
==============NVSMI LOG==============

Driver Version                            : 580.95.05
CUDA Version                              : 13.0

Attached GPUs                             : 8
GPU 00000000:18:00.0
    Product Name                          : NVIDIA B200
    Fabric
        State                             : Completed
        Status                            : Success
        CliqueId                          : 32766
        ClusterUUID                       : a0b1c2d3-0000-0000-0000-000000000000
    Processes                             : None
""".splitlines()
Q_PCIE = """
GPU 00000000:01:00.0
    Product Name                          : NVIDIA H100 PCIe
    Fabric
        State                             : N/A
        Status                            : N/A
""".splitlines()


def test_query_b200() -> None:
    report = nvidia.parse_query([*B200_QUERY, "__exit=0"])
    assert report.ok and len(report.gpus) == 8
    gpu = report.gpus[0]
    assert (gpu.name, gpu.memory_mib, gpu.driver_version, gpu.compute_cap, gpu.persistence) == \
        ("NVIDIA B200", 183359, "580.95.05", "10.0", True)


def test_query_errors() -> None:
    assert nvidia.parse_query(MISMATCH).error == \
        "Failed to initialize NVML: Driver/library version mismatch NVML library version: 580.105"
    assert "couldn't communicate" in (nvidia.parse_query(NO_DRIVER).error or "")
    missing = nvidia.parse_query(["sh: 1: nvidia-smi: not found", "__exit=127"])
    assert missing.error == "nvidia-smi is not installed"


def test_module_version() -> None:
    assert nvidia.parse_module_version(OPEN) == nvidia.LoadedModule("580.95.05", True)
    assert nvidia.parse_module_version(PROPRIETARY) == nvidia.LoadedModule("570.133.20", False)
    assert nvidia.parse_module_version("") is None


def test_fabric() -> None:
    assert nvidia.parse_fabric(Q_HGX) == ("Completed", "Success")
    assert nvidia.parse_fabric(Q_PCIE) == ("N/A", "N/A")
    assert nvidia.parse_fabric(["GPU 0", "    Product Name : NVIDIA B200"]) is None
