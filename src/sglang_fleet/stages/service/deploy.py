"""Service stage: a templated systemd unit running the rendered argv with the release's python,
secrets and environment in a root-only EnvironmentFile, restarted only when the unit, its
environment, the release or the weights changed. A host's servers restart in waves
(``waves``): the first alone, ready before the others start from the caches it compiled.

    from sglang_fleet.stages.service.deploy import install_service
    install_service(profile=profile, launches=render_all(profile), release=release,
                    restart_if=weights)   # in a pyinfra deploy, after the engine and weights
"""

from __future__ import annotations

import io
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from pyinfra import logger
from pyinfra.api.command import FunctionCommand
from pyinfra.api.deploy import deploy
from pyinfra.api.operation import OperationMeta, operation
from pyinfra.context import host
from pyinfra.facts.files import File, FindFiles
from pyinfra.operations import apt, files, systemd
from pyinfra.operations.util import any_changed

from sglang_fleet import hostconfig, paths
from sglang_fleet.config import connection, exposure
from sglang_fleet.config.exposure import spans_hosts
from sglang_fleet.config.profile import Profile
from sglang_fleet.config.render import Launch
from sglang_fleet.errors import InputError, Problem
from sglang_fleet.facts.ports import Listener, PortListeners
from sglang_fleet.facts.systemd import SystemdVersion, UnitCondition
from sglang_fleet.fleet import inventory as fleet
from sglang_fleet.fleet import roll_directory
from sglang_fleet.fleet.cutover import disrupt, rejoin, turn
from sglang_fleet.hostconfig import groups
from sglang_fleet.ops import Ops
from sglang_fleet.ops.host_programs import SHARED, program, upload
from sglang_fleet.ops.secretfile import api_key, secret_file, secrets_directory
from sglang_fleet.ops.unitfile import UnsafeValue, env_line, systemd_word, unit_text
from sglang_fleet.stages.compiled.deploy import receive_kernels
from sglang_fleet.stages.compiled.kernel_caches import cache_env
from sglang_fleet.stages.engine.deploy import Release, switch_release
from sglang_fleet.stages.gate.program import check_all, error_of
from sglang_fleet.stages.service.group_restart import restart_group
from sglang_fleet.stages.service.group_unit import group_unit
from sglang_fleet.stages.service.units import found_down, start_command
from sglang_fleet.stages.service.waves import Waves, retired

TEMPLATE = str(Path(__file__).with_name("sglang.service.j2"))  # beside its deploy
# Starts SGLang with the keys from the environment file, in-process (remote/start_server.py).
LAUNCHER = "sglang_fleet.remote.start_server"
# Crash loops: the automatic restarts systemd makes before it gives up (the start limit).
# Deliberate starts clear the count first (``start_command``), so it counts crashes only.
CRASH_RESTARTS = 5
RESTART_STEPS_SINCE = 254  # the systemd release with RestartSteps and RestartMaxDelaySec


def service_env(launch: Launch) -> dict[str, str]:
    """What every server process sees: its home, every compile cache under /var/cache/sglang."""
    return {"HOME": paths.STATE, **cache_env(launch.version)}


def environment(launch: Launch, secrets: dict[str, str],
                host_env: Mapping[str, str] | None = None) -> str:
    """The EnvironmentFile: caches (the release's own, caches.py), the profile's env, the
    host's own (``host_env``: its NCCL and gloo interfaces, which differ host by host, so they
    win over the profile's) and the secrets' values."""
    env = {**service_env(launch), **launch.env, **(host_env or {}), **secrets}
    return "# Managed by sglang-fleet (root, 0600): holds secrets.\n" + "".join(
        f"{env_line(k, v)}\n" for k, v in sorted(env.items()))


def exec_start(launch: Launch, release: Release) -> str:
    """The unit's ExecStart: the launcher, then SGLang's module and flags (no key among them)."""
    words = program(release.python_bin, LAUNCHER, *launch.argv[2:])
    return " ".join(systemd_word(w) for w in words)


