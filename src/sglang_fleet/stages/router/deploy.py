"""Router stage: the gateway (``smg`` by default; ``sglang-router`` 0.3.2 with host data
``router_package``), pinned, as a hardened systemd service in front of every serving host,
with its keys from a root-only file; the worker list changes without a restart.

    from sglang_fleet.stages.router.deploy import install_router
    install_router(fleet.RouterConfig.from_host(host), fleet.all_worker_urls(inventory),
                   fleet.gateway_args(inventory, host))

smg reads its workers from a file it watches (``--discovery-provider file``): the deploy writes
the file and smg applies it within a second. sglang-router 0.3.2 has no such option: it starts
with the list from an environment file and the deploy changes the running list through its
``/workers`` API.
"""

from __future__ import annotations

import json
import time
from io import StringIO
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from pyinfra import logger
from pyinfra.api.command import FunctionCommand
from pyinfra.api.deploy import deploy
from pyinfra.api.operation import OperationMeta, operation
from pyinfra.context import host, state
from pyinfra.operations import files, systemd

from sglang_fleet import paths
from sglang_fleet.errors import InputError
from sglang_fleet.fleet.inventory import RouterConfig
from sglang_fleet.fleet.router_api import RouterError
from sglang_fleet.ops import Ops, fail, preview
from sglang_fleet.ops.host_programs import program, upload
from sglang_fleet.ops.secretfile import secret_file, secrets_directory
from sglang_fleet.ops.unitfile import UnsafeValue, env_line, networks, systemd_word
from sglang_fleet.stages.engine.deploy import uv_ready, venv_install
from sglang_fleet.stages.service.deploy import allowed_clients, unit_absent, unit_running

UNIT = paths.ROUTER_UNIT
HOME = paths.ROUTER_HOME
HOST = "sglang_fleet.stages.router.host"
LAUNCHER = f"{HOST}.start_router"  # the keys in-process (stages/router/host/start_router.py)
ENV_FILE = paths.env_file(UNIT)
WORKERS_ENV = paths.ROUTER_WORKERS  # sglang-router: the list it starts with
WORKERS_JSON = paths.ROUTER_WORKERS_JSON  # smg: the list it watches
TEMPLATE = str(Path(__file__).with_name("sglang-router.service.j2"))  # beside its deploy
CACHE_LINK = paths.ROUTER_CACHE
CACHE_DIR = paths.ROUTER_CACHE_PRIVATE
GRACE = 60  # seconds the router gives requests in flight when it stops
# smg re-reads its worker file on every change and, besides, every this many seconds; a reread
# puts back a worker a roll took out through the API, so the periodic one waits a day.
REREAD = 86400
APPLY_S = 10  # seconds smg may take to apply its changed file (measured: under 1 s)
# Each package's CLI entry point (start_router imports it; nothing else is accepted there).
CLI = {"smg": "smg.cli", "sglang-router": "sglang_router.cli"}


def venv(config: RouterConfig) -> str:
    return f"{HOME}/{config.package}-{config.version}"


def watches_file(config: RouterConfig) -> bool:
    """Whether the router reads its workers from a file it watches (smg)."""
    return config.package == "smg"


def argv(config: RouterConfig, workers_json: str = WORKERS_JSON,
         gateway: list[str] | None = None) -> list[str]:
    """The router's command line (smg kept sglang-router's flag names, smg/router_args.py);
    ``gateway``: the parsers of workers in gRPC mode, whose tokenizer smg fetches from them."""
    line = [*program(f"{venv(config)}/bin/python", LAUNCHER), CLI[config.package], "launch",
            "--host", config.bind, "--port", str(config.port), "--policy", config.policy,
            "--health-check-endpoint", "/health",
            "--health-check-interval-secs", str(config.health_interval),
            "--health-failure-threshold", str(config.health_failures),
            "--health-success-threshold", str(config.health_successes),
            "--cb-failure-threshold", str(config.breaker_failures),
            "--cb-timeout-duration-secs", str(config.breaker_timeout),
            "--shutdown-grace-period-secs", str(GRACE),
            "--prometheus-host", config.bind, "--prometheus-port", str(config.metrics_port)]
    if watches_file(config):
        # Discovery would also remove a worker unhealthy for long (and re-add it on the next
        # reread); kept listed, it comes back by its health checks alone.
        line += ["--discovery-provider", "file", "--discovery-file", workers_json,
                 "--discovery-check-interval-secs", str(REREAD), "--no-remove-unhealthy-workers"]
    return line + (gateway or [])


def exec_start(config: RouterConfig, gateway: list[str] | None = None) -> str:
    words = [systemd_word(w) for w in argv(config, gateway=gateway)]
    if not watches_file(config):
        words += ["--worker-urls", "$SGLANG_ROUTER_WORKERS"]
    return " ".join(words)


def workers_text(config: RouterConfig, worker_urls: list[str]) -> str:
    """The worker list the router reads: smg's manifest (``{"version": 1, "workers": [{"url":
    ...}]}``, the only version smg 1.13.0 reads) or sglang-router's environment file."""
    if watches_file(config):
        return json.dumps({"version": 1, "workers": [{"url": u} for u in worker_urls]},
                          indent=2) + "\n"
    return env_line("SGLANG_ROUTER_WORKERS", " ".join(worker_urls)) + "\n"


def env_text(config: RouterConfig) -> str:
    """The router's root-only environment file: its client key and its /workers admin key."""
    keys = {paths.API_KEY_VAR: config.api_key, paths.ROUTER_ADMIN_KEY_VAR: config.admin_key}
    return "".join(f"{env_line(k, v)}\n" for k, v in keys.items() if v) or "\n"


