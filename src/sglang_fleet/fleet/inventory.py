"""Who serves and who routes, read from the inventory: the serving hosts (those with a
``sglang_profile``), their worker URLs, and the routers (the group ``routers``). A multi-node
group's server is one worker: a rank >= 1 answers /health but no API path.

    for host in serving_hosts(inventory):
        print(host.name, worker_urls(host))
    for router in routers(inventory):
        print(router.url)
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyinfra.api.config import Config
from pyinfra.api.host import Host
from pyinfra.api.inventory import Inventory
from pyinfra.api.state import State
from pyinfra.context import ctx_state

from sglang_fleet import hostconfig
from sglang_fleet.config import connection, validators
from sglang_fleet.config.profile import Profile
from sglang_fleet.config.render import Launch, render_all
from sglang_fleet.errors import InputError
from sglang_fleet.fleet.router_api import Router
from sglang_fleet.hostconfig import HostConfig, groups, overrides
from sglang_fleet.ops.secretfile import api_key

ROUTERS_GROUP = hostconfig.ROUTERS_GROUP  # the hosts that run the router
ROUTER_PACKAGES = hostconfig.ROUTER_PACKAGES  # each gateway's pinned release
ANY_ADDRESS = ("0.0.0.0", "::", "")


def address(host: Host) -> str:
    """How other machines reach the host: its SSH address unless data says otherwise."""
    return hostconfig.of(host).address


def is_serving(host: Host) -> bool:
    """Whether the host runs SGLang servers (router-only hosts set no profile)."""
    return hostconfig.is_serving(host)


def serving_hosts(inventory: Iterable[Host]) -> list[Host]:
    """Hosts that run SGLang servers, in inventory order."""
    return [host for host in inventory if is_serving(host)]


def urls(host: Host, profile: Profile, launches: list[Launch]) -> list[str]:
    """The URL of each of ``launches`` on ``host``, as a router reaches it (``grpc://`` for a
    server in gRPC mode, as smg takes it)."""
    bind = profile.server.host
    where = address(host) if bind in ANY_ADDRESS else bind
    scheme = "grpc" if connection.grpc(profile) else "http"
    return [f"{scheme}://{where}:{launch.port}" for launch in launches]


def routed_unit_urls(host: Host, profile: Profile, launches: list[Launch]) -> dict[str, str]:
    """The routers' URL of each of ``launches`` by unit: none on a rank >= 1 of a group."""
    if not groups.is_worker(host):
        return {}
    return dict(zip((launch.unit for launch in launches), urls(host, profile, launches),
                    strict=True))


def routed_urls(host: Host, profile: Profile, launches: list[Launch]) -> list[str]:
    """The URLs of ``launches`` the routers take: none on a rank >= 1 of a group."""
    return list(routed_unit_urls(host, profile, launches).values())


def unit_urls(host: Host) -> dict[str, str]:
    """The routers' URL of each server unit on ``host``, from the profile it serves (none on a
    rank >= 1 of a group)."""
    profile = hostconfig.profile_for(host)
    return routed_unit_urls(host, profile, render_all(profile))


def worker_urls(host: Host) -> list[str]:
    """The URL of each server instance on ``host`` the routers take (none on a rank >= 1)."""
    return list(unit_urls(host).values())


def _router_keys(cfg: HostConfig) -> tuple[str | None, str | None]:
    """The client key and the /workers admin key, from the secrets the data names; both are
    required (fail closed) unless ``router_allow_no_key`` is set."""
    keys: list[str | None] = []
    for key, name in (("router_api_key_secret", cfg.router_api_key_secret),
                      ("router_admin_api_key_secret", cfg.router_admin_api_key_secret)):
        value = cfg.secrets.get(name)
        if not value and not cfg.router_allow_no_key:
            raise InputError.one(cfg.source, f"secrets.{name}",
                                 f"the router needs the secret {name!r} ({key}) and host data "
                                 "has no value for it: without it anyone who reaches the router "
                                 "could use it" + (" or change its workers"
                                                   if "admin" in key else ""),
                                 f"set secrets = {{'{name}': ...}} (read from a root-only file), "
                                 "or router_allow_no_key = True to run an open router")
        keys.append(api_key(value, cfg.source, name) if value else None)
    if keys[0] and keys[0] == keys[1]:
        raise InputError.one(cfg.source, "router_admin_api_key_secret",
                             "the router's admin key is the client key: every client could "
                             "register a worker and receive other users' prompts",
                             "give the admin key a secret of its own")
    return keys[0], keys[1]


