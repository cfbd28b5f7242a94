"""Preflight GPU health: a host with a fatal finding (``facts/gpuhealth.py``) is refused before
any change, with the operator's fix; warnings are printed and the deploy goes on. Host data
``gpu_health_ignore`` lets named findings through (a GPU reset leaves its Xid in the log).
"""

from __future__ import annotations

from pyinfra import logger
from pyinfra.context import host

from sglang_fleet import hostconfig
from sglang_fleet.errors import InputError, Problem
from sglang_fleet.facts.gpuhealth import Finding, GpuHealth, Health


def merged(findings: list[Finding]) -> list[tuple[Finding, list[str]]]:
    """Findings that differ only by GPU, once each with the GPUs they concern (a fabric that
    is not ready says so once, not for each of 8 GPUs)."""
    groups: dict[tuple[str, str, bool], tuple[Finding, list[str]]] = {}
    for f in findings:
        groups.setdefault((f.id, f.what, f.fatal), (f, []))[1].append(f.gpu)
    return list(groups.values())


def problems(health: Health | None, ignore: list[str], host_name: str) -> list[Problem]:
    if health is None:
        return []
    out = []
    for finding, gpus in merged(health.fatal(ignore)):
        which = ",".join(gpus)
        out.append(Problem(f"host {host_name}", f"GPU {which}",
                           f"{finding.id}: {finding.what}",
                           finding.fix.format(gpu=which) + f"; once dealt with, "
                           f"gpu_health_ignore = ['{finding.id}'] in host data lets the "
                           "deploy through"))
    return out


def warnings(health: Health | None, ignore: list[str]) -> list[str]:
    """One line for each finding that is not fatal (or is ignored), and an unreadable GPU."""
    if health is None:
        return []
    lines = [f"GPU {','.join(gpus)}: {f.id} {f.what}"
             + (" (ignored by gpu_health_ignore)" if f.fatal else f"; {f.fix.format(gpu='N')}")
             for f, gpus in merged([f for f in health.findings
                                    if not f.fatal or f.id in ignore])]
    if health.error:
        lines.append(f"GPU health unreadable: nvidia-smi: {health.error} (the driver stage "
                     "deals with it)")
    return lines


def require_gpu_health() -> None:
    ignore = list(hostconfig.of(host).gpu_health_ignore)
    health: Health | None = host.get_fact(GpuHealth)
    for line in warnings(health, ignore):
        logger.warning(f"{host.print_prefix}GPU health: {line}")
    found = problems(health, ignore, host.name)
    InputError.raise_any(found)