def secret_values(launch: Launch, host_name: str, secrets: Mapping[str, str]) -> dict[str, str]:
    """Values of the secrets the launch refers to, from host data's ``secrets``: ``{var: value}``
    (``SGLANG_API_KEY``)."""
    values = {}
    for var, name in launch.secrets.items():
        if name not in secrets:
            raise InputError.one(f"pyinfra data of {host_name}", f"secrets.{name}",
                                 f"the profile needs the secret {name!r} ({var}) but host data "
                                 "has no value for it",
                                 f"set secrets = {{'{name}': ...}} in group data, read from a "
                                 "file or the environment, never committed")
        values[var] = api_key(secrets[name], f"pyinfra data of {host_name}", name)
    return values


def allowed_clients() -> list[str]:
    """``sglang_allowed_clients``: the networks a server or router answers (empty: any)."""
    return list(hostconfig.of(host).sglang_allowed_clients)


def peers(launch: Launch) -> list[str]:
    """The addresses of the launch's multi-node group's members (none on one host)."""
    return groups.peer_networks(host) if spans_hosts(launch) else []


def firewall(profile: Profile, launch: Launch) -> str | None:
    """The launch's nftables table (``exposure``): its inter-process ports to its group's
    members, its gRPC port to the routers; None when it opens no such port."""
    grpc = connection.grpc(profile)
    return exposure.rules(launch, peers(launch), groups.router_networks(host) if grpc else [],
                          hostconfig.of(host).address, str(launch.args.get("host") or ""), grpc)


OWN_UNIT = re.compile(paths.SERVER_UNIT_PATTERN)


def foreign_listeners(launch: Launch) -> list[Listener]:
    """Processes listening on the launch's port that are not its unit (a server started by
    hand with nohup, setsid or tmux, another unit)."""
    listeners = host.get_fact(PortListeners, port=launch.port) or []
    # Another of the product's own server units (e.g. sglang.service before a change to
    # parallel.instances) is retired or restarted by this deploy: not a stale server.
    return [p for p in listeners if not (p.unit and OWN_UNIT.fullmatch(p.unit))]


def require_free_ports(launches: list[Launch]) -> None:
    """Preflight: stop before any change when something else holds a server's port, unless host
    data ``replace_stale_servers`` lets the deploy stop it."""
    if hostconfig.of(host).replace_stale_servers:
        return
    problems = [Problem(f"host {host.name}", f"port {launch.port}",
                        f"held by {p.describe()}, not by {launch.unit}",
                        "stop it, or run with --data replace_stale_servers=true to let the "
                        "deploy stop it (SIGTERM, its requests drained within "
                        "drain_budget_seconds, then SIGKILL)")
                for launch in launches for p in foreign_listeners(launch)]
    if problems:
        raise InputError(problems)


@operation(is_idempotent=True)
def stale_servers_stopped(launch: Launch, budget: int) -> Ops:
    """Stop whatever else listens on the launch's port: SIGTERM, up to ``budget`` seconds for
    its requests to drain, then SIGKILL.

    + launch: the server launch whose port must be free for its own unit
    + budget: seconds a stale server may take to drain before SIGKILL

        stale_servers_stopped(name="Stale servers on :30000", launch=launch, budget=600)
    """
    stale = foreign_listeners(launch)
    if not stale:
        host.noop(f"nothing but {launch.unit} listens on port {launch.port}")
        return
    for p in stale:
        logger.warning(f"{host.print_prefix}stopping {p.describe()}: it holds port "
                       f"{launch.port} of {launch.unit}")
        # in a roll, the routers may be sending it requests: its server leaves them first
        yield from disrupt(f"kill -TERM {p.pid} 2>/dev/null; for _ in $(seq {budget}); do "
                           f"kill -0 {p.pid} 2>/dev/null || exit 0; sleep 1; done; "
                           f"kill -KILL {p.pid}", units=[launch.unit])


def drain_budget() -> int:  # seconds a stopping server may take to finish its requests
    return hostconfig.of(host).drain_budget_seconds


