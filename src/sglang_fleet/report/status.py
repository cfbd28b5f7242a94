"""``sglang-fleet status INVENTORY``: one row per server instance and per router, read-only.

Over SSH (pyinfra, every host at once, ``_sudo`` from host data as a deploy would): each unit's
state and since when, the release and flags it runs, the GPUs' memory and health. Over HTTP from
this machine (as the router reaches the servers): ``/health``, ``/metrics`` (running and queued
requests, output tokens/s, accept length, the served model) and each router's ``/workers``
(with its admin key). A host that does not answer over SSH is ``unreachable``, its rows
saying the connection's error.

The fleet's capacity and job time come from what each server's last passed gate measured and
kept on its host (``paths.gate_record``, read over SSH beside the units): its effective max
running requests (from its startup log) and its output tok/s under the gate's soak. Not from
``/metrics``' ``gen_throughput``: that is what a server does now (0 when idle), not what it can
do. A record of an earlier start of the unit (its InvocationID differs), a server that is
down and a unit without a record are named, never counted.

    fleet = collect("inventories/b200.py")
    print(status_view.table(fleet.rows)); print("\n".join(fleet.lines()))
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx
from pyinfra.api.host import Host

from sglang_fleet import hostconfig
from sglang_fleet.config import connection
from sglang_fleet.config.profile import Profile
from sglang_fleet.config.render import Launch, render_all
from sglang_fleet.errors import InputError
from sglang_fleet.facts.gpuhealth import Finding, GpuHealth, Health
from sglang_fleet.facts.systemd import GateRecords, LastCrash, UnitState, UnitStates
from sglang_fleet.fleet import inventory as fleet
from sglang_fleet.fleet import reach
from sglang_fleet.fleet.router_api import Router, RouterError
from sglang_fleet.hostconfig import groups
from sglang_fleet.hostconfig.gpu_health import merged
from sglang_fleet.remote import eta
from sglang_fleet.remote.terminal import printable
from sglang_fleet.report.grpc_health import GrpcHealth

GAUGES = {"sglang:num_running_reqs": "running", "sglang:num_queue_reqs": "queued",
          "sglang:gen_throughput": "tokens_per_s", "sglang:spec_accept_length": "accept_length"}
HTTP_TIMEOUT = 5.0
UNREACHED = "UNAVAILABLE"  # the gRPC status of a call that found no server
UNREACHABLE = "unreachable"  # a server row's state when its host did not answer over SSH
SERVING = "active/running"


@dataclass
class Row:
    """One server instance (``kind`` server), rank >= 1 of a multi-node group (``kind``
    member: its server is rank 0's row, the routers' worker) or router (``kind`` router)."""

    kind: str
    host: str
    url: str
    unit: str = ""
    state: str = ""
    since: str = ""
    release: str = ""
    model: str = ""
    algorithm: str = ""
    health: str = ""
    running: int | None = None
    queued: int | None = None
    tokens_per_s: float | None = None
    accept_length: float | None = None
    gpus: str = ""  # the instance's GPUs, e.g. "0-3"
    gpu_used_mib: int | None = None
    gpu_free_mib: int | None = None
    gpu_health: list[str] = field(default_factory=list)
    router: str = ""  # servers: "healthy", "unhealthy", "absent"; routers: "healthy/total"
    error: str = ""
    restarts: int | None = None  # automatic restarts since the last deliberate start
    last_crash: str = ""  # the cause of the last end on its own, from the unit's journal
    # What its last passed gate measured (paths.gate_record), or why nothing counts:
    capacity: int | None = None  # effective max running requests, from its startup log
    measured_tokens_per_s: float | None = None  # output tok/s under the gate's soak
    per_request_tps: float | None = None  # one request's tok/s (the gate's smoke)
    measured_at: str = ""
    measured_release: str = ""
    not_measured: str = ""  # why its record does not count ("" when it does)
    group: str = ""  # a multi-node group's member: "group G rank R of N"
    # A gRPC-mode server's HealthCheck as its host asked it (not shown: ``health`` says it).
    grpc_health: tuple[bool, str] | None = field(default=None, repr=False)


def parse_metrics(text: str) -> dict[str, Any]:
    """The gauges status shows, summed over label sets (one per scheduler rank), and the
    ``model_name`` label.

        parse_metrics('sglang:num_running_reqs{model_name="m",tp_rank="0"} 3.0')
        -> {"running": 3, "model": "m"}
    """
    found: dict[str, Any] = {}
    for line in text.splitlines():
        if line.startswith("#") or " " not in line:
            continue
        name, _, rest = line.partition("{")
        name = name.split(" ", 1)[0]
        key = GAUGES.get(name)
        if key is None:
            continue
        try:
            value = float(line.rsplit(" ", 1)[1])
        except ValueError:
            continue
        if key == "accept_length":
            found[key] = max(found.get(key, 0.0), value)  # the same for every rank
        else:
            found[key] = found.get(key, 0.0) + value
        if 'model_name="' in rest:
            found.setdefault("model", rest.split('model_name="', 1)[1].split('"', 1)[0])
    for key in ("running", "queued"):
        if key in found:
            found[key] = int(found[key])
    return found


def _grpc_health(row: Row) -> bool:
    """A gRPC-mode server's ``HealthCheck`` (the servicer generates one token, as
    ``/health_generate`` does), as its host asked it (``read_host``): its port answers the
    routers and the host alone."""
    if row.grpc_health is None:
        row.health = "not read (its host did not ask it: see its state)"
        return False
    healthy, why = row.grpc_health
    reached = healthy or f"/HealthCheck: {UNREACHED}:" not in why
    row.health = "ok" if healthy else (f"gRPC: {why.rpartition('/HealthCheck: ')[2][:80]}"
                                       if reached else f"unreachable (gRPC {UNREACHED})")
    return reached


def _http(row: Row) -> None:
    """Health and metrics of one server, from this machine (over gRPC for one in gRPC mode,
    its metrics from its side port)."""
    if row.url.startswith("grpc://"):
        if not _grpc_health(row):
            return
    else:
        try:
            health = httpx.get(f"{row.url}/health", timeout=HTTP_TIMEOUT)
            row.health = "ok" if health.status_code == 200 else f"HTTP {health.status_code}"
        except (httpx.HTTPError, httpx.InvalidURL) as exc:
            row.health = f"unreachable ({type(exc).__name__})"
            return
    try:
        metrics = httpx.get(connection.metrics_url(row.url), timeout=HTTP_TIMEOUT)
    except (httpx.HTTPError, httpx.InvalidURL):
        return
    if metrics.status_code == 200:
        values = parse_metrics(metrics.text)
        row.model = values.pop("model", "") or row.model
        for key, value in values.items():
            setattr(row, key, value)


def _gpus(profile: Profile, launch: Launch) -> list[int]:
    """The GPUs an instance runs on: its CUDA_VISIBLE_DEVICES, or the first tp x dp."""
    visible = launch.env.get("CUDA_VISIBLE_DEVICES")
    if visible:
        return [int(g) for g in visible.split(",") if g.strip().isdigit()]
    return list(range(profile.parallel.gpus_per_instance))


def _span(gpus: list[int]) -> str:
    return f"{gpus[0]}-{gpus[-1]}" if len(gpus) > 1 else ",".join(map(str, gpus))


def server_rows(host: Host) -> list[Row]:
    """A row per instance of ``host``'s profile, before anything is read."""
    profile = hostconfig.profile_for(host)
    launches = render_all(profile)
    rows = []
    member = groups.describe(host)
    kind = "member" if member and member["rank"] else "server"  # a rank >= 1 is no worker
    where = f"group {member['group']} rank {member['rank']} of {member['size']}" + (
        f": serves through {member['rank0']}" if member["rank"] else "") if member else ""
    for launch, url in zip(launches, fleet.urls(host, profile, launches), strict=True):
        rows.append(Row(kind, host.name, url, unit=launch.unit, group=where,
                        model=profile.model.served_name or "",
                        algorithm=str(profile.speculative.algorithm or "-"),
                        gpus=_span(_gpus(profile, launch))))
    return rows


