"""Who serves and who routes, read from the inventory: the serving hosts (those with a
``sglang_profile``) in inventory order, their worker URLs, and the routers in front of them
(the group ``routers``).

    for host in serving_hosts(inventory):
        print(host.name, worker_urls(host))
    for router in routers(inventory):
        print(router.url)
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from pyinfra.api.host import Host
from pyinfra.api.inventory import Inventory

from sglang_fleet import hostconfig as hostdata
from sglang_fleet.config.profile import Profile
from sglang_fleet.config.render import Launch, render_all
from sglang_fleet.errors import InputError
from sglang_fleet.ops.secretfile import SECRET_NAME, api_key
from sglang_fleet.rollout.router_api import Router

ROUTERS_GROUP = "routers"
# The gateway by package, with its pinned release: smg (the Shepherd Model Gateway, which
# SGLang's own releases depend on) by default; sglang-router 0.3.2, the last release under
# that name, when host data ``router_package`` asks for it.
ROUTER_PACKAGES = {"smg": "1.13.0", "sglang-router": "0.3.2"}
ROUTER_PACKAGE = "smg"
ROUTER_PORT = 30080
ROUTER_METRICS_PORT = 29000  # both packages' default --prometheus-port
ANY_ADDRESS = ("0.0.0.0", "::", "")


def address(host: Host) -> str:
    """How other machines reach the host: its SSH address unless data says otherwise."""
    return str(host.data.get("sglang_address") or host.data.get("ssh_hostname") or host.name)


def is_serving(host: Host) -> bool:
    """Whether the host runs SGLang servers (router-only hosts set no profile)."""
    return bool(host.data.get(hostdata.PROFILE_KEY))


def serving_hosts(inventory: Iterable[Host]) -> list[Host]:
    """Hosts that run SGLang servers, in inventory order."""
    return [host for host in inventory if is_serving(host)]


def urls(host: Host, profile: Profile, launches: list[Launch]) -> list[str]:
    """The URL of each of ``launches`` on ``host``, as a router reaches it."""
    bind = profile.server.host
    where = address(host) if bind in ANY_ADDRESS else bind
    return [f"http://{where}:{launch.port}" for launch in launches]


def unit_urls(host: Host) -> dict[str, str]:
    """The URL of each server unit on ``host``, from the profile it serves."""
    profile = hostdata.profile_for(host)
    launches = render_all(profile)
    return dict(zip((launch.unit for launch in launches), urls(host, profile, launches),
                    strict=True))


def worker_urls(host: Host) -> list[str]:
    """The URL of each server instance on ``host``, from the profile it serves."""
    return list(unit_urls(host).values())


def _int(data: Any, source: str, key: str, default: int) -> int:
    value = data.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise InputError.one(source, key, f"must be a positive integer, got {value!r}",
                             f"remove it (default {default}) or set a number")
    return value


def _router_keys(data: Any, source: str) -> tuple[str | None, str | None]:
    """The client key and the /workers admin key, from the secrets the data names; both are
    required (fail closed) unless ``router_allow_no_key`` is set."""
    available = data.get("secrets") or {}
    keys: list[str | None] = []
    for key, default in (("router_api_key_secret", "sglang-api-key"),
                         ("router_admin_api_key_secret", "sglang-router-admin-key")):
        name = data.get(key, default)
        if not isinstance(name, str) or not SECRET_NAME.fullmatch(name):
            # It may be the key itself, pasted where its name belongs: never shown.
            raise InputError.one(source, key, "the value is not the NAME of a secret (lower-case "
                                 "letters, digits, . _ -; not shown: it may be the key itself)",
                                 f"name the secret, e.g. {default}, and give the key in secrets")
        value = available.get(name)
        if not value and not data.get("router_allow_no_key"):
            raise InputError.one(source, f"secrets.{name}",
                                 f"the router needs the secret {name!r} ({key}) and host data "
                                 "has no value for it: without it anyone who reaches the router "
                                 "could use it" + (" or change its workers"
                                                   if "admin" in key else ""),
                                 f"set secrets = {{'{name}': ...}} (read from a root-only file), "
                                 "or router_allow_no_key = True to run an open router")
        keys.append(api_key(value, source, name) if value else None)
    if keys[0] and keys[0] == keys[1]:
        raise InputError.one(source, "router_admin_api_key_secret",
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
        data, source = host.data, f"pyinfra data of {host.name}"
        policy = str(data.get("router_policy", "cache_aware"))
        policies = ("cache_aware", "round_robin", "power_of_two", "random")
        if policy not in policies:
            raise InputError.one(source, "router_policy", f"unknown policy {policy!r}",
                                 f"one of {', '.join(policies)}")
        package = data.get("router_package", ROUTER_PACKAGE)
        if package not in ROUTER_PACKAGES:
            raise InputError.one(source, "router_package", f"unknown router {package!r}",
                                 f"one of {', '.join(ROUTER_PACKAGES)} (default {ROUTER_PACKAGE})")
        key, admin_key = _router_keys(data, source)
        bind = str(data.get("router_host", "0.0.0.0"))
        port = _int(data, source, "router_port", ROUTER_PORT)
        where = address(host) if bind in ANY_ADDRESS else bind
        return cls(package=package,
                   version=str(data.get("router_version", ROUTER_PACKAGES[package])),
                   index_url=data.get("router_index_url"),
                   find_links=data.get("router_find_links"),
                   bind=bind, port=port,
                   metrics_port=_int(data, source, "router_metrics_port", ROUTER_METRICS_PORT),
                   url=str(data.get("router_url", f"http://{where}:{port}")),
                   policy=policy,
                   health_interval=_int(data, source, "router_health_check_interval_secs", 5),
                   health_failures=_int(data, source, "router_health_failure_threshold", 3),
                   health_successes=_int(data, source, "router_health_success_threshold", 2),
                   breaker_failures=_int(data, source, "router_breaker_failures", 3),
                   breaker_timeout=_int(data, source, "router_breaker_timeout_secs", 10),
                   api_key=key, admin_key=admin_key)


def routers(inventory: Inventory) -> list[RouterConfig]:
    """Every router of the inventory (none if it has no ``routers`` group)."""
    group = inventory.get_group(ROUTERS_GROUP, None) or []
    return [RouterConfig.from_host(host) for host in group]


def all_worker_urls(inventory: Iterable[Host]) -> list[str]:
    return [url for host in serving_hosts(inventory) for url in worker_urls(host)]
