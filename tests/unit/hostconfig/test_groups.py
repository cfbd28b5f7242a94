"""Multi-node groups declared in the inventory (``sglang_group``): ranks from inventory order,
rank 0's address, and every way a group is not one server refused by host, key and fix."""

from __future__ import annotations

from typing import Any

import pytest
from pyinfra.api.inventory import Inventory

from sglang_fleet import hostconfig
from sglang_fleet.config.multinode import Rank
from sglang_fleet.config.render import render_all
from sglang_fleet.errors import InputError
from sglang_fleet.hostconfig import HostConfig, groups
from tests.conftest import FIELD_PROFILE

TP16 = {"sglang_profile": str(FIELD_PROFILE), "gpu_count": 8, "sglang.parallel.tp": 16,
        "sglang.parallel.nnodes": 2}


def fleet(*hosts: tuple[str, dict[str, Any]], **group_data: Any) -> Inventory:
    """An inventory of ``hosts`` (name, host data) in this order, all in the group ``b200``."""
    return Inventory(  # type: ignore[no-untyped-call]
        (list(hosts), {}), b200=([name for name, _ in hosts], {**TP16, **group_data}))


def test_ranks_follow_inventory_order_and_rank0_is_the_rendezvous() -> None:
    inv = fleet(("gpu-b", {"sglang_group": "tp16", "sglang_address": "10.0.0.12"}),
                ("solo", {"sglang.parallel.tp": 1, "sglang.parallel.nnodes": 1}),
                ("gpu-a", {"sglang_group": "tp16", "sglang_address": "10.0.0.11"}))
    b, solo, a = (inv.get_host(n) for n in ("gpu-b", "solo", "gpu-a"))
    assert [h.name for h in groups.group_hosts(a)] == ["gpu-b", "gpu-a"]
    assert groups.rank_for(b, hostconfig.profile_for(b)) == Rank(0, "10.0.0.12")
    assert groups.rank_for(a, hostconfig.profile_for(a)) == Rank(1, "10.0.0.12")
    assert groups.rank_for(solo, hostconfig.profile_for(solo)) is None
    assert [groups.is_worker(h) for h in (b, solo, a)] == [True, True, False]
    [launch] = render_all(hostconfig.profile_for(a), rank=groups.rank_for(a,
                                                                           hostconfig.profile_for(a)))
    words = launch.argv
    assert words[words.index("--node-rank") + 1] == "1"
    assert words[words.index("--dist-init-addr") + 1] == "10.0.0.12:20000"
    assert launch.unit == "sglang.service"  # one unit per member


def test_rank0_address_falls_back_to_ssh_hostname() -> None:
    inv = fleet(("b200-01", {"sglang_group": "g", "ssh_hostname": "gpu1.example"}),
                ("b200-02", {"sglang_group": "g"}))
    host = inv.get_host("b200-02")
    assert groups.rank_for(host, hostconfig.profile_for(host)) == Rank(1, "gpu1.example")


def test_a_multinode_host_without_a_group_names_host_key_and_fix() -> None:
    inv = fleet(("b200-01", {}), ("b200-02", {}))
    host = inv.get_host("b200-02")
    with pytest.raises(InputError) as err:
        groups.rank_for(host, hostconfig.profile_for(host))
    [problem] = err.value.problems
    assert problem.source == "pyinfra data of b200-02" and problem.key == "sglang_group"
    assert "parallel.nnodes is 2" in problem.message and "no group" in problem.message
    assert "sglang_group = 'NAME'" in problem.fix


def test_the_group_size_must_be_nnodes() -> None:
    inv = fleet(("b200-01", {"sglang_group": "g"}), ("b200-02", {"sglang_group": "g"}),
                ("b200-03", {"sglang_group": "g"}))
    host = inv.get_host("b200-01")
    with pytest.raises(InputError, match=r"sglang_group: group 'g' has 3 host\(s\) \(b200-01, "
                       r"b200-02, b200-03\), parallel.nnodes is 2"):
        groups.rank_for(host, hostconfig.profile_for(host))


def test_mismatched_member_profiles_are_refused_naming_the_host() -> None:
    inv = fleet(("b200-01", {"sglang_group": "g"}),
                ("b200-02", {"sglang_group": "g", "sglang.memory.max_running_requests": 64}))
    host = inv.get_host("b200-01")  # seen from either member: the one that differs is named
    with pytest.raises(InputError) as err:
        groups.rank_for(host, hostconfig.profile_for(host))
    [problem] = err.value.problems
    assert problem.source == "pyinfra data of b200-02" and problem.key == "sglang_profile"
    assert "b200-02 serves another profile than b200-01, rank 0 of group 'g'" in problem.message
    assert "memory.max_running_requests 64 (rank 0: None)" in problem.message