def _fill_unit(row: Row, unit: UnitState | None) -> None:
    if unit is None:
        row.state = "unknown"
        return
    row.state = unit.state
    if unit.active == "failed" and unit.result:
        row.state = f"failed ({unit.result})"  # e.g. a crash loop that spent its start limit
    row.restarts = unit.restarts
    row.since = unit.since
    row.release = unit.release or ""
    row.algorithm = unit.flag("--speculative-algorithm") or row.algorithm
    row.model = unit.flag("--served-model-name") or row.model


def _fill_gpus(rows: list[Row], health: Health | None, ignore: list[str]) -> None:
    if health is None:
        for row in rows:
            row.gpu_health = ["no nvidia-smi"]
        return
    if health.error:
        for row in rows:
            row.gpu_health = [f"nvidia-smi: {health.error}"]
        return
    by_index = {g.index: g for g in health.gpus}
    served: set[str] = set()
    for row in rows:
        first, _, last = row.gpus.partition("-")
        wanted = range(int(first), int(last or first) + 1) if first.isdigit() else range(0)
        mine = [by_index[i] for i in wanted if i in by_index]
        if mine and all(g.memory_used_mib is not None for g in mine):
            row.gpu_used_mib = sum(g.memory_used_mib or 0 for g in mine)
            row.gpu_free_mib = sum(g.memory_free_mib or 0 for g in mine)
        names = {str(i) for i in wanted}
        served |= names
        row.gpu_health = _notes([f for f in health.findings if f.gpu in names], ignore)
    if rows:  # GPUs no instance uses (or a device nvidia-smi lacks): on the host's first row
        rows[0].gpu_health += _notes([f for f in health.findings if f.gpu not in served],
                                     ignore)


