"""The router in front of servers in gRPC mode (``server.router_connection: grpc``): smg with
the parsers the servers would have run, under smg's names; refused for sglang-router, for a
fleet that mixes connections or parsers, and for a parser smg has no twin of."""

from __future__ import annotations

from typing import Any

import pytest
from pyinfra.api.inventory import Inventory

from sglang_fleet import hostconfig
from sglang_fleet.config import connection, profile
from sglang_fleet.config.render import render
from sglang_fleet.errors import InputError
from sglang_fleet.fleet import inventory as fleet
from sglang_fleet.stages.router.deploy import argv
from tests.conftest import FIELD_PROFILE

GRPC = {"sglang.server.router_connection": "grpc", "sglang.server.api_key_secret": None}


def inventory(router: dict[str, Any] | None = None, **hosts: dict[str, Any]) -> Inventory:
    names = list(hosts) or ["b200-01", "b200-02"]
    data = [(n, {"sglang_address": f"10.0.0.{11 + i}", **hosts.get(n, GRPC)})
            for i, n in enumerate(names)]
    return Inventory(  # type: ignore[no-untyped-call]
        ([*data, ("r1", {"ssh_hostname": "10.0.0.9", "router_allow_no_key": True,
                         **(router or {})})], {}),
        b200=(names, {"sglang_profile": str(FIELD_PROFILE), "gpu_count": 8,
                      "sglang.parallel.instances": 1}),
        routers=(["r1"], {}))


def gateway(inv: Inventory) -> list[str]:
    return fleet.gateway_args(inv, inv.get_host("r1"))


def test_grpc_workers_get_smg_with_the_profiles_parsers_by_smgs_names() -> None:
    inv = inventory()
    assert fleet.all_worker_urls(inv) == ["grpc://10.0.0.11:30000", "grpc://10.0.0.12:30000"]
    flags = gateway(inv)
    assert flags == ["--reasoning-parser", "qwen3", "--tool-call-parser", "qwen_coder"]
    [config] = fleet.routers(inv)
    line = argv(config, gateway=flags)
    assert line[-4:] == flags and line[line.index("launch") - 1] == "smg.cli"


def test_http_workers_parse_their_own_answers() -> None:
    assert gateway(inventory(**{"b200-01": {}, "b200-02": {}})) == []


@pytest.mark.parametrize(("hosts", "router", "message"), [
    ({"b200-01": GRPC, "b200-02": {}}, {},
     "b200-01: grpc --reasoning-parser qwen3 --tool-call-parser qwen_coder; b200-02: http"),
    ({"b200-01": GRPC, "b200-02": {**GRPC, "sglang.parsers.reasoning": "deepseek-r1"}}, {},
     "--reasoning-parser deepseek_r1"),
    ({}, {"router_package": "sglang-router"}, "router_package: the serving hosts' servers are "
     "in gRPC mode"),
])
def test_refused_before_any_change(hosts: dict[str, Any], router: dict[str, Any],
                                   message: str) -> None:
    with pytest.raises(InputError) as err:
        gateway(inventory(router, **hosts))
    assert message in str(err.value)


def test_a_parser_smg_has_no_twin_of_is_the_profiles_problem() -> None:
    prof = profile.load(FIELD_PROFILE, {**{k.removeprefix("sglang."): v for k, v in GRPC.items()},
                                        "parsers.tool": "hermes"})
    with pytest.raises(InputError) as err:
        render(prof)
    assert "parsers.tool: over gRPC the gateway parses answers, and smg has no parser known " \
        "to read what SGLang's 'hermes' reads" in str(err.value)


def test_a_grpc_worker_open_to_anyone_is_refused_and_the_router_must_be_let_in() -> None:
    data = hostconfig.of(inventory().get_host("b200-01"))
    prof = profile.load(FIELD_PROFILE, {"server.router_connection": "grpc",
                                        "server.api_key_secret": None})
    with pytest.raises(InputError, match="sglang_allowed_clients: the servers are in gRPC mode"):
        connection.require_filter(prof, data.sglang_allowed_clients, data.source)
    connection.require_filter(prof, ("10.0.0.0/24",), data.source)
    shut: dict[str, Any] = {**GRPC, "sglang_allowed_clients": ["10.0.1.0/24"]}
    with pytest.raises(InputError) as err:
        gateway(inventory(**{"b200-01": shut, "b200-02": GRPC}))
    assert "sglang_allowed_clients: the router on r1 (10.0.0.9) is not in it" in str(err.value)
    opened: dict[str, Any] = {**GRPC, "sglang_allowed_clients": ["10.0.1.0/24", "10.0.0.9"]}
    assert gateway(inventory(**{"b200-01": opened, "b200-02": GRPC}))