def test_each_member_may_listen_on_its_own_address() -> None:
    """server.host is each member's own (its HTTP server: rank 0's API, a rank >= 1's dummy
    health server), as on hosts that bind their own address (the lab's): not a difference."""
    inv = fleet(("b200-01", {"sglang_group": "g", "sglang.server.host": "10.0.0.11"}),
                ("b200-02", {"sglang_group": "g", "sglang.server.host": "10.0.0.12"}))
    for name, address in (("b200-01", "10.0.0.11"), ("b200-02", "10.0.0.12")):
        host = inv.get_host(name)
        prof = hostconfig.profile_for(host)
        [launch] = render_all(prof, rank=groups.rank_for(host, prof))
        assert launch.argv[launch.argv.index("--host") + 1] == address


def test_a_member_without_a_profile_is_named() -> None:
    inv = Inventory(  # type: ignore[no-untyped-call]
        ([("b200-01", {**TP16, "sglang_group": "g"}), ("b200-02", {"sglang_group": "g"})], {}))
    with pytest.raises(InputError, match=r"pyinfra data of b200-02: sglang_profile: b200-02 is "
                       r"in sglang_group 'g' but serves no profile"):
        host = inv.get_host("b200-01")
        groups.rank_for(host, hostconfig.profile_for(host))


def test_the_launches_of_a_group_differ_only_by_rank() -> None:
    inv = fleet(("b200-01", {"sglang_group": "g", "sglang_address": "10.0.0.11"}),
                ("b200-02", {"sglang_group": "g", "sglang_address": "10.0.0.12"}))
    launches = []
    for host in inv:
        prof = hostconfig.profile_for(host)
        launches += render_all(prof, rank=groups.rank_for(host, prof))
    differ = [(a, b) for a, b in zip(*(launch.argv for launch in launches), strict=True)
              if a != b]
    assert differ == [("0", "1")]


def test_peer_networks_list_every_member_and_refuse_names() -> None:
    inv = fleet(("b200-01", {"sglang_group": "g", "sglang_address": "10.0.0.11"}),
                ("b200-02", {"sglang_group": "g", "sglang_address": "fd00::12"}))
    assert groups.peer_networks(inv.get_host("b200-02")) == ["10.0.0.11/32", "fd00::12/128"]
    named = fleet(("b200-01", {"sglang_group": "g", "ssh_hostname": "gpu1.example"}),
                  ("b200-02", {"sglang_group": "g", "sglang_address": "10.0.0.12"}))
    with pytest.raises(InputError) as err:
        groups.peer_networks(named.get_host("b200-02"))
    [problem] = err.value.problems
    assert (problem.source, problem.key) == ("pyinfra data of b200-01", "sglang_address")
    assert "'gpu1.example' is not an IP address" in problem.message


@pytest.mark.parametrize(("key", "value"), [
    ("sglang_group", "a b"), ("sglang_group", "../x"), ("sglang_group", ""),
    ("sglang_group", 7), ("nccl_socket_ifname", "eth0;id"), ("nccl_socket_ifname", "eth0 eth1"),
    ("nccl_socket_ifname", "a-very-long-interface"), ("gloo_socket_ifname", "^eth0"),
    ("nccl_ib_hca", "mlx5_0:x"), ("nccl_ib_hca", "$(id)"), ("nccl_ib_hca", ["mlx5_0"])])
def test_group_and_network_keys_are_held_to_their_forms(key: str, value: object) -> None:
    with pytest.raises(InputError, match=rf"pyinfra data of h: {key}: "):
        HostConfig.from_data({key: value}, "h")


def test_network_keys_become_the_environment() -> None:
    cfg = HostConfig.from_data({"nccl_socket_ifname": "^docker,lo", "gloo_socket_ifname":
                                "ens1f0", "nccl_ib_hca": "mlx5_0:1,mlx5_1"}, "h")
    assert cfg.network_env == {"NCCL_SOCKET_IFNAME": "^docker,lo",
                               "GLOO_SOCKET_IFNAME": "ens1f0", "NCCL_IB_HCA": "mlx5_0:1,mlx5_1"}
    assert HostConfig.from_data({}, "h").network_env == {}