@dataclass(frozen=True)
class RouterConfig:
    """A router host's data, validated (``router_*`` keys, all optional)."""

    package: str  # a key of ROUTER_PACKAGES
    version: str
    index_url: str | None  # where pip finds the package (PyPI by default) ...
    find_links: str | None  # ... and a wheelhouse besides, as for the engine
    bind: str
    port: int
    metrics_port: int  # Prometheus' /metrics
    url: str
    policy: str
    health_interval: int
    health_failures: int
    health_successes: int
    breaker_failures: int  # consecutive failures that open a worker's circuit breaker
    breaker_timeout: int  # seconds before an open breaker lets a request try the worker again
    api_key: str | None  # what clients send (``--api-key``)
    admin_key: str | None  # what /workers needs (``--control-plane-api-keys``, role admin)

    def api(self) -> Router:
        """The router's API, opened with the admin key; workers are given the client key."""
        return Router(self.url, self.admin_key, worker_api_key=self.api_key or "")

    @classmethod
    def from_host(cls, host: Host) -> RouterConfig:
        """The router ``host`` runs, from its data (``hostconfig``: ``router_*`` keys).

            RouterConfig.from_host(host).url     # 'http://10.0.0.9:30080'
        """
        cfg = hostconfig.of(host)
        key, admin_key = _router_keys(cfg)
        where = cfg.address if cfg.router_host in ANY_ADDRESS else cfg.router_host
        return cls(package=cfg.router_package,
                   version=cfg.router_version or ROUTER_PACKAGES[cfg.router_package],
                   index_url=cfg.router_index_url, find_links=cfg.router_find_links,
                   bind=cfg.router_host, port=cfg.router_port,
                   metrics_port=cfg.router_metrics_port,
                   url=cfg.router_url or f"http://{where}:{cfg.router_port}",
                   policy=cfg.router_policy,
                   health_interval=cfg.router_health_check_interval_secs,
                   health_failures=cfg.router_health_failure_threshold,
                   health_successes=cfg.router_health_success_threshold,
                   breaker_failures=cfg.router_breaker_failures,
                   breaker_timeout=cfg.router_breaker_timeout_secs,
                   api_key=key, admin_key=admin_key)


def routers(inventory: Inventory) -> list[RouterConfig]:
    """Every router of the inventory (none if it has no ``routers`` group)."""
    group = inventory.get_group(ROUTERS_GROUP, None) or []
    return [RouterConfig.from_host(host) for host in group]


def all_worker_urls(inventory: Iterable[Host]) -> list[str]:
    return [url for host in serving_hosts(inventory) for url in worker_urls(host)]


def _require_reach(router: Host, worker: Host) -> None:
    """InputError when ``worker``'s ``sglang_allowed_clients`` keeps out ``router``'s address
    (checked where that address is an IP address; the units let loopback in always)."""
    allowed = hostconfig.of(worker).sglang_allowed_clients
    try:
        ip = ipaddress.ip_address(address(router))
    except ValueError:
        return
    if allowed and not ip.is_loopback and not any(
            ip in ipaddress.ip_network(net, strict=False) for net in allowed):
        raise InputError.one(hostconfig.of(worker).source, "sglang_allowed_clients",
                             f"the router on {router.name} ({ip}) is not in it: its requests "
                             f"to {worker.name}'s servers would be dropped",
                             f"add {ip} (or its network) to {worker.name}'s "
                             "sglang_allowed_clients")


