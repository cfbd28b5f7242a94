"""GPU health as an operator reads it: Xid events in this boot's kernel log, ECC and row
remapping from ``nvidia-smi -q``, clocks event reasons (thermal and power braking), NVLink error
counters (``nvidia-smi nvlink -e``) and the NVSwitch fabric state.

    [f.describe() for f in host.get_fact(GpuHealth).findings]

A *fatal* finding means the GPU cannot be trusted to serve: the deploy refuses the host before
any change (unless host data ``gpu_health_ignore`` names it).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from pyinfra.api.facts import FactBase

RESET = "reset the GPU (stop its servers, then nvidia-smi -r -i {gpu}) or reboot the host"
REBOOT = "reboot the host (a cold power cycle if it comes back the same)"
REPLACE = "replace the GPU (NVIDIA RMA; drain the host until then)"
APP = "usually the application's fault; if it repeats with other programs run dcgmi diag -r 3"

# Xid: (what it means, fatal, the operator's fix). From NVIDIA's Xid catalogue (GPU deployment
# and management documentation, "Xid Errors"); fatal where the GPU needs a reset or worse.
XIDS: dict[int, tuple[str, bool, str]] = {
    13: ("graphics engine exception (an illegal instruction or address in a kernel)", False, APP),
    31: ("GPU memory page fault (an illegal address, normally the application's)", False, APP),
    43: ("GPU stopped processing (a user application fault; the GPU recovered)", False, APP),
    45: ("preemptive cleanup after an earlier error or a killed process", False,
         "follows another Xid or a killed process: see the Xids before it"),
    48: ("double-bit (uncorrectable) ECC error", True, RESET + "; " + REPLACE + " if it repeats"),
    63: ("ECC page retirement or row remapping recorded (applied at the next GPU reset)", False,
         "reset the GPU when convenient to apply the remap"),
    64: ("ECC page retirement or row remapping could not be recorded", True, REPLACE),
    74: ("NVLink error (a link was taken down)", True,
         RESET + "; check the NVLink/NVSwitch trays if it repeats"),
    79: ("GPU has fallen off the bus", True, REBOOT + "; " + REPLACE + " or reseat it if it "
         "repeats"),
    92: ("high single-bit ECC error rate", False, "watch it: replace the GPU if it keeps rising"),
    94: ("contained uncorrectable ECC error (the affected application was stopped)", True,
         RESET + " to remap the row; the other applications were unaffected"),
    95: ("uncontained uncorrectable ECC error (every application on the GPU is affected)", True,
         RESET),
    119: ("GSP RPC timeout (the GPU's system processor stopped answering)", True,
          RESET + "; update the driver if it repeats"),
    120: ("GSP error", True, RESET + "; update the driver if it repeats"),
}
# Clocks event reasons that brake the GPU: thermal limits and the board's power brake signal.
BRAKES = {
    "HW Slowdown": ("clocks-hw-slowdown", "hardware slowdown (thermal or power brake)"),
    "HW Thermal Slowdown": ("clocks-thermal", "hardware thermal slowdown"),
    "SW Thermal Slowdown": ("clocks-thermal", "software thermal slowdown"),
    "HW Power Brake Slowdown": ("clocks-power-brake", "power brake asserted by the board"),
}
MARK = "__gpuhealth_"


@dataclass(frozen=True)
class Finding:
    id: str  # what gpu_health_ignore names: xid-79, ecc-uncorrectable, remap-pending, ...
    gpu: str  # index or PCI bus id ("?" when the kernel log names a device nvidia-smi lacks)
    fatal: bool
    what: str
    fix: str

    def describe(self) -> str:
        """``GPU 3: xid-79 GPU has fallen off the bus (fatal); fix: reboot ...``"""
        return (f"GPU {self.gpu}: {self.id} {self.what}{' (fatal)' if self.fatal else ''}; "
                f"fix: {self.fix.format(gpu=self.gpu)}")


@dataclass(frozen=True)
class GpuState:
    """One GPU as ``nvidia-smi -q`` describes it (the keys this module reads)."""

    index: int
    bus_id: str  # 00000000:18:00.0
    name: str
    memory_total_mib: int | None
    memory_used_mib: int | None
    memory_free_mib: int | None
    tree: dict[str, object] = field(repr=False, compare=False)


@dataclass(frozen=True)
class Health:
    """Everything read, and what it means; ``error`` when nvidia-smi could not be read."""

    gpus: tuple[GpuState, ...]
    findings: tuple[Finding, ...]
    error: str | None = None

    def fatal(self, ignore: Iterable[str] = ()) -> list[Finding]:
        skip = set(ignore)
        return [f for f in self.findings if f.fatal and f.id not in skip]


def parse_tree(lines: list[str]) -> list[tuple[str, dict[str, object]]]:
    """``nvidia-smi -q`` as (bus id, nested dict) per GPU: sections by indentation, leaves
    ``key : value``."""
    gpus: list[tuple[str, dict[str, object]]] = []
    stack: list[tuple[int, dict[str, object]]] = []
    for raw in lines:
        if not raw.strip():
            continue
        indent = len(raw) - len(raw.lstrip())
        text = raw.strip()
        if indent == 0:
            match = re.fullmatch(r"GPU ([0-9A-Fa-f]+:[0-9A-Fa-f]+:[0-9A-Fa-f]+\.[0-9A-Fa-f])",
                                 text)
            stack = []
            if match:
                gpus.append((match.group(1), {}))
                stack = [(0, gpus[-1][1])]
            continue
        if not stack:
            continue
        while len(stack) > 1 and stack[-1][0] >= indent:
            stack.pop()
        key, sep, value = text.partition(":")
        if sep and value.strip():
            stack[-1][1][key.strip()] = value.strip()
        elif sep or not value:  # "Processes : None" has a value; a section has none
            section: dict[str, object] = {}
            stack[-1][1][key.strip()] = section
            stack.append((indent, section))
    return gpus


def _get(tree: dict[str, object], *path: str) -> object:
    node: object = tree
    for key in path:
        if not isinstance(node, dict):
            return None
        node = node.get(key)
    return node


def _mib(value: object) -> int | None:
    match = re.match(r"(\d+)\s*MiB", str(value or ""))
    return int(match.group(1)) if match else None


def _count(value: object) -> int:
    return int(value) if isinstance(value, str) and value.isdigit() else 0


def gpu_findings(gpu: GpuState) -> list[Finding]:
    """ECC, row remapping, clocks braking and fabric state of one GPU."""
    t, idx, out = gpu.tree, str(gpu.index), []
    volatile = _get(t, "ECC Errors", "Volatile")
    uncorrected = sum(_count(v) for k, v in (volatile.items() if isinstance(volatile, dict)
                                              else ()) if "Uncorrectable" in k)
    if uncorrected:
        out.append(Finding("ecc-uncorrectable", idx, True,
                           f"{uncorrected} uncorrectable ECC error(s) since the driver loaded",
                           RESET))
    for key, fid in (("SRAM Threshold Exceeded", "sram-threshold"),
                     ("Unrepairable Memory", "unrepairable-memory")):
        where = ("ECC Errors", "Aggregate", key) if key.startswith("SRAM") else ("ECC Errors", key)
        if _get(t, *where) == "Yes":
            out.append(Finding(fid, idx, True, f"{key.lower()}", REPLACE))
    if _get(t, "Remapped Rows", "Pending") == "Yes":
        out.append(Finding("remap-pending", idx, True, "row remapping pending (a reset applies "
                           "it; until then the faulty row stays in use)", RESET))
    if _get(t, "Remapped Rows", "Remapping Failure Occurred") == "Yes":
        out.append(Finding("remap-failure", idx, True, "row remapping failed (no spare rows)",
                           REPLACE))
    reasons = _get(t, "Clocks Event Reasons")
    flat = _flatten(reasons) if isinstance(reasons, dict) else {}
    for key, (fid, what) in BRAKES.items():
        if flat.get(key) == "Active":
            out.append(Finding(fid, idx, False, f"{what} is active",
                               "check the cooling (fans, inlet temperature) and the power "
                               "supplies of the host"))
    fabric_state = _get(t, "Fabric", "State")
    fabric_status = _get(t, "Fabric", "Status")
    if fabric_state not in (None, "N/A", "Completed"):
        out.append(Finding("fabric", idx, False, f"NVSwitch fabric {fabric_state}",
                           "the driver stage starts the fabric manager and NVLSM; if it stays "
                           "so, check nvidia-fabricmanager's journal"))
    elif fabric_state == "Completed" and fabric_status not in ("Success", None, "N/A"):
        out.append(Finding("fabric", idx, True, f"NVSwitch fabric Completed with status "
                           f"{fabric_status}", "restart nvidia-fabricmanager; " + REBOOT))
    summary = _get(t, "Fabric", "Health", "Summary")
    if summary not in (None, "N/A", "Healthy"):
        out.append(Finding("fabric-health", idx, False, f"fabric health {summary}",
                           "check the NVSwitch trays and nvidia-fabricmanager's journal"))
    return out


def _flatten(node: dict[str, object]) -> dict[str, object]:
    flat: dict[str, object] = {}
    for key, value in node.items():
        if isinstance(value, dict):
            flat.update(_flatten(value))
        else:
            flat[key] = value
    return flat


_XID = re.compile(r"NVRM: Xid \(PCI:(?P<pci>[0-9A-Fa-f:.]+)\): (?P<xid>\d+),\s*(?P<rest>.*)")


def _bus(pci: str) -> tuple[int, int]:
    """(bus, device) of ``0000:18:00`` or ``00000000:18:00.0``: the part both spellings share."""
    parts = pci.split(".")[0].split(":")
    return int(parts[-2], 16), int(parts[-1], 16)


def xid_findings(lines: list[str], gpus: tuple[GpuState, ...]) -> list[Finding]:
    """One finding per (GPU, Xid) in the kernel log, with how often it happened."""
    index = {_bus(g.bus_id): str(g.index) for g in gpus}
    seen: dict[tuple[str, int], tuple[int, str]] = {}
    for line in lines:
        match = _XID.search(line)
        if not match:
            continue
        try:
            gpu = index.get(_bus(match.group("pci")), match.group("pci"))
        except (ValueError, IndexError):
            gpu = match.group("pci")
        key = (gpu, int(match.group("xid")))
        count, _ = seen.get(key, (0, ""))
        seen[key] = (count + 1, match.group("rest").strip())
    out = []
    for (gpu, xid), (count, last) in seen.items():
        meaning, fatal, fix = XIDS.get(xid, ("an Xid this tool does not know", False,
                                             "look it up in NVIDIA's Xid catalogue"))
        times = f" ({count} times)" if count > 1 else ""
        out.append(Finding(f"xid-{xid}", gpu, fatal, f"{meaning}{times}; last: {last[:160]}",
                           fix))
    return out


_LINK = re.compile(r"Link (?P<link>\d+): (?P<counter>[A-Za-z ]*Errors?):\s*(?P<n>\d+)")


def nvlink_findings(lines: list[str]) -> list[Finding]:
    """Nonzero error counters of ``nvidia-smi nvlink -e`` (``GPU N: ...`` then ``Link L: Replay
    Errors: 0`` lines), one finding per GPU."""
    gpu = "?"
    errors: dict[str, list[str]] = {}
    for line in lines:
        head = re.match(r"GPU (\d+):", line.strip())
        if head:
            gpu = head.group(1)
            continue
        match = _LINK.search(line)
        if match and int(match.group("n")):
            errors.setdefault(gpu, []).append(
                f"link {match.group('link')} {match.group('counter').lower()} {match.group('n')}")
    return [Finding("nvlink-errors", gpu, False, ", ".join(found[:6]),
                    "watch them: rising counters precede Xid 74; reseat or replace the link")
            for gpu, found in errors.items()]


def _sections(lines: list[str]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    current = None
    for line in lines:
        if line.startswith(MARK):
            current = line[len(MARK):].strip()
            out[current] = []
        elif current is not None:
            out[current].append(line)
    return out


def _exit(lines: list[str]) -> tuple[int, list[str]]:
    code, body = 0, []
    for line in lines:
        if line.startswith("__exit="):
            code = int(line[7:] or 0)
        else:
            body.append(line)
    return code, body


def parse(lines: list[str]) -> Health | None:
    """The fact's output (sections ``smi``, ``nvlink``, ``kernel``); None without nvidia-smi
    (a host the driver stage has not reached yet: nothing to judge)."""
    parts = _sections(lines)
    if "absent" in parts:
        return None
    code, smi = _exit(parts.get("smi", []))
    if code:
        text = " ".join(line.strip() for line in smi if line.strip())
        return Health((), (), text or f"nvidia-smi -q exited {code}")
    gpus = tuple(GpuState(i, bus, str(_get(tree, "Product Name") or "?"),
                          _mib(_get(tree, "FB Memory Usage", "Total")),
                          _mib(_get(tree, "FB Memory Usage", "Used")),
                          _mib(_get(tree, "FB Memory Usage", "Free")), tree)
                 for i, (bus, tree) in enumerate(parse_tree(smi)))
    _, nvlink = _exit(parts.get("nvlink", []))
    findings = [f for g in gpus for f in gpu_findings(g)]
    findings += xid_findings(parts.get("kernel", []), gpus)
    findings += nvlink_findings(nvlink)
    return Health(gpus, tuple(findings))


class GpuHealth(FactBase[Health | None]):
    """Xids in this boot's kernel log (journald's, else the ring buffer), ``nvidia-smi -q`` and
    ``nvidia-smi nvlink -e``; None on a host without nvidia-smi. Reading the kernel log needs
    root: the fact takes ``_sudo`` from host data as every fact does."""

    def command(self) -> str:
        return (f"command -v nvidia-smi >/dev/null || {{ echo {MARK}absent; exit 0; }}; "
                f"echo {MARK}smi; nvidia-smi -q 2>&1; echo __exit=$?; "
                f"echo {MARK}nvlink; nvidia-smi nvlink -e 2>&1; echo __exit=$?; "
                f"echo {MARK}kernel; "
                # journald keeps the whole boot; without kernel messages in it (a container,
                # ReadKMsg=no) the ring buffer is what is left
                "journalctl -k -b 0 -o short-iso --no-pager 2>/dev/null | grep -F 'NVRM: Xid' "
                "|| dmesg 2>/dev/null | grep -F 'NVRM: Xid' || true")

    def process(self, output: list[str]) -> Health | None:
        return parse(output)
