"""The Prometheus targets of servers: each names where its ``/metrics`` answers, which for a
server in gRPC mode is the HTTP side port its unit starts it with (``--smg-http-sidecar-port``),
not the gRPC port."""

from __future__ import annotations

from typing import Any

from pyinfra.api.inventory import Inventory

from sglang_fleet import hostconfig
from sglang_fleet.config.render import render_all
from sglang_fleet.report.metrics_targets import targets
from tests.conftest import FIELD_PROFILE

GRPC = {"sglang.server.router_connection": "grpc", "sglang.server.api_key_secret": None,
        "sglang_allowed_clients": ["10.0.0.0/24"]}


def fleet(**data: Any) -> Inventory:
    """One host with two servers (``data``: its host data)."""
    return Inventory(([("b200-01", {"sglang_address": "10.0.0.11", **data})], {}),  # type: ignore[no-untyped-call]
                     b200=(["b200-01"], {"sglang_profile": str(FIELD_PROFILE), "gpu_count": 8,
                                         "sglang.parallel.instances": 2}))


def servers(**data: Any) -> dict[str, list[str]]:
    """Each server's targets by its ``instance_index``."""
    return {g["labels"]["instance_index"]: g["targets"] for g in targets(fleet(**data))
            if g["labels"]["job"] == "sglang"}


def test_grpc_servers_are_scraped_on_their_side_port() -> None:
    launches = render_all(hostconfig.profile_for(fleet(**GRPC).get_host("b200-01")))
    ports = [launch.argv[launch.argv.index("--smg-http-sidecar-port") + 1]
             for launch in launches]  # what each server's /metrics answers on
    assert ports == ["30100", "30101"]
    assert servers(**GRPC) == {"0": [f"10.0.0.11:{ports[0]}"], "1": [f"10.0.0.11:{ports[1]}"]}


def test_http_servers_are_scraped_on_their_own_port() -> None:
    assert servers() == {"0": ["10.0.0.11:30000"], "1": ["10.0.0.11:30001"]}
