"""``sglang-fleet status INVENTORY``: one row per server instance and per router, read-only.

Over SSH (pyinfra, every host at once, ``_sudo`` from host data as a deploy would): each unit's
state and since when, the release and flags it runs, the GPUs' memory and health. Over HTTP from
this machine (as the router reaches the servers): ``/health``, ``/metrics`` (running and queued
requests, output tokens/s, accept length, the served model) and each router's ``/workers``
(with its admin key). A host that does not answer is a row saying why.

    rows = collect("inventories/b200.py")
    print(table(rows))
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx
from pyinfra.api.host import Host

from sglang_fleet import fleet, hostdata
from sglang_fleet.errors import InputError
from sglang_fleet.facts.gpuhealth import Finding, GpuHealth, Health
from sglang_fleet.facts.units import LastCrash, UnitState, UnitStates
from sglang_fleet.gpucheck import ignored, merged
from sglang_fleet.profile import Profile
from sglang_fleet.render import Launch, render_all
from sglang_fleet.routerctl import Router, RouterError

GAUGES = {"sglang:num_running_reqs": "running", "sglang:num_queue_reqs": "queued",
          "sglang:gen_throughput": "tokens_per_s", "sglang:spec_accept_length": "accept_length"}
HTTP_TIMEOUT = 5.0


@dataclass
class Row:
    """One server instance (``kind`` server) or router (``kind`` router)."""

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


def _http(row: Row) -> None:
    """Health and metrics of one server, from this machine."""
    try:
        health = httpx.get(f"{row.url}/health", timeout=HTTP_TIMEOUT)
        row.health = "ok" if health.status_code == 200 else f"HTTP {health.status_code}"
    except (httpx.HTTPError, httpx.InvalidURL) as exc:
        row.health = f"unreachable ({type(exc).__name__})"
        return
    try:
        metrics = httpx.get(f"{row.url}/metrics", timeout=HTTP_TIMEOUT)
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
    profile = hostdata.profile_for(host)
    launches = render_all(profile)
    rows = []
    for launch, url in zip(launches, fleet.urls(host, profile, launches), strict=True):
        rows.append(Row("server", host.name, url, unit=launch.unit,
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
    """Units and GPUs of one host over SSH; on failure every row says why."""
    try:
        host.connect(show_errors=False, raise_exceptions=True)
        units = host.get_fact(UnitStates, units=[r.unit for r in rows])
        health = host.get_fact(GpuHealth)
    except Exception as exc:  # whatever the SSH layer raises: the row says it, the rest go on
        reason = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        for row in rows:
            row.state, row.error = "no answer", f"ssh: {reason}"
        return
    for row in rows:
        _fill_unit(row, units.get(row.unit))
        if row.restarts or row.state.startswith("failed"):
            row.last_crash = _last_crash(host, row.unit)
    _fill_gpus(rows, health, ignored(host.data, host.name))


def _last_crash(host: Host, unit: str) -> str:
    try:
        return host.get_fact(LastCrash, unit=unit) or "cause not in the journal"
    except Exception as exc:  # as read_host: the row says it, the rest go on
        return f"journal not read: {str(exc).splitlines()[0][:160] if str(exc) else exc}"


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
        for server in servers:
            worker = workers.get(server.url)
            mark = "absent" if worker is None else \
                "healthy" if worker.get("is_healthy") else "unhealthy"
            server.router = mark if not server.router else f"{server.router},{mark}"
        rows.append(row)
    return rows


def collect(inventory_path: str) -> list[Row]:
    """Every row of the fleet: hosts read in parallel over SSH, servers over HTTP."""
    from sglang_fleet import roll  # loading an inventory patches the process with gevent

    logging.getLogger("pyinfra").setLevel(logging.CRITICAL)  # a table, not pyinfra's log
    inventory = roll.load(inventory_path, {})
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
    return servers + router_rows(inventory, servers)


def _num(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


COLUMNS = ("host", "unit", "state", "restarts", "since", "release", "model", "algo", "health",
           "run", "queue", "tok/s", "accept", "GPU used/free GiB", "router", "notes")


def cells(row: Row) -> list[str]:
    mem = "-" if row.gpu_used_mib is None else \
        f"{row.gpu_used_mib / 1024:.0f}/{(row.gpu_free_mib or 0) / 1024:.0f}"
    if row.kind == "router":
        return [row.host, "router", "", "", "", "", "", "", row.health, "", "", "", "", "",
                f"workers {row.router or '-'}", row.error]
    crash = [f"last crash: {row.last_crash}"] if row.last_crash else []
    notes = "; ".join([*crash, *row.gpu_health, *([row.error] if row.error else [])])
    return [row.host, row.unit, row.state, _num(row.restarts), " ".join(row.since.split()[1:3]),
            row.release, row.model, row.algorithm, row.health, _num(row.running), _num(row.queued),
            _num(row.tokens_per_s), _num(row.accept_length, 2), mem, row.router or "-", notes]


def table(rows: list[Row]) -> str:
    """The rows as aligned text columns (empty cells as ``-``)."""
    body = [[c or "-" for c in cells(r)] for r in rows]
    widths = [max(len(x) for x in col) for col in zip(COLUMNS, *body, strict=True)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip()
                     for line in [list(COLUMNS), *body])


def as_json(rows: list[Row]) -> list[dict[str, Any]]:
    return [asdict(r) for r in rows]