def _notes(findings: list[Finding], ignore: list[str]) -> list[str]:
    """``FATAL xid-79 (GPU 0)``: each finding once, with the GPUs it concerns."""
    return [f"{'FATAL ' if f.fatal and f.id not in ignore else ''}{f.id} (GPU {','.join(gpus)})"
            for f, gpus in merged(findings)]


def read_host(host: Host, rows: list[Row]) -> None:
    """Units and GPUs of one host over SSH; on failure every row says why: ``unreachable``
    with the connection's error, or ``not read`` with what failed after it connected."""
    error = reach.connect_error(host)
    if error is not None:
        for row in rows:
            row.state, row.error = UNREACHABLE, f"unreachable: SSH: {error}"
        return
    try:
        units = host.get_fact(UnitStates, units=[r.unit for r in rows])
        health = host.get_fact(GpuHealth)
    except Exception as exc:  # whatever the SSH layer raises: the row says it, the rest go on
        for row in rows:
            row.state, row.error = "not read", f"read over SSH failed: {reach.first_line(exc)}"
        return
    for row in rows:
        _fill_unit(row, units.get(row.unit))
        if row.restarts or row.state.startswith("failed"):
            row.last_crash = _last_crash(host, row.unit)
        if row.url.startswith("grpc://"):
            row.grpc_health = _asked_on(host, row.url.removeprefix("grpc://").rstrip("/"))
    _fill_gpus(rows, health, list(hostconfig.of(host).gpu_health_ignore))
    try:
        records = host.get_fact(GateRecords, units=[r.unit for r in rows]) or {}
    except Exception as exc:  # as read_host: the row says it, the rest go on
        for row in rows:
            row.not_measured = f"gate record not read: {reach.first_line(exc, 160)}"
        return
    for row in rows:
        unit = units.get(row.unit)
        fill_measured(row, records.get(row.unit), unit.invocation if unit else "")


def fill_measured(row: Row, record: Any, invocation: str) -> None:
    """The row's figures from its unit's gate record, if it measured the start that runs."""
    server = eta.from_record(row.unit, record, invocation)
    row.not_measured = server.left_out or ""
    row.capacity, row.measured_tokens_per_s = server.running, server.tokens_per_s
    row.per_request_tps, row.measured_at = server.per_request_tps, server.measured_at or ""
    row.measured_release = server.release or ""


