"""Router stage: the real ``sglang-router`` (from PyPI, pinned) as a hardened systemd service in
front of every serving host of the inventory, health-checking them, with the API key from a
root-only file; the running router's worker list is kept in step without a restart.

    from sglang_fleet.router import install_router
    install_router(fleet.RouterConfig.from_host(host), fleet.all_worker_urls(inventory))
"""

from __future__ import annotations

from io import StringIO
from urllib.parse import urlsplit

from pyinfra import logger
from pyinfra.api.command import FunctionCommand
from pyinfra.api.deploy import deploy
from pyinfra.api.operation import operation
from pyinfra.context import host, state
from pyinfra.operations import files, systemd

from sglang_fleet import paths
from sglang_fleet.engine import uv_ready, venv_install
from sglang_fleet.errors import InputError
from sglang_fleet.fleet import RouterConfig
from sglang_fleet.hostcode import program, upload
from sglang_fleet.ops import Ops, fail
from sglang_fleet.routerctl import RouterError
from sglang_fleet.secretfile import secret_file, secrets_directory
from sglang_fleet.service import allowed_clients, unit_absent, unit_running
from sglang_fleet.unitfile import UnsafeValue, env_line, networks, systemd_word

UNIT = paths.ROUTER_UNIT
HOME = paths.ROUTER_HOME
LAUNCHER = "start_router"  # the keys in-process (remote/start_router.py)
ENV_FILE = paths.env_file(UNIT)
WORKERS_FILE = paths.ROUTER_WORKERS
TEMPLATE = paths.template("sglang-router.service.j2")
CACHE_LINK = paths.ROUTER_CACHE
CACHE_DIR = paths.ROUTER_CACHE_PRIVATE
GRACE = 60  # seconds the router gives requests in flight when it stops


def venv(config: RouterConfig) -> str:
    return f"{HOME}/sglang-router-{config.version}"


def argv(config: RouterConfig) -> list[str]:
    """The router's command line (the worker list comes from ``$SGLANG_ROUTER_WORKERS``)."""
    return [*program(f"{venv(config)}/bin/python", LAUNCHER), "launch", "--host", config.bind,
            "--port", str(config.port), "--policy", config.policy,
            "--health-check-endpoint", "/health",
            "--health-check-interval-secs", str(config.health_interval),
            "--health-failure-threshold", str(config.health_failures),
            "--health-success-threshold", str(config.health_successes),
            "--shutdown-grace-period-secs", str(GRACE),
            "--prometheus-host", config.bind]


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
    """sglang-router==VERSION in its own venv, renamed into place when complete.

    + config: the router's validated host data (``RouterConfig.from_host``)

        router_release(name="Install sglang-router 0.3.2", config=config)
    """
    yield from venv_install(venv(config), "/usr/bin/python3", f"sglang-router=={config.version}",
                            [])


def _sync(state: object, host: object, config: RouterConfig, urls: list[str]) -> None:
    router = config.api()
    have = router.workers()
    for url in urls:
        if url not in have:
            router.add(url)
    for url in have:
        if url not in urls:
            router.remove(url)


@operation(is_idempotent=True)
def workers_in_step(config: RouterConfig, urls: list[str], wait: int = 60) -> Ops:
    """The running router routes to exactly ``urls`` (added or removed through its API).

    + config: the router's validated host data (its URL and admin key)
    + urls: the workers it must route to
    + wait: seconds to wait for the router's API to answer after a start

        workers_in_step(name="Router workers", config=config, urls=["http://10.0.0.2:30000"])
    """
    if not state.is_executing:
        return
    router = config.api()
    try:
        router.wait_alive(wait)
        have = router.workers()
    except RouterError as err:
        yield fail(str(err))
        return
    if set(have) != set(urls):
        yield FunctionCommand(_sync, (config, urls), {})
        return
    healthy = sum(1 for w in have.values() if w.get("is_healthy"))
    logger.info(f"{host.print_prefix}router {config.url}: {healthy}/{len(urls)} workers healthy")


@deploy("SGLang router")
def install_router(config: RouterConfig, worker_urls: list[str]) -> None:
    uv_ready()
    files.directory(name=f"Directory {HOME}", path=HOME, mode="755")
    router_release(name=f"Install sglang-router {config.version}", config=config)
    [launcher] = upload(LAUNCHER)
    secrets_directory()
    key = secret_file(name="Router keys (root, 0600)", dest=ENV_FILE, content=env_text(config))
    files.directory(name="Router worker list directory", path=WORKERS_FILE.rsplit("/", 1)[0],
                    mode="755")
    files.put(name="Router worker list (read at start)", dest=WORKERS_FILE, mode="644",
              src=StringIO(env_line("SGLANG_ROUTER_WORKERS", " ".join(worker_urls)) + "\n"))
    exec_start = " ".join([*(systemd_word(w) for w in argv(config)),
                           "--worker-urls", "$SGLANG_ROUTER_WORKERS"])
    unit = files.template(name=f"Unit {UNIT}", src=TEMPLATE, dest=paths.unit_path(UNIT),
                          mode="644", version=config.version, env_file=ENV_FILE,
                          workers_file=WORKERS_FILE, exec_start=exec_start, grace=GRACE,
                          allowed=allowed_peers(worker_urls), paths=paths.template_values())
    systemd.daemon_reload(name="Reload systemd", _if=unit.did_change)
    unit_running(name=f"Enable and start {UNIT} (restarted when its definition changed)",
                 unit=UNIT, changes=[unit, key, launcher])
    workers_in_step(name=f"Router routes to {len(worker_urls)} workers", config=config,
                    urls=worker_urls)


@deploy("Remove the SGLang router")
def remove_router() -> None:
    """Stop and remove the router's unit, key and worker list; its releases go with purge."""
    unit_absent(name=f"Stop and remove {UNIT} and its key", unit=UNIT)
    # systemd keeps a DynamicUser's CacheDirectory (and the link to it) after the unit goes.
    files.link(name="Router cache link", path=CACHE_LINK, present=False)
    files.directory(name="Router cache", path=CACHE_DIR, present=False)
    files.directory(name="Router worker list", path=WORKERS_FILE.rsplit("/", 1)[0],
                    present=False)
