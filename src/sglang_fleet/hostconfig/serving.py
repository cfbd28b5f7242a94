"""The profile a pyinfra host serves: its ``sglang_profile`` plus overrides from host and group
data (``overrides``), for the GPUs it has."""

from __future__ import annotations

from pyinfra.api.host import Host

from sglang_fleet.config import profile
from sglang_fleet.config.checks import AUTO, profile_fix
from sglang_fleet.errors import InputError
from sglang_fleet.facts.nvidia import SmiReport
from sglang_fleet.hostconfig.access import of

PROFILE_KEY = "sglang_profile"
GPU_COUNT_KEY = "gpu_count"


def gpu_count(host: Host, smi: SmiReport | None = None) -> int | None:
    """How many GPUs ``host`` has: what nvidia-smi (``smi``) lists, else host data
    ``gpu_count``; the two must agree."""
    declared = of(host).gpu_count
    seen = len(smi.gpus) if smi is not None and smi.ok else None
    if seen is not None and declared is not None and seen != declared:
        raise InputError.one(f"pyinfra data of {host.name}", GPU_COUNT_KEY,
                             f"nvidia-smi on {host.name} lists {seen} GPU(s), host data says "
                             f"{declared}", "find the missing GPU first (nvidia-smi -q, the "
                             "kernel log for an Xid 79: fallen off the bus), or set gpu_count "
                             f"to {seen} to serve from what the host has")
    return seen if seen is not None else declared


def _auto_gpus(host: Host, smi: SmiReport | None, loaded: profile.Profile) -> tuple[int, str]:
    """The GPU count ``instances: auto`` divides, and what it was read from."""
    count = gpu_count(host, smi)
    if count is not None:
        seen = smi is not None and smi.ok
        return count, f"{host.name} ({'nvidia-smi' if seen else 'host data gpu_count'})"
    why = (f"nvidia-smi on {host.name}: {smi.error}," if smi is not None and smi.error
           else "the fleet's plan (router workers, roll, status) is read before connecting,")
    raise InputError.one(loaded.source_of("parallel.instances"), "parallel.instances",
                         f"auto needs {host.name}'s GPU count: {why} and host data has no "
                         f"{GPU_COUNT_KEY}", f"set {GPU_COUNT_KEY} = 8 (the host's GPUs) in "
                         "host data, or parallel.instances to a number")


def declared_profile(host: Host) -> profile.Profile:
    """The profile ``host``'s data names, with its overrides, not yet sized for its GPUs:
    what the members of a multi-node group compare."""
    cfg = of(host)
    if not cfg.sglang_profile:
        raise InputError.one(cfg.source, PROFILE_KEY, "no serving profile for this host",
                             profile_fix())
    return profile.load(cfg.sglang_profile, cfg.sglang_overrides, cfg.sglang_overrides.sources,
                        allow_insecure_urls=cfg.allow_insecure_urls)


def profile_for(host: Host, smi: SmiReport | None = None) -> profile.Profile:
    """The profile ``host`` serves, with its overrides, sized for its GPUs (``gpu_count``)."""
    loaded = declared_profile(host)
    if loaded.parallel.instances != AUTO:
        gpu_count(host, smi)  # a host that lost a GPU is said so whatever the profile asks
        return loaded
    return loaded.for_gpus(*_auto_gpus(host, smi, loaded))