def server_of(row: Row) -> eta.Server:
    """A server row as the estimate counts it: down, not measured, or its gate's figures."""
    down = (f"not read ({row.error})" if row.error else
            f"down: /health {row.health or 'not read'}" if row.health != "ok" else
            f"not serving: {row.state}" if row.state != "active/running" else "")
    return eta.Server(f"{row.host} {row.unit}", running=row.capacity,
                      tokens_per_s=row.measured_tokens_per_s,
                      per_request_tps=row.per_request_tps,
                      release=row.measured_release or None, measured_at=row.measured_at or None,
                      left_out=down or row.not_measured or None)


def _asked_on(host: Host, target: str) -> tuple[bool, str] | None:
    try:
        found: tuple[bool, str] | None = host.get_fact(GrpcHealth, target=target)
    except Exception as exc:  # as read_host: the row says it
        return False, f"asked on its host: {reach.first_line(exc, 160)}"
    return found


def _last_crash(host: Host, unit: str) -> str:
    try:
        return host.get_fact(LastCrash, unit=unit) or "cause not in the journal"
    except Exception as exc:  # as read_host: the row says it, the rest go on
        return f"journal not read: {reach.first_line(exc, 160)}"


def router_rows(inventory: Any, servers: list[Row]) -> list[Row]:
    """A row per router: alive, workers healthy/total; marks each server's presence in it."""
    rows = []
    for host in inventory.get_group(fleet.ROUTERS_GROUP, None) or []:
        config = fleet.RouterConfig.from_host(host)
        row = Row("router", host.name, config.url)
        router = Router(config.url, config.admin_key, timeout=HTTP_TIMEOUT)
        try:
            workers = router.workers()
        except RouterError as exc:
            row.health, row.error = "unreachable" if not router.alive() else "error", str(exc)
            rows.append(row)
            continue
        healthy = sum(1 for w in workers.values() if w.get("is_healthy"))
        row.health = "ok"
        row.router = f"{healthy}/{len(workers)}"
        for server in (s for s in servers if s.kind == "server"):  # members are no workers
            worker = workers.get(server.url)
            mark = "absent" if worker is None else \
                "healthy" if worker.get("is_healthy") else "unhealthy"
            server.router = mark if not server.router else f"{server.router},{mark}"
        rows.append(row)
    return rows


@dataclass
class Fleet:
    """Every row, and the job the hosts' data names (``job_estimate``)."""

    rows: list[Row]
    job: tuple[int, int] | None = None
    job_note: str = ""  # why there is no job when the hosts' data disagree

    def estimate(self) -> eta.Estimate:
        return eta.estimate([server_of(r) for r in self.rows if r.kind == "server"],
                            self.job)

    def lines(self) -> list[str]:
        """The fleet's capacity, throughput and job time, each saying what it is from."""
        return [printable(line) for line in eta.lines(self.estimate(), "fleet")] + (
            [f"fleet: {self.job_note}"] if self.job_note else [])

    def problems(self) -> list[str]:
        """Why the fleet is not healthy (``problems``); empty when it is."""
        return problems(self.rows)

    def as_json(self) -> list[dict[str, Any]]:
        """The rows, then one object of kind ``fleet`` with the sums and the lines, whether
        the fleet is healthy, why not, and each host that did not answer over SSH."""
        est = self.estimate()
        found = self.problems()
        return [*as_json(self.rows), {
            "kind": "fleet", "running": est.running, "tokens_per_s": est.tokens_per_s,
            "bound_tokens_per_s": est.bound_tokens_per_s, "job": est.job,
            "seconds": est.seconds, "bound_seconds": est.bound_seconds,
            "capacity_servers": [s.name for s in est.capacity],
            "throughput_servers": [s.name for s in est.throughput],
            "not_counted": [{"server": n, "why": w} for n, w in est.not_counted],
            "lines": self.lines(), "healthy": not found, "problems": found,
            "unreachable": unreachable(self.rows)}]