def startup_budget() -> int:  # seconds a server may take to load and warm up
    return hostconfig.of(host).startup_budget_seconds


def _removal(unit: str) -> str:
    env = paths.env_file(unit)
    logger.info(f"{host.print_prefix}removing {unit} and its secret file {env}")
    return (f"systemctl disable --now {unit}; rm -f {paths.unit_path(unit)} {env} "
            f"{paths.gate_record(unit)} {exposure.rules_path(unit)} && systemctl daemon-reload && "
            f"systemctl reset-failed {unit} 2>/dev/null; true")


@operation(is_idempotent=True)
def firewall_file(unit: str, rules: str | None) -> Ops:
    """The unit's nftables table, with ``nft`` to load it; none (and no file) when the unit
    opens no port beyond its clients' one.

    + unit: the server unit
    + rules: the table (``exposure.rules``), or None

        firewall_file(name="Ports of sglang.service", unit="sglang.service", rules=text)
    """
    dest = exposure.rules_path(unit)
    if rules is None:
        if host.get_fact(File, path=dest):  # its new definition no longer deletes the table
            name = exposure.table(unit, hostconfig.of(host).address)
            nft = exposure.NFT
            yield f"if [ -x {nft} ]; then {nft} delete table inet {name}; fi; true"
        yield from files.file._inner(path=dest, present=False)
        return
    yield from apt.packages._inner(packages=[exposure.PACKAGE])
    yield from files.put._inner(src=io.StringIO(rules), dest=dest, user="root", group="root",
                                mode="600")


def installed_units() -> list[str]:
    """The sglang server units on the host (``sglang.service``, ``sglang-N.service``)."""
    found = host.get_fact(FindFiles, path=paths.UNITS, maxdepth=1, fname="sglang*.service")
    names = (path.rsplit("/", 1)[-1] for path in found or [])
    return sorted(name for name in names if OWN_UNIT.fullmatch(name))


@operation(is_idempotent=True)
def retire_other_units(keep: list[str]) -> Ops:
    """Stop and remove sglang units this profile no longer runs, with their environment files.

    + keep: the server units to leave alone; ``[]`` removes every one of them (teardown)

        retire_other_units(name="Retire units", keep=["sglang.service"])
    """
    gone = retired(installed_units(), keep)
    if not gone:
        host.noop("no other sglang units")
        return
    # in a roll: stopping an instance takes its capacity away (a generator: each removal is
    # said as it comes, after the leave)
    yield from disrupt((_removal(unit) for unit in gone), units=gone)


@operation(is_idempotent=True)
def unit_absent(unit: str) -> Ops:
    """Stop, disable and remove one unit and its environment file.

    + unit: the unit's name

        unit_absent(name="Remove the router", unit="sglang-router.service")
    """
    if any(host.get_fact(File, path=p) for p in (paths.unit_path(unit), paths.env_file(unit))):
        yield _removal(unit)
    else:
        host.noop(f"{unit} is not installed")


def restart_policy(systemd_version: int | None) -> dict[str, Any]:
    """The unit's crash-loop values for a host's systemd: growing delays where it has
    ``RestartSteps`` (10, 20, 40, 80, 160 s), a fixed 30 s elsewhere; then the start limit.

        >>> restart_policy(255)["restart_steps"], restart_policy(252)["restart_sec"]
        (4, 30)
    """
    burst = CRASH_RESTARTS + 1  # the start that began the loop, then its restarts
    if systemd_version is not None and systemd_version >= RESTART_STEPS_SINCE:
        return {"restart_sec": 10, "restart_steps": CRASH_RESTARTS - 1,
                "restart_max_delay": 160, "start_limit_burst": burst}
    return {"restart_sec": 30, "restart_steps": 0, "restart_max_delay": 30,
            "start_limit_burst": burst}


