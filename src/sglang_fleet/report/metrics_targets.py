"""Prometheus file_sd targets for a fleet: every server instance's ``/metrics``, every router's
metrics port and, on hosts with ``install_dcgm``, NVIDIA's DCGM exporter.

    write_targets(inventory, "/etc/prometheus/file_sd/sglang-fleet.json")

The file is a JSON list of ``{"targets": [...], "labels": {...}}`` groups (Prometheus'
``file_sd_configs`` format); Prometheus re-reads it when it changes, so it is replaced
atomically and only when its content differs.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pyinfra.api.host import Host

from sglang_fleet import hostconfig
from sglang_fleet.config.connection import metrics_url
from sglang_fleet.config.render import render_all
from sglang_fleet.errors import InputError
from sglang_fleet.fleet import inventory as fleet

# dcgm-exporter's default listen address (:9400).
DCGM_EXPORTER_PORT = 9400
TARGETS_KEY = "prometheus_file_sd"


def _scrape_target(url: str) -> str:
    """Where a server's ``/metrics`` is, as ``HOST:PORT`` (Prometheus' default path): for one
    in gRPC mode, its HTTP side port."""
    return metrics_url(url).split("//", 1)[-1].removesuffix("/metrics")


def targets(hosts: Iterable[Host]) -> list[dict[str, Any]]:
    """file_sd groups: servers (job ``sglang``; in gRPC mode their side port), routers
    (``sglang-router``), DCGM (``dcgm``).

        [{"targets": ["10.0.0.11:30000"], "labels": {"job": "sglang", "host": "gpu1",
          "instance_index": "0", "model": "qwen3.6-27b"}}, ...]
    """
    groups: list[dict[str, Any]] = []
    hosts = list(hosts)
    for host in fleet.serving_hosts(hosts):
        profile = hostconfig.profile_for(host)
        launches = render_all(profile)
        if not profile.server.metrics:
            continue  # no --enable-metrics: nothing to scrape
        for launch, url in zip(launches, fleet.urls(host, profile, launches), strict=True):
            groups.append({"targets": [_scrape_target(url)],
                           "labels": {"job": "sglang", "host": host.name,
                                      "instance_index": str(launch.instance),
                                      "model": profile.model.served_name or ""}})
    for host in hosts:
        cfg = hostconfig.of(host)
        if cfg.routers:
            config = fleet.RouterConfig.from_host(host)
            where = cfg.address if config.bind in fleet.ANY_ADDRESS else config.bind
            groups.append({"targets": [f"{where}:{config.metrics_port}"],
                           "labels": {"job": "sglang-router", "host": host.name}})
        if cfg.install_dcgm:
            groups.append({"targets": [f"{cfg.address}:{DCGM_EXPORTER_PORT}"],
                           "labels": {"job": "dcgm", "host": host.name}})
    return groups


def write_targets(hosts: Iterable[Host], path: str) -> bool:
    """Write the target list to ``path`` (atomically); True if it changed."""
    text = json.dumps(targets(hosts), indent=2) + "\n"
    dest = Path(path)
    try:
        if dest.is_file() and dest.read_text() == text:
            return False
        dest.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.")
        with os.fdopen(fd, "w") as out:
            out.write(text)
        os.chmod(tmp, 0o644)  # Prometheus runs as its own user; the list holds no secret
        os.replace(tmp, dest)
    except OSError as err:
        raise InputError.one("host data", TARGETS_KEY, f"cannot write {path}: {err.strerror}",
                             "give a path this user can write, e.g. "
                             "prometheus/sglang-fleet.json") from None
    return True