def fleet_job(hosts: list[Host]) -> tuple[tuple[int, int] | None, str]:
    """The job of the serving hosts' ``job_estimate`` (checked by ``hostconfig``), and a note
    when they name different jobs (then there is no one job for the fleet).

        fleet_job(hosts)   # ((900000, 1000), "")
    """
    named = {h.name: v for h in hosts if (v := hostconfig.of(h).job_estimate)}
    if len(set(named.values())) > 1:
        return None, ("no job time: job_estimate differs between hosts (" + "; ".join(
            f"{name}: {value}" for name, value in named.items()) + ")")
    return (eta.parse_job(next(iter(named.values()))) if named else None), ""


def collect(inventory_path: str, data: dict[str, Any] | None = None,
            with_routers: bool = True) -> Fleet:
    """Every row of the fleet: hosts read in parallel over SSH, servers over HTTP (``data``
    as ``--data`` would give it; the routers' rows only ``with_routers``)."""
    pyinfra_log = logging.getLogger("pyinfra")
    level = pyinfra_log.level
    pyinfra_log.setLevel(logging.CRITICAL)  # a table, not pyinfra's log
    try:
        return _collect(fleet.load(inventory_path, data or {}), inventory_path, with_routers)
    finally:  # a roll reads the fleet at its end, then goes on logging
        pyinfra_log.setLevel(level)


def _collect(inventory: Any, inventory_path: str, with_routers: bool) -> Fleet:
    hosts = fleet.serving_hosts(inventory)
    if not hosts and not fleet.routers(inventory):
        raise InputError.one(inventory_path, "sglang_profile", "no serving hosts and no router",
                             "give hosts a serving profile in their group data")
    per_host = {host.name: server_rows(host) for host in hosts}  # bad data: before any SSH
    from pyinfra.api.config import Config
    from pyinfra.api.state import State

    State(inventory, Config())  # type: ignore[no-untyped-call]  # hosts need a state
    with ThreadPoolExecutor(max_workers=32) as pool:  # gevent's under pyinfra: one per host
        list(pool.map(lambda h: read_host(h, per_host[h.name]), hosts))
        servers = [row for rows in per_host.values() for row in rows]
        list(pool.map(_http, servers))
    job, note = fleet_job(hosts)
    routers = router_rows(inventory, servers) if with_routers else []
    return Fleet(servers + routers, job, note)


def as_json(rows: list[Row]) -> list[dict[str, Any]]:
    return [{k: v for k, v in asdict(r).items() if k != "grpc_health"} for r in rows]


def problems(rows: list[Row]) -> list[str]:
    """Why the fleet is not healthy: each host that did not answer over SSH (once, with the
    connection's error), each server not active, not answering ``/health`` with 200 or with a
    fatal GPU finding, each router not answering; empty when none."""
    found: list[str] = []
    for row in rows:
        if row.kind == "router":
            if row.health != "ok":
                found.append(f"router {row.host} ({row.url}): {row.health or 'not read'}"
                             + (f": {row.error}" if row.error else ""))
            continue
        said = row.error and f"{row.host}: {row.error}"
        if said and said not in found:  # a host's SSH error, once for all its servers
            found.append(said)
        where = f"{row.host} {row.unit}"
        if row.state not in (SERVING, UNREACHABLE) and not row.error:
            found.append(f"{where}: {row.state or 'state not read'}")
        if row.health != "ok":
            found.append(f"{where}: /health {row.health or 'not read'}")
        found += [f"{where}: GPU {note}" for note in row.gpu_health if note.startswith("FATAL ")]
    return found


def unreachable(rows: list[Row]) -> list[dict[str, Any]]:
    """Each host that did not answer over SSH and its error, once (``status --json``)."""
    hosts = {r.host: r.error for r in rows if r.kind != "router" and r.state == UNREACHABLE}
    return [{"host": host, "error": error} for host, error in hosts.items()]
