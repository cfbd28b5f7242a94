"""Every key the product reads from pyinfra's host and group data, declared once as a field of
``HostConfig`` (``config/keys.py``'s ``key()``).

    HostConfig.from_data({"gpu_count": 8}, "b200-01").drain_budget_seconds     # 600

To add a key: add a field here, read it as ``hostconfig.of(host).KEY``, and regenerate
docs/host-data.md's table (``python -m sglang_fleet.hostconfig --write docs/host-data.md``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from sglang_fleet.config.checks import (
    address,
    both,
    credential,
    finding_ids,
    flag,
    form,
    group_name,
    hca_list,
    http_url,
    interfaces,
    known,
    listed,
    listen_port,
    names,
    on_branch,
    open_flavour,
    profile_path,
    secret_for,
    secret_map,
    sha256,
    subset_of,
    truth,
    url,
    user_names,
    whole,
)
from sglang_fleet.config.keys import Declared, Found, Wrong, declared, key, wrongs
from sglang_fleet.errors import InputError, Problem
from sglang_fleet.hostconfig import overrides
from sglang_fleet.ops.unitfile import UnsafeValue, networks
from sglang_fleet.paths import KEYRING, NVIDIA_REPOS

ROUTERS_GROUP = "routers"
# The gateway by package, with its pinned release: smg (the Shepherd Model Gateway, which
# SGLang's own releases depend on) by default; sglang-router 0.3.2, the last release under
# that name, when host data ``router_package`` asks for it.
ROUTER_PACKAGES = {"smg": "1.13.0", "sglang-router": "0.3.2"}
ROUTER_PACKAGE = "smg"
ROUTER_PORT = 30080
ROUTER_METRICS_PORT = 29000  # both packages' default --prometheus-port
ROUTER_POLICIES = ("cache_aware", "round_robin", "power_of_two", "random")
# Minimum driver for each CUDA release the engine may need (NVIDIA's CUDA toolkit release notes).
DRIVER_FLOOR = {"12.8": "570.26", "12.9": "575.51.03", "13.0": "580.65.06"}
DRIVER_BRANCH = "580"
REBOOT_TIMEOUT = 900  # an HGX board's firmware takes minutes; host data may say otherwise
PURGEABLE = ("engine", "weights", "driver")

SECONDS = "must be a whole number of seconds from 1 to 86400"
POSITIVE = "must be a positive integer"
ONE_LINE = "one line: the value itself, read from a file"
YES_OR_NO = "write True or False (or yes/no, on/off, 1/0)"


@dataclass(frozen=True)
class Raw:
    """One host's data as pyinfra holds it (or a plain mapping), for checks that read another
    key (``allow_insecure_urls`` for URLs)."""

    data: Any  # pyinfra's HostData or a mapping: both have .get
    host: str
    groups: tuple[str, ...] = ()

    @property
    def source(self) -> str:
        return f"pyinfra data of {self.host}"

    def get(self, key: str) -> Any:
        return self.data.get(key)


def _in_group(raw: Raw, name: str) -> bool:
    return name in raw.groups


def _levels(raw: Raw, name: str) -> overrides.Levels:
    return overrides.levels(raw.data, raw.source)


def _text(value: Any) -> str | None:
    return str(value) if value else None


def networks_list(value: Any, data: Any) -> Found:
    """CIDR networks (or addresses) a server or router answers; none (a falsy value): any.
    Here, not in config/checks.py: it normalises them as the unit file will (ops/, a floor up)."""
    if not value:
        return None
    if isinstance(value, str) or not isinstance(value, list | tuple):
        return f"must be a list of CIDR networks, got {value!r}"
    try:
        networks([str(v) for v in value])
    except UnsafeValue as err:
        return Wrong(str(err), "list networks such as 10.0.0.0/8 or 192.0.2.7")
    return None


@dataclass(frozen=True)
class HostConfig:
    """One host's data, checked and typed; ``hostconfig.of(host)`` builds it once per host."""

    name: str  # the host's, not a key

    # --- serving: the profile, the GPUs, who reaches the servers, how long they may take ---
    sglang_profile: str | None = key(
        None, check=profile_path, parse=_text, fix="the path of a profile YAML file",
        shown="none: required on serving hosts", doc="the profile YAML this host serves "
        "(a path, or a shipped profile's name)")
    sglang_overrides: overrides.Overrides = key(  # noqa: RUF009 (key() makes a field)
        overrides.NONE, lookup=_levels, check=overrides.check, parse=overrides.merged,
        fix="write e.g. {'memory': {'max_running_requests': 64}}",
        doc="profile keys overridden for these hosts, e.g. `{\"memory\": "
        "{\"max_running_requests\": 64}}`, merged key by key across data levels (also "
        "`sglang.KEY = value`)")
    gpu_count: int | None = key(
        None, check=whole(1, 1024, POSITIVE), fix="the number of GPUs the host must show, e.g. 8",
        shown="any", doc="GPUs the host must show (8 on HGX): nvidia-smi must agree; what "
        "`parallel.instances: auto` divides before the host has a driver")
    sglang_address: str | None = key(
        None, check=address, fix="the address other machines reach this host at",
        shown="`ssh_hostname`", doc="the address routers and status reach this host's servers on")
    ssh_hostname: str | None = key(
        None, parse=str, shown="the host's name", doc="pyinfra's own: where it connects; the "
        "host's address when `sglang_address` is not set")
    sglang_allowed_clients: tuple[str, ...] = key(
        (), check=networks_list, parse=lambda v: tuple(networks([str(x) for x in v or ()])),
        fix="e.g. sglang_allowed_clients = ['10.0.0.0/8']", shown="`[]` (any)",
        doc="CIDR networks the servers, router and DCGM exporter answer, besides the host")
    sglang_trusted_local_users: tuple[str, ...] = key(
        (), check=user_names, parse=lambda v: tuple(str(x) for x in v or ()),
        fix="the host's login users you trust with the servers' own ports, e.g. "
        "sglang_trusted_local_users = ['alice']", shown="`[]`",
        doc="login users of the host who may reach what loopback cannot keep from them (DP "
        "attention's inter-process sockets, the gRPC port): each must be named, or such a "
        "server is refused on a host they log in to")
    sglang_group: str | None = key(
        None, check=group_name, parse=str, fix="a name of letters, digits, . _ -, e.g. "
        "sglang_group = 'tp16-a' on each host of the group", shown="none: a server on one host",
        doc="the multi-node group this host serves one rank of (`parallel.nnodes` hosts, one "
        "server): its hosts in inventory order are ranks 0, 1, ...; rank 0 alone is a router "
        "worker")
    nccl_socket_ifname: str | None = key(
        None, check=interfaces(negatable=True), parse=str,
        fix="interface names as NCCL takes them, e.g. 'eth0', 'ens1f0,ens1f1' or '^docker,lo'",
        doc="`NCCL_SOCKET_IFNAME` in the server's environment file: the interfaces NCCL's "
        "bootstrap and socket transport use")
    gloo_socket_ifname: str | None = key(
        None, check=interfaces(negatable=False), parse=str,
        fix="interface names, e.g. 'eth0' or 'ens1f0,ens1f1'",
        doc="`GLOO_SOCKET_IFNAME` in the server's environment file: the interface gloo (SGLang's "
        "CPU groups) binds; without it gloo takes what the host name resolves to")
    nccl_ib_hca: str | None = key(
        None, check=hca_list, parse=str,
        fix="HCA names with optional ports as NCCL takes them, e.g. 'mlx5_0,mlx5_1:1' or "
        "'^mlx5_4'", doc="`NCCL_IB_HCA` in the server's environment file: the InfiniBand / "
        "RoCE adapters NCCL uses")
    secrets: Mapping[str, str] = key(
        {}, check=secret_map, parse=dict, fix="secrets = {'sglang-api-key': ...}", secret=True,
        doc="secret values by name (`sglang-api-key`, `sglang-router-admin-key`, ...), 16 to "
        "512 printable characters")
    replace_stale_servers: bool = key(
        False, check=flag, parse=truth, fix=YES_OR_NO,
        doc="let the deploy stop a server it did not start that holds a server's port")
    startup_budget_seconds: int = key(
        1800, check=whole(1, 86400, SECONDS), fix="e.g. 1800",
        doc="how long a server may take to load and warm up (1..86400)")
    drain_budget_seconds: int = key(
        600, check=whole(1, 86400, SECONDS), fix="e.g. 1800",
        doc="how long a stopping server may take to finish its requests (1..86400)")
    gate_soak_requests: int | None = key(
        None, check=whole(0, None, "must be a whole number of requests, 0 or more"),
        fix="e.g. gate_soak_requests = 64, or 0 to skip the soak; leave it out for twice max "
        "running requests", shown="twice max running requests",
        doc="concurrent requests of the gate's soak; `0` skips it")
    job_estimate: str | None = key(
        None, check=form(r"[0-9]{1,12},[0-9]{1,9}", "COMPLETIONS,TOKENS, e.g. 900000,1000"),
        doc="`\"COMPLETIONS,TOKENS\"`: the job's time in the gate's capacity report and host "
        "line, `status` and the roll's end (the fleet's: one value across the serving hosts)")

    # --- compiled kernels a roll's first host shares with the hosts after it ---
    kernel_share_max_gib: int = key(
        4, check=whole(1, 256, "must be a whole number of GiB from 1 to 256"),
        fix="e.g. kernel_share_max_gib = 8", doc="GiB of DeepGEMM kernel files a roll's first "
        "host may share, and a later host accept (more: neither, each host compiles its own)")
    kernel_share_max_entries: int = key(
        100_000, check=whole(1, 1_000_000, "must be a whole number from 1 to 1000000"),
        fix="e.g. kernel_share_max_entries = 200000", doc="files and directories of shared "
        "kernels a roll's first host may share, and a later host accept")

    # --- engine and weights: where they come from ---
    engine_find_links: str | None = key(
        None, check=url, doc="a wheelhouse pip may also install the engine from (https)")
    allow_insecure_urls: bool = key(
        False, check=flag, parse=truth,
        fix="allow_insecure_urls = True (only where plain http is intended), or False",
        doc="accept `http://` repository, index, find-links and S3 URLs (a lab)")
    s3_endpoint_url: str | None = key(
        None, check=url, shown="AWS", doc="S3-compatible endpoint for `s3://` model sources "
        "(https)")
    aws_access_key_id: str | None = key(
        None, check=credential("aws_access_key_id", needs="aws_secret_access_key"), secret=True,
        fix=ONE_LINE, shown="the host's own", doc="S3 key id for staging, written to a "
        "root-only file")
    aws_secret_access_key: str | None = key(
        None, check=credential("aws_secret_access_key"), fix=ONE_LINE, secret=True,
        shown="the host's own", doc="S3 secret key, with `aws_access_key_id`")
    hf_token: str | None = key(
        None, check=credential("hf_token"), fix=ONE_LINE, secret=True,
        doc="Hugging Face token for gated `hf://` models, written to a root-only file")

    # --- teardown ---
    purge: tuple[str, ...] = key(
        (), check=subset_of(PURGEABLE), parse=lambda v: tuple(n for n in PURGEABLE
                                                              if n in names(v)),
        fix=f"a comma-separated subset of {','.join(PURGEABLE)}, e.g. --data "
        "purge=engine,weights", shown="none",
        doc="teardown: a comma-separated subset of `engine,weights,driver`")

    # --- the router ---
    routers: bool = key(
        False, lookup=_in_group, group=True, shown="none",
        doc="the hosts that run the router (`deploys/router.py`)")
    router_port: int = key(
        ROUTER_PORT, check=listen_port, fix=f"e.g. {ROUTER_PORT} (ports below 1024 are privileged)",
        doc="the router's port")
    router_host: str = key(
        "0.0.0.0", check=address, fix="the address the router listens on, e.g. 0.0.0.0",
        doc="the router's listen address")
    router_url: str | None = key(
        None, check=http_url, fix="e.g. http://10.0.0.11:30080",
        shown="`http://HOST:PORT` of the router host",
        doc="how roll, teardown and status reach the router")
    router_policy: str = key(
        "cache_aware", check=known(ROUTER_POLICIES, "policy"), parse=str,
        doc="the router's load-balancing policy")
    router_package: str = key(
        ROUTER_PACKAGE, check=known(ROUTER_PACKAGES, "router", f" (default {ROUTER_PACKAGE})"),
        doc="the gateway: `smg` (the Shepherd Model Gateway) or `sglang-router` (0.3.2, the "
        "last release under that name)")
    router_version: str | None = key(
        None, check=form(r"[0-9]{1,4}(\.[0-9]{1,6}){1,3}((a|b|rc)[0-9]{1,4})?(\.post[0-9]{1,4})?",
                         "a release, e.g. 0.3.2"), parse=str,
        shown="pinned per package (`1.13.0`, `0.3.2`)", doc="the gateway's release")
    router_index_url: str | None = key(
        None, check=url, shown="PyPI", doc="an index the hosts install the gateway from (https)")
    router_find_links: str | None = key(
        None, check=url, doc="a wheelhouse the hosts may also install the gateway from (https)")
    router_metrics_port: int = key(
        ROUTER_METRICS_PORT, check=listen_port,
        fix=f"e.g. {ROUTER_METRICS_PORT} (ports below 1024 are privileged)",
        doc="the router's Prometheus `/metrics` port")
    router_health_check_interval_secs: int = key(
        5, check=whole(1, None, POSITIVE), fix="remove it (default 5) or set a number",
        doc="seconds between the router's health checks of each worker")
    router_health_failure_threshold: int = key(
        3, check=whole(1, None, POSITIVE), fix="remove it (default 3) or set a number",
        doc="failed health checks that take a worker out")
    router_health_success_threshold: int = key(
        2, check=whole(1, None, POSITIVE), fix="remove it (default 2) or set a number",
        doc="passed health checks that put it back")
    router_breaker_failures: int = key(
        3, check=whole(1, None, POSITIVE), fix="remove it (default 3) or set a number",
        doc="consecutive failed requests that open a worker's circuit breaker (no requests to "
        "it)")
    router_breaker_timeout_secs: int = key(
        10, check=whole(1, None, POSITIVE), fix="remove it (default 10) or set a number",
        doc="seconds before an open breaker lets a request try the worker again (smg also as "
        "soon as its health checks pass)")
    router_api_key_secret: str = key(
        "sglang-api-key", check=secret_for("sglang-api-key"),
        doc="the secret clients present to the router (and it presents to the workers)")
    router_admin_api_key_secret: str = key(
        "sglang-router-admin-key", check=secret_for("sglang-router-admin-key"),
        doc="the secret for the router's `/workers` API")
    router_allow_no_key: bool = key(
        False, check=flag, parse=truth, fix=YES_OR_NO,
        doc="run the router without keys (refused otherwise)")

    # --- monitoring ---
    prometheus_file_sd: str | None = key(
        None, parse=_text, doc="write the fleet's Prometheus targets to this file on the "
        "controller")
    gpu_health_ignore: tuple[str, ...] = key(
        (), check=finding_ids, parse=lambda v: tuple(str(x) for x in v or ()),
        fix="e.g. gpu_health_ignore = ['xid-94']", shown="`[]`",
        doc="GPU health findings to let through, e.g. `[\"xid-94\"]` (see Fleet status)")

    # --- the NVIDIA driver ---
    nvidia_repo_base_url: str = key(
        NVIDIA_REPOS, check=url, doc="the CUDA repository's base (https)")
    nvidia_keyring_sha256: str | None = key(
        None, check=sha256, parse=str, fix=f"sha256sum {KEYRING} after checking the package",
        shown="pinned per repository", doc=f"sha256 of `{KEYRING}`")
    nvidia_driver_branch: str = key(
        DRIVER_BRANCH, check=form(r"[0-9]{3,4}", "a driver branch, e.g. 580"), parse=str,
        doc="driver branch")
    nvidia_driver_version: str | None = key(
        None, check=both(form(r"[0-9]{3,4}(\.[0-9]{1,4}){1,3}",
                              "an exact driver version, e.g. 580.95.05"),
                         on_branch("nvidia_driver_branch", DRIVER_BRANCH)),
        parse=str, shown="newest on first install, then kept",
        doc="exact version, e.g. `580.95.05`, on the branch")
    nvidia_driver_flavour: str = key(
        "open", check=open_flavour, fix="remove nvidia_driver_flavour or set it to 'open'",
        doc="anything else is refused (Blackwell needs the open modules)")
    allow_reboot: bool = key(
        False, check=flag, parse=truth, fix=YES_OR_NO,
        doc="whether the deploy may reboot the host")
    reboot_timeout_seconds: int = key(
        REBOOT_TIMEOUT, check=whole(10, None, "must be a whole number of seconds, at least 10"),
        fix=f"how long to wait for a host to come back from a reboot, e.g. {REBOOT_TIMEOUT}",
        doc="how long to wait for a rebooted host before it fails")
    engine_cuda: str = key(
        "13.0", check=both(form(r"[0-9]{1,2}\.[0-9]{1,2}", "a CUDA release, e.g. 13.0"),
                           listed(DRIVER_FLOOR, "CUDA release")), parse=str,
        doc="CUDA the engine needs (the driver's floor)")
    cuda_toolkit: str | None = key(
        None, check=form(r"[0-9]{1,2}-[0-9]{1,2}", "a toolkit package suffix, e.g. 12-9"),
        parse=str, doc="a CUDA toolkit to install besides, e.g. `12-9`")
    install_dcgm: bool = key(
        False, check=flag, parse=truth, fix=YES_OR_NO, doc="DCGM (`nvidia-dcgm`, its host "
        "engine on 127.0.0.1:5555) and its Prometheus exporter (`nvidia-dcgm-exporter`, :9400, "
        "behind `sglang_allowed_clients`)")

    @classmethod
    def from_data(cls, data: Mapping[str, Any] | Any, host: str,
                  groups: Iterable[str] = ()) -> HostConfig:
        """Check ``data`` (pyinfra's ``host.data``, or a mapping); InputError listing all."""
        values, problems, _ = checked_all(cls, Raw(data, host, tuple(groups)))
        InputError.raise_any(problems)
        return cls(name=host, **values)

    @classmethod
    def from_data_all(cls, data: Mapping[str, Any] | Any, host: str,
                      groups: Iterable[str] = ()) -> tuple[HostConfig, list[str]]:
        """As ``from_data``, with each refused key at its default; the refused keys."""
        values, _, refused = checked_all(cls, Raw(data, host, tuple(groups)))
        return cls(name=host, **values), refused

    @property
    def source(self) -> str:
        return f"pyinfra data of {self.name}"

    @property
    def network_env(self) -> dict[str, str]:
        """The NCCL and gloo variables host data sets, for the server's environment file."""
        values = {"NCCL_SOCKET_IFNAME": self.nccl_socket_ifname,
                  "GLOO_SOCKET_IFNAME": self.gloo_socket_ifname, "NCCL_IB_HCA": self.nccl_ib_hca}
        return {name: value for name, value in values.items() if value}

    @property
    def address(self) -> str:
        """How other machines reach the host: its SSH address unless data says otherwise."""
        return self.sglang_address or self.ssh_hostname or self.name


def _value(spec: Declared, raw: Raw) -> tuple[Any, list[Problem]]:
    value = spec.lookup(raw, spec.name) if spec.lookup else raw.get(spec.name)
    if value is None:
        return spec.fresh, []
    found = wrongs(spec.check(value, raw)) if spec.check else []
    if found:
        return None, [Problem(raw.source, w.key or spec.name, w.message, w.fix or spec.fix)
                      for w in found]
    return (spec.parse(value) if spec.parse else value), []


def checked_all(fields: type, raw: Raw) -> tuple[dict[str, Any], list[Problem], list[str]]:
    """Every key ``fields`` declares, read from ``raw``, checked and typed (a refused one at
    its default); the problems; the refused keys."""
    values: dict[str, Any] = {}
    problems: list[Problem] = []
    refused: list[str] = []
    for spec in declared(fields):
        value, found = _value(spec, raw)
        values[spec.name] = spec.fresh if found else value
        problems += found
        refused += [spec.name] if found else []
    return values, problems, refused
