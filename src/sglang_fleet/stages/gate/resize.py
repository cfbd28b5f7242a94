"""``memory.target_running_requests`` in a deploy: the size a host remembers is rendered before
anything starts; a gate that reads fewer running requests from the log computes the size
(``sizing.size``), the unit is rendered again with it and restarted once, gated again, and the
size is remembered once that gate passes.

    profile = with_remembered_size(hostconfig.profile_for(host))   # converge, before rendering
    # gate.run_gate: gate → sized_restart → gate (final) → remember_size, each only if needed
"""

from __future__ import annotations

from io import StringIO
from typing import Any

from pyinfra import logger
from pyinfra.api.operation import operation
from pyinfra.context import host
from pyinfra.operations import files

from sglang_fleet import paths
from sglang_fleet.config import sizing
from sglang_fleet.config.profile import Profile
from sglang_fleet.config.render import Launch, render
from sglang_fleet.facts.nvidia import NvidiaSmi
from sglang_fleet.facts.sizing import RememberedSize
from sglang_fleet.fleet.cutover import disrupt
from sglang_fleet.ops import Ops
from sglang_fleet.remote import capacity
from sglang_fleet.stages.engine.deploy import Release
from sglang_fleet.stages.gate.program import GateResult
from sglang_fleet.stages.service.deploy import unit_file
from sglang_fleet.stages.service.units import start_command


def gpu_memory_mib() -> int | None:
    """The smallest GPU memory of the host (nvidia-smi), None before the driver is there."""
    report = host.get_fact(NvidiaSmi)
    if not report or not report.ok or not report.gpus:
        return None
    return min(gpu.memory_mib for gpu in report.gpus)


def _digest(profile: Profile, gpu: int) -> str:
    """The key of a profile's remembered size: its launch without any size (sizing.key)."""
    return sizing.key(render(sizing.apply(profile, None)), gpu)


def with_remembered_size(profile: Profile) -> Profile:
    """The host's profile with its target resolved (``sizing.apply``) at the size the host
    remembers for this release, model, flags and GPU memory; without a record, SGLang sizes
    the cache on the first start and the gate sizes it from that start's log. A profile
    without ``memory.target_running_requests`` is returned as it is.

        profile = with_remembered_size(hostconfig.profile_for(host))
    """
    if profile.memory.target_running_requests is None:
        return profile
    gpu = gpu_memory_mib()
    if gpu is None:
        return sizing.apply(profile, None)
    digest = _digest(profile, gpu)
    text = host.get_fact(RememberedSize, digest=digest)
    return sizing.apply(profile, sizing.remembered(text, digest) if text else None)


def _capacity(result: dict[str, Any]) -> capacity.Capacity:
    """The gate's capacity JSON (``Capacity.as_json``) as a Capacity again."""
    data = dict(result.get("capacity") or {})
    draft = data.pop("draft", None)
    fields = capacity.Capacity.__dataclass_fields__
    cap = capacity.Capacity(**{k: v for k, v in data.items() if k in fields})
    cap.draft = capacity.Worker(**draft) if isinstance(draft, dict) else None
    return cap


def judge(profile: Profile, launch: Launch, result: dict[str, Any], final: bool,
          restarted_with: int | None = None) -> tuple[str | None, int | None]:
    """(error, size to restart with) for a gate that passed its checks: (None, None) when the
    log's max running requests reaches the target; a size when one reaches it and a restart is
    still allowed (not ``final``); otherwise the error saying why not (``restarted_with``: the
    size the server was restarted with, for the message).

        judge(profile, launch, gate_json, final=False)   # (None, 240)
    """
    target = profile.memory.target_running_requests
    if target is None:
        return None, None
    gpu = gpu_memory_mib()
    plan = sizing.size(_capacity(result), target, launch, gpu / 1024 if gpu else None)
    if plan.reached:
        logger.info(f"{host.print_prefix}{launch.unit}: target: max running requests "
                    f"{plan.running} (from the log) reaches memory.target_running_requests "
                    f"{target}")
        return None, None
    if plan.reason:
        return f"{launch.unit}: {plan.reason}", None
    if final:
        size = restarted_with or launch.args.get("max_mamba_cache_size")
        return (f"{launch.unit}: with --max-mamba-cache-size {size}, max running requests is "
                f"{plan.running} (from the log), below memory.target_running_requests "
                f"{target}, and a deploy restarts a server at most once to size it"), None
    logger.info(f"{host.print_prefix}{launch.unit}: target: max running requests "
                f"{plan.running} (from the log) is below memory.target_running_requests "
                f"{target}: restarting once with --max-mamba-cache-size {plan.slots} (the KV "
                f"cache keeps about {plan.kv_tokens} tokens)")
    return None, plan.slots


def sized(profile: Profile, launch: Launch, slots: int) -> Launch:
    """The launch again, rendered from the profile with the mamba cache at ``slots``."""
    return render(sizing.apply(profile, slots), launch.version, launch.instance, launch.rank)


@operation(is_idempotent=True)
def sized_restart(profile: Profile, launch: Launch, release: Release, result: GateResult) -> Ops:
    """Write the launch's unit again, rendered with the mamba cache size the gate computed
    (the service stage's own unit file, ``service.unit_file``), and restart it once.

    + result: the gate's, holding the size (nothing happens without one)

        sized_restart(name="Restart sglang.service sized", profile=profile, launch=launch,
                      release=release, result=result, _if=result.resizing)
    """
    if result.resize is None:  # also in the preview: the gate finds the size when it runs
        return
    again = sized(profile, launch, result.resize)
    yield from files.template._inner(**unit_file(profile, again, release))
    yield "systemctl daemon-reload"
    # the host leaves whole: the roll puts it back after its gate
    yield from disrupt(start_command(launch.unit))


@operation(is_idempotent=True)
def remember_size(profile: Profile, launch: Launch, result: GateResult) -> Ops:
    """Keep the size that passed the gate on the host (root's, under ``paths.SIZING``), keyed by
    what it depends on, so the next deploy renders it before the first start.

    + result: the gate's, holding the size that passed (nothing happens without one)

        remember_size(name="Remember the size", profile=profile, launch=launch,
                      result=result, _if=result.resizing)
    """
    if result.resize is None:  # also in the preview: the gate finds the size when it runs
        return
    target = profile.memory.target_running_requests
    gpu = gpu_memory_mib()
    if target is None or gpu is None:
        return
    digest = _digest(profile, gpu)
    yield from files.directory._inner(path=paths.SIZING, user="root", group="root", mode="755")
    yield from files.put._inner(
        src=StringIO(sizing.record(digest, result.resize, target)),
        dest=sizing.record_path(digest), user="root", group="root", mode="644")