@operation(is_idempotent=True)
def unit_started(unit: str, restart: bool = False, routed: bool = False,
                 waves: Waves | None = None) -> Ops:
    """Enabled and running; with ``restart``, (re)started whatever its state. Every start clears
    the failed state and start limit first; a unit found failed or crash-looping is said so.

    + unit: the unit's name
    + restart: (re)start it even when it runs (``unit_running``: what it runs changed)
    + routed: a server behind the routers: in a roll, the host (or, with --batch-instances,
      this server) leaves them before the (re)start
    + waves: the host's restart waves, told of the start (``wave_ready`` waits for them)

        unit_started(name="Start sglang.service", unit="sglang.service")
    """
    condition = host.get_fact(UnitCondition, unit=unit)
    down = found_down(unit, condition)
    if down:
        logger.warning(f"{host.print_prefix}{down}")
    if restart or condition.get("ActiveState") != "active":
        # a server behind the routers leaves them first; the router's own unit and the DCGM
        # exporter serve no requests of the fleet
        command = start_command(unit)
        yield from (disrupt(command, units=[unit]) if routed else [command])
        if waves is not None:
            yield FunctionCommand(waves.start, (unit,), {})
    if condition.get("UnitFileState") != "enabled":
        yield f"systemctl enable {unit}"


def unit_running(name: str, unit: str, changes: list[OperationMeta], routed: bool = False,
                 waves: Waves | None = None, _if: Callable[[], bool] | None = None) -> None:
    """Enabled and running, restarted when one of ``changes`` (unit file, environment, release,
    ...) changed: one start for a fresh host, one restart for a change, none when nothing
    changed. Two operations, only one of which runs (``unit_started``).

        unit_running(name="Start sglang.service", unit="sglang.service", changes=[unit_op])
    """
    changed, going = any_changed(*changes), [_if] if _if else []
    unit_started(name=f"Restart {unit} (what it runs changed)", unit=unit, restart=True,
                 routed=routed, waves=waves, _if=[*going, changed])
    unit_started(name=name, unit=unit, routed=routed, waves=waves,
                 _if=[*going, lambda: not changed()])


@operation(is_idempotent=True)
def wave_ready(profile: Profile, launches: list[Launch], waves: Waves, release: Release,
               final: bool = False) -> Ops:
    """Once a wave of the host's servers has started: wait until each is ready (the gate's
    health wait, failing fast when its unit fails; all at once) before the next wave; with
    ``--batch-instances``, put it back into the routers, seen healthy. A wave not ready stops
    the waves: later servers keep what they run; the gate puts the last good release back.

    + waves: the host's restarts so far (``unit_running`` adds to it)
    + release: the release the restarted servers run (``current`` names it only after)
    + final: wait for the wave still open (the last one)

        wave_ready(name="The first server ready", profile=profile, launches=launches,
                   waves=waves, release=release)
    """
    due = waves.due(final) if waves.going() else []
    if not due:  # also in the preview: the waves are told of each start as it runs
        return
    if spans_hosts(launches[0]) and groups.rank_of(host):  # rank >= 1: a dummy /health
        waves.ready(due)  # says nothing; the gate reads its journal
        return
    by_unit = {launch.unit: launch for launch in launches}
    found = check_all(profile, [by_unit[unit] for unit in due], startup_budget(),
                      lambda _: ["--health-only"],  # the wave's servers waited for at once
                      release.python_bin)
    for unit, (ok, lines) in zip(due, found, strict=True):
        if not ok:
            waves.error = error_of(lines)
            logger.warning(f"{host.print_prefix}{unit} is not ready: the servers after it "
                           "keep what they run; the gate puts its last good release back")
            host.noop(f"{unit} is not ready: {waves.error}")
            return
    waves.ready(due)
    back = list(rejoin(fleet.routed_urls(host, profile, [by_unit[unit] for unit in due])))
    if not back:
        host.noop(f"{', '.join(due)} ready")
    yield from back