def allowed_peers(worker_urls: list[str]) -> list[str]:
    """With ``sglang_allowed_clients`` set: those clients and the workers (the router must reach
    them through the same filter); empty means any."""
    clients = allowed_clients()
    if not clients:
        return []
    workers = [urlsplit(url).hostname or "" for url in worker_urls]
    try:
        return clients + networks(workers)
    except UnsafeValue as err:
        raise InputError.one(f"pyinfra data of {host.name}", "sglang_allowed_clients",
                             f"the router's IP filter needs its workers' addresses: {err}",
                             "give each serving host an IP address (sglang_address) or drop "
                             "sglang_allowed_clients") from None


@operation(is_idempotent=True)
def router_release(config: RouterConfig) -> Ops:
    """PACKAGE==VERSION in its own venv, renamed into place when complete.

        router_release(name="Install smg 1.13.0", config=config)
    """
    source = [*(["--index-url", config.index_url] if config.index_url else []),
              *(["--find-links", config.find_links] if config.find_links else [])]
    yield from venv_install(venv(config), "/usr/bin/python3",
                            f"{config.package}=={config.version}", source)


def _sync(state: object, host: Any, config: RouterConfig, urls: list[str],
          file_changed: bool) -> None:
    """Give a router that watches its just-changed file a few seconds to apply it, then add and
    remove through the API what still differs, and give what it added time to be listed."""
    api = config.api()
    deadline = time.monotonic() + (APPLY_S if file_changed and watches_file(config) else 0)
    have = api.workers(routed_only=True)
    while set(have) != set(urls) and time.monotonic() < deadline:
        time.sleep(0.5)
        have = api.workers(routed_only=True)
    added = [url for url in urls if url not in have and api.add(url)]
    for url in have:
        if url not in urls:
            api.remove(url)
    try:  # a server that is down now is added all the same: its health checks let it in
        api.wait_listed(added, APPLY_S)
    except RouterError as err:
        logger.warning(f"{host.print_prefix}{err}")


@operation(is_idempotent=True)
def workers_in_step(config: RouterConfig, urls: list[str], listed: OperationMeta,
                    wait: int = 60) -> Ops:
    """The running router routes to exactly ``urls``: smg from the file it watches (given a few
    seconds to apply it when ``listed`` changed it), and either through its API for what still
    differs; ``wait``: seconds for its API to answer after a start.

        workers_in_step(name="Router workers", config=config, urls=["http://10.0.0.2:30000"],
                        listed=put)
    """
    if not state.is_executing:  # the router's API answers only once it runs
        yield from preview(f"may set the workers of the router {config.url} to these "
                           f"{len(urls)}, through its API")
        return
    router = config.api()
    try:
        router.wait_alive(wait)
        have = router.workers(routed_only=True)
    except RouterError as err:
        yield fail(str(err))
        return
    if set(have) != set(urls):
        yield FunctionCommand(_sync, (config, urls, listed.did_change()), {})
        return
    healthy = sum(1 for w in have.values() if w.get("is_healthy"))
    logger.info(f"{host.print_prefix}router {config.url}: {healthy}/{len(urls)} workers healthy")


@deploy("SGLang router")
def install_router(config: RouterConfig, worker_urls: list[str],
                   gateway: list[str] | None = None) -> None:
    uv_ready()
    files.directory(name=f"Directory {HOME}", path=HOME, mode="755")
    router_release(name=f"Install {config.package} {config.version}", config=config)
    [launcher] = upload(HOST, LAUNCHER)
    secrets_directory()
    key = secret_file(name="Router keys (root, 0600)", dest=ENV_FILE, content=env_text(config))
    files.directory(name="Router worker list directory", path=paths.ROUTER_CONFIG, mode="755")
    used, unused = ((WORKERS_JSON, WORKERS_ENV) if watches_file(config)
                    else (WORKERS_ENV, WORKERS_JSON))
    how = "watched" if watches_file(config) else "read at start"
    listed = files.put(name=f"Router worker list ({how})", dest=used, mode="644",
                       src=StringIO(workers_text(config, worker_urls)))
    files.file(name="The other router's worker list", path=unused, present=False)
    unit = files.template(name=f"Unit {UNIT}", src=TEMPLATE, dest=paths.unit_path(UNIT),
                          mode="644", package=config.package, version=config.version,
                          env_file=ENV_FILE,
                          workers_file=None if watches_file(config) else WORKERS_ENV,
                          exec_start=exec_start(config, gateway), grace=GRACE,
                          allowed=allowed_peers(worker_urls), paths=paths.template_values())
    systemd.daemon_reload(name="Reload systemd", _if=unit.did_change)
    unit_running(name=f"Enable and start {UNIT}", unit=UNIT, changes=[unit, key, launcher])
    workers_in_step(name=f"Router routes to {len(worker_urls)} workers", config=config,
                    urls=worker_urls, listed=listed)


@deploy("Remove the SGLang router")
def remove_router() -> None:
    """Stop and remove the router's unit, key and worker list; its releases go with purge."""
    unit_absent(name=f"Stop and remove {UNIT} and its key", unit=UNIT)
    # systemd keeps a DynamicUser's CacheDirectory (and the link to it) after the unit goes.
    files.link(name="Router cache link", path=CACHE_LINK, present=False)
    files.directory(name="Router cache", path=CACHE_DIR, present=False)
    files.directory(name="Router worker list", path=paths.ROUTER_CONFIG, present=False)