def gateway_args(inventory: Iterable[Host], router: Host) -> list[str]:
    """The flags ``router`` needs for its workers: with servers in gRPC mode the gateway (smg
    only) tokenizes and parses their answers; none over HTTP.

        gateway_args(inventory, host)   # ['--reasoning-parser', 'qwen3', ...] or []
    """
    ways: dict[tuple[bool, tuple[str, ...]], list[str]] = {}
    for host in serving_hosts(inventory):
        if groups.is_worker(host):
            _require_reach(router, host)
            profile = hostconfig.profile_for(host)
            way = (connection.grpc(profile), tuple(connection.gateway_args(profile)))
            ways.setdefault(way, []).append(host.name)
    if not any(grpc for grpc, _ in ways):
        return []
    if len(ways) > 1:
        seen = "; ".join(f"{', '.join(names)}: {'grpc' if grpc else 'http'}"
                         f"{' ' + ' '.join(args) if args else ''}"
                         for (grpc, args), names in ways.items())
        raise InputError.one(f"the serving hosts' profiles ({seen})", connection.KEY,
                             "one router serves them, and it parses answers for servers in gRPC "
                             "mode with one set of parsers: they must all use gRPC with the "
                             "same parsers, or all HTTP",
                             f"give every serving host the same {connection.KEY} and parsers")
    cfg = hostconfig.of(router)
    if cfg.router_package != "smg":
        raise InputError.one(cfg.source, "router_package",
                             f"the serving hosts' servers are in gRPC mode ({connection.KEY}: "
                             f"grpc) and {cfg.router_package} reaches them only over HTTP here",
                             f"set router_package = 'smg', or {connection.KEY}: http")
    [(_, args)] = ways
    return list(args)


_DATA_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*")


def parse_data(pairs: Sequence[str]) -> dict[str, Any]:
    """``key=value`` pairs as pyinfra's ``--data`` reads them."""
    split = [pair.partition("=") for pair in pairs]
    for pair, (key, sep, value) in zip(pairs, split, strict=True):
        shown = pair if len(pair) <= 80 else pair[:77] + "..."
        if not sep or not key:
            raise InputError.one("--data", shown, "not key=value",
                                 "e.g. --data sglang.memory.max_running_requests=48")
        if not _DATA_KEY.fullmatch(key):
            raise InputError.one("--data", shown, f"{key!r} is not a data key (identifiers "
                                 "joined by dots)", "e.g. sglang.memory.page_size")
        wrong = validators.control_char(value) or (
            f"is {len(value)} characters long" if len(value) > validators.MAX_TEXT else None)
        if wrong:
            raise InputError.one("--data", key, f"the value {wrong}", "give a one-line value")
    from pyinfra_cli.util import parse_cli_arg  # see load()

    return {key: parse_cli_arg(value) for key, _, value in split}


def load(inventory: str, data: dict[str, Any]) -> Inventory:
    if not Path(inventory).is_file():
        raise InputError.one(inventory, "", "no such inventory file",
                             "give a pyinfra inventory, e.g. inventories/b200.py")
    # Importing pyinfra_cli patches the whole process with gevent: only where it is needed.
    from pyinfra_cli.inventory import make_inventory

    # Loading an inventory needs a state (pyinfra's API is untyped here).
    ctx_state.set(State(Inventory(([], {})), Config()))  # type: ignore[no-untyped-call]
    try:
        loaded: Inventory = make_inventory(inventory, override_data=data)
    except Exception as exc:  # the inventory is the operator's code: any error in it is theirs
        raise _inventory_error(inventory, exc) from None
    overrides.read_from(loaded, inventory)  # an error about an override names its file
    return loaded


def _inventory_error(inventory: str, exc: Exception) -> InputError:
    """What went wrong loading an inventory (pyinfra wraps errors in its files), as input."""
    source = str(getattr(exc, "filename", None) or inventory)
    inner = getattr(exc, "exception", None)  # pyinfra_cli's Unexpected*Error wrap the cause
    exc = inner if isinstance(inner, Exception) else exc
    if isinstance(exc, InputError):
        return exc
    if isinstance(exc, SyntaxError):
        return InputError.one(exc.filename or source, f"line {exc.lineno}",
                              f"not valid Python: {exc.msg}",
                              "fix the syntax there (python3 -m py_compile FILE)")
    try:
        detail = str(exc).splitlines()[0][:200] if str(exc) else ""
    except Exception:  # pyinfra's own errors can fail to print
        detail = ""
    return InputError.one(source, "", "pyinfra cannot load the inventory: "
                          f"{type(exc).__name__}{': ' + detail if detail else ''}",
                          "fix the inventory or its group data (pyinfra INVENTORY "
                          "debug-inventory shows what pyinfra reads)")
