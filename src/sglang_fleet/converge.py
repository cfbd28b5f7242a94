"""What each deploy does to one host, as functions pyinfra runs per host: the files under
``deploys/`` call them, and ``sglang-fleet roll`` names them to pyinfra directly, so neither
depends on the directory it runs from.

    pyinfra -y inventories/b200.py deploys/sglang.py
    pyinfra -y inventories/b200.py sglang_fleet.converge.serve      # the same
"""

from __future__ import annotations

from typing import cast

from pyinfra.api.operation import OperationMeta
from pyinfra.context import host, inventory, state

from sglang_fleet import hostconfig
from sglang_fleet.config.profile import Profile
from sglang_fleet.config.render import Launch, render_all
from sglang_fleet.errors import InputError
from sglang_fleet.facts.nvidia import NvidiaSmi
from sglang_fleet.facts.users import LoginUsers
from sglang_fleet.fleet import cutover
from sglang_fleet.fleet import inventory as fleet
from sglang_fleet.hostconfig import groups, preflight
from sglang_fleet.hostconfig.gpu_health import require_gpu_health
from sglang_fleet.report import metrics_targets
from sglang_fleet.stages.compiled.deploy import announce_kernels, share_kernels
from sglang_fleet.stages.driver.deploy import install_driver
from sglang_fleet.stages.engine.deploy import Release, install_engine
from sglang_fleet.stages.gate.deploy import gate_programs, run_gate, smoke_test
from sglang_fleet.stages.gate.group import restore_group
from sglang_fleet.stages.gate.resize import with_remembered_size
from sglang_fleet.stages.router.deploy import install_router, remove_router
from sglang_fleet.stages.service.deploy import install_service, require_free_ports, startup_budget
from sglang_fleet.stages.service.last_good import restore_files, restore_last_good
from sglang_fleet.stages.teardown.deploy import Purge, teardown
from sglang_fleet.stages.warmup.deploy import warm_caches
from sglang_fleet.stages.weights.deploy import stage_weights


def host_launches(check: bool = False) -> tuple[Profile, list[Launch]]:
    """This host's profile for its GPUs and its launches; ``check`` (a deploy): with the
    remembered mamba cache size, preflighted before any change."""
    smi = host.get_fact(NvidiaSmi)
    profile = hostconfig.profile_for(host, smi)
    if not check:  # a member of a multi-node group: its rank from the inventory
        return profile, render_all(profile, rank=groups.rank_for(host, profile))
    profile = with_remembered_size(profile)
    users: list[str] = host.get_fact(LoginUsers)
    facts = preflight.Facts(gpu_count=hostconfig.gpu_count(host, smi), login_users=tuple(users))
    return profile, preflight.launches(host, profile, facts)  # check's and the roll's checks


def whole_group(what: str) -> None:
    """Stop before any change when ``--limit`` takes part of this host's group: its members
    restart, stop and are gated together, so one member alone would break the server."""
    limit = getattr(state, "limit_hosts", None)
    members = groups.group_hosts(host)
    if members and isinstance(limit, list):
        problems = groups.partial_groups([h.name for h in limit], members, f"--limit of {what}")
        InputError.raise_any(problems)


def serve() -> None:
    """preflight → driver → engine → weights → warm-up → service → gate; preflight fails before
    any host changes. In a roll the service stage waits for the host's turn and receives the
    kernels an earlier host compiled; after its gate, the first host shares its own."""
    profile, launches = host_launches(check=True)
    whole_group("deploys/sglang.py")
    require_free_ports(launches)
    require_gpu_health()
    # The fleet's Prometheus targets, on this machine, once a run (prometheus_file_sd).
    targets = hostconfig.of(host).prometheus_file_sd
    if targets and host.name == fleet.serving_hosts(inventory)[0].name:
        metrics_targets.write_targets(inventory, targets)
    install_driver()
    # pyinfra types a @deploy call as returning an OperationMeta; these return what they built.
    release = cast(Release, install_engine(profile=profile))
    weights = cast(list[OperationMeta], stage_weights(profile=profile))
    warm_caches(profile=profile, launches=launches, release=release, budget=startup_budget())
    gate_programs()  # up before the restart: out of the routers only for restart and checks
    install_service(profile=profile, launches=launches, release=release, restart_if=weights)
    run_gate(profile=profile, launches=launches, release=release)
    share_kernels(launches=launches, release=release)  # in a roll, for the hosts after it


def prepare() -> None:
    """What a roll does on every host while it still serves: the engine release installed, the
    weights staged, the caches warmed, which compiled kernels it needs said; nothing restarts
    and ``current`` stays (the driver and the switch wait for the cutover)."""
    profile, launches = host_launches(check=True)
    release = cast(Release, install_engine(profile=profile))
    stage_weights(profile=profile)
    warm_caches(profile=profile, launches=launches, release=release, budget=startup_budget())
    announce_kernels(launches=launches, release=release)  # which kernels it will need
    cutover.prepared(name="In a roll, this host prepared")


def driver() -> None:
    """The driver stage alone."""
    hostconfig.check_host(host)  # bad host data stops the run before any host changes
    require_gpu_health()
    install_driver()


def router() -> None:
    """The router on the hosts of the group ``routers``; removed from any other host."""
    if hostconfig.of(host).routers:  # bad host data stops the run before any host changes
        install_router(config=fleet.RouterConfig.from_host(host),
                       worker_urls=fleet.all_worker_urls(inventory),
                       gateway=fleet.gateway_args(inventory, host))
    else:
        remove_router()


def restore() -> None:
    """The last release that passed the gate, back and gated again."""
    profile, launches = host_launches()
    whole_group("deploys/restore.py")
    if groups.group_hosts(host):  # one server over the group: restored and restarted whole
        restore_group(profile=profile, launch=launches[0])
    else:
        restore_last_good(profile=profile, launches=launches)


def unstage() -> None:
    """The last good units' files back without a restart: a roll stopped after this host's
    turn and before its restart (its server still runs the last good release)."""
    _, launches = host_launches()
    for launch in launches:
        restore_files(name=f"Files of {launch.unit} back to the last good release",
                      unit=launch.unit)


def smoke() -> None:
    """A smoke generation against every server of the host, changing nothing."""
    profile, launches = host_launches()
    smoke_test(profile=profile, launches=launches)


def take_down() -> None:
    """Out of the routers, the router, the units; what ``purge`` names besides."""
    cfg = hostconfig.of(host)
    whole_group("deploys/teardown.py")
    urls = fleet.worker_urls(host) if fleet.is_serving(host) else []
    # a group's member: rank 0 leaves the routers and stops before the others stop
    grouped = fleet.is_serving(host) and bool(groups.group_hosts(host))
    teardown(purge=Purge.of(cfg), urls=urls, routers=fleet.routers(inventory),
             is_router=cfg.routers,
             group_units=[launch.unit for launch in render_all(hostconfig.profile_for(host))]
             if grouped else [])
