"""What a host says about its NVIDIA stack: ``nvidia-smi``, ``/proc/driver/nvidia/version``,
apt. Parsing is apart from the facts, to be tested on real output samples."""

from __future__ import annotations

import re
from dataclasses import dataclass

from pyinfra.api.facts import FactBase

from sglang_fleet.facts.gpuhealth import parse_tree

QUERY = "index,name,memory.total,driver_version,compute_cap,persistence_mode"
EXIT_MARK = "__exit="


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    memory_mib: int
    driver_version: str
    compute_cap: str
    persistence: bool


@dataclass(frozen=True)
class SmiReport:
    """``nvidia-smi --query-gpu``: the GPUs, or why nvidia-smi could not list them."""

    gpus: tuple[Gpu, ...]
    error: str | None  # e.g. "Failed to initialize NVML: Driver/library version mismatch"

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass(frozen=True)
class LoadedModule:
    """The kernel module loaded now (``/proc/driver/nvidia/version``)."""

    version: str
    open: bool


def parse_query(lines: list[str]) -> SmiReport:
    """Output of ``nvidia-smi --query-gpu=QUERY --format=csv,noheader,nounits`` plus exit code."""
    code = 0
    body = []
    for line in lines:
        if line.startswith(EXIT_MARK):
            code = int(line[len(EXIT_MARK):])
        elif line.strip():
            body.append(line.strip())
    if code == 127 or (code and any("not found" in line for line in body)):
        return SmiReport((), "nvidia-smi is not installed")
    if code:
        return SmiReport((), " ".join(body) or f"nvidia-smi exited {code}")
    gpus = []
    for line in body:
        index, name, memory, driver, cap, persistence = (p.strip() for p in line.split(","))
        gpus.append(Gpu(int(index), name, int(float(memory)), driver, cap,
                        persistence == "Enabled"))
    return SmiReport(tuple(gpus), None)


_NVRM = re.compile(r"NVRM version: NVIDIA UNIX (?P<kind>.*?)\s+(?P<version>\d+\.\d+(\.\d+)?)\s")


def parse_module_version(text: str) -> LoadedModule | None:
    """``NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  Release Build …``"""
    match = _NVRM.search(text)
    if not match:
        return None
    return LoadedModule(match.group("version"), "Open Kernel Module" in match.group("kind"))


def parse_fabric(lines: list[str]) -> tuple[str, str] | None:
    """(State, Status) from the first GPU's Fabric section of ``nvidia-smi -q``; None without."""
    gpus = parse_tree(lines)
    fabric = gpus[0][1].get("Fabric") if gpus else None
    if not isinstance(fabric, dict) or "State" not in fabric:
        return None
    return str(fabric["State"]), str(fabric.get("Status") or "N/A")


class NvidiaSmi(FactBase[SmiReport]):
    """The GPUs as ``nvidia-smi`` lists them (or its error)."""

    def command(self) -> str:
        return (f"nvidia-smi --query-gpu={QUERY} --format=csv,noheader,nounits 2>&1; "
                f"echo {EXIT_MARK}$?")

    def process(self, output: list[str]) -> SmiReport:
        return parse_query(output)


class NvidiaModule(FactBase[LoadedModule | None]):
    """The NVIDIA kernel module loaded now, None when none is."""

    def command(self) -> str:
        return "cat /proc/driver/nvidia/version 2>/dev/null || true"

    def process(self, output: list[str]) -> LoadedModule | None:
        return parse_module_version("\n".join(output))


class NvidiaFabric(FactBase[tuple[str, str] | None]):
    """NVSwitch fabric (State, Status) of GPU 0; None on hosts without an NVSwitch fabric."""

    def command(self) -> str:
        return "nvidia-smi -q -i 0 2>/dev/null || true"

    def process(self, output: list[str]) -> tuple[str, str] | None:
        fabric = parse_fabric(output)
        if fabric is None or fabric[0] == "N/A":
            return None
        return fabric


class AptVersions(FactBase[list[str]]):
    """Versions of a package the configured repositories offer, newest first."""

    def command(self, package: str) -> str:
        return f"apt-cache madison {package} 2>/dev/null | cut -d'|' -f2 || true"

    def process(self, output: list[str]) -> list[str]:
        return [line.strip() for line in output if line.strip()]


class HeldPackages(FactBase[list[str]]):
    def command(self) -> str:
        return "apt-mark showhold"

    def process(self, output: list[str]) -> list[str]:
        return [line.strip() for line in output if line.strip()]