def unit_file(profile: Profile, launch: Launch, release: Release) -> dict[str, Any]:
    """The unit file of one launch as ``files.template`` arguments: the service stage writes
    it, and the gate's sized restart writes it again for a computed mamba cache size.

        files.template(name="Unit sglang.service", **unit_file(profile, launch, release))
    """
    budget = startup_budget()
    return dict(
        src=TEMPLATE, dest=paths.unit_path(launch.unit), mode="644",
        profile_path=unit_text(profile.path), version=launch.version,
        release_id=release.id, env_file=paths.env_file(launch.unit),
        served_name=unit_text(profile.model.served_name or profile.model.source),
        paths=paths.template_values(), allowed_clients=allowed_clients(),
        **group_unit(launch, allowed_clients()),  # a multi-node member: peers, InfiniBand
        firewall=exposure.unit_lines(launch.unit, hostconfig.of(host).address)
        if exposure.guarded(launch, connection.grpc(profile)) else [],
        exec_start=exec_start(launch, release), timeout_start=budget,
        timeout_stop=drain_budget(), start_limit_interval=budget * 4,
        **restart_policy(host.get_fact(SystemdVersion)))


def _unit(profile: Profile, launch: Launch, release: Release, launcher: OperationMeta,
          restart_if: list[OperationMeta], waves: Waves) -> None:
    unit_name = launch.unit
    cfg = hostconfig.of(host)
    secrets = secret_values(launch, host.name, cfg.secrets)
    try:
        env_text = environment(launch, secrets,
                               {**cfg.network_env, **exposure.zmq_peers(launch, peers(launch))})
        values = unit_file(profile, launch, release)
        rules = firewall(profile, launch)
    except UnsafeValue as err:
        raise InputError.one(profile.path, "env or extra_args", str(err),
                             "remove control characters from the value") from None
    # A failed wave leaves the units after it as they are: files, release and process.
    env = secret_file(name=f"Environment and secrets of {unit_name} (root, 0600)",
                      dest=paths.env_file(unit_name), content=env_text, _if=waves.going)
    ports = firewall_file(name=f"Who reaches {unit_name}'s own ports (nftables)",
                          unit=unit_name, rules=rules, _if=waves.going)
    unit = files.template(name=f"Unit {unit_name}", _if=waves.going, **values)
    systemd.daemon_reload(name="Reload systemd", _if=[waves.going, unit.did_change])
    if cfg.replace_stale_servers:
        stale_servers_stopped(name=f"Nothing else on port {launch.port}", launch=launch,
                              budget=drain_budget(), _if=waves.going)
    changes = [unit, env, ports, launcher, *restart_if]
    if spans_hosts(launch):  # one rank of a group: the group restarts whole, rank 0 first
        restart_group(unit_name, changes, waves=waves, _if=waves.going)
        return
    unit_running(name=f"Enable and start {unit_name}", unit=unit_name, changes=changes,
                 routed=True, waves=waves, _if=waves.going)


@deploy("SGLang service")
def install_service(profile: Profile, launches: list[Launch], release: Release,
                    restart_if: list[OperationMeta]) -> None:
    """One unit per server instance (``parallel.instances``, each on its own GPU set), restarted
    in waves: the first alone, ready before the rest (``--batch-instances`` at a time in a
    roll); a group's member restarts with its group (``group_restart``)."""
    secrets_directory()
    [launcher] = upload(SHARED, LAUNCHER)  # keys in-process, never on the command line
    turn(name="In a roll, this host's turn (the batch before it back in the routers)")
    receive_kernels(launches=launches, release=release)  # in a roll, before any restart
    retire_other_units(name="Retire units of instances no longer wanted",
                       keep=[launch.unit for launch in launches])
    waves = Waves(per_wave=roll_directory.batch_instances())
    for launch in launches:
        _unit(profile, launch, release, launcher, restart_if, waves)
        wave_ready(name=f"Restart wave ready (after {launch.unit}, when its wave is whole)",
                   profile=profile, launches=launches, waves=waves, release=release)
    wave_ready(name="The last restart wave ready", profile=profile, launches=launches,
               waves=waves, release=release, final=True)
    switch_release(release)  # the units name the release itself: the link follows them


@deploy("Remove the SGLang service")
def remove_service() -> None:
    """Every server unit, stopped, and its environment file."""
    retire_other_units(name="Stop and remove the server units and environment files", keep=[])
