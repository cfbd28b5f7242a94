"""A multi-node group's member, on its host: its unit (the peers in the IP allow-list, the
InfiniBand devices allowed where the host has them), its environment file (NCCL and gloo
interfaces, never the unit), and no warm-up."""

from __future__ import annotations

from typing import Any

import pytest
from pyinfra.api.inventory import Inventory

from sglang_fleet import hostconfig
from sglang_fleet.config.render import Launch, render_all
from sglang_fleet.facts.infiniband import parse
from sglang_fleet.hostconfig import groups
from sglang_fleet.stages.service import deploy as service
from sglang_fleet.stages.service import group_unit
from sglang_fleet.stages.warmup import deploy as warmup
from tests.conftest import FIELD_PROFILE
from tests.fakes import RELEASE, Host, commands
from tests.unit.test_hostile import directives, render_template

TP16 = {"sglang_profile": str(FIELD_PROFILE), "gpu_count": 8, "sglang.parallel.tp": 16,
        "sglang.parallel.nnodes": 2}
IB = ["/dev/infiniband/rdma_cm", "/dev/infiniband/uverbs0", "/dev/infiniband/uverbs1"]


def inventory(**data: Any) -> Inventory:
    return Inventory(  # type: ignore[no-untyped-call]
        ([("b200-01", {"sglang_group": "g", "sglang_address": "10.0.0.11"}),
          ("b200-02", {"sglang_group": "g", "sglang_address": "10.0.0.12"}),
          ("b200-03", {"sglang.parallel.tp": 1, "sglang.parallel.nnodes": 1,
                       "sglang_address": "10.0.0.13"})], {}),
        b200=(["b200-01", "b200-02", "b200-03"], {**TP16, **data}))


def on(monkeypatch: pytest.MonkeyPatch, inv: Inventory, name: str,
       infiniband: list[str] | None = None) -> Host:
    """The fake host in the deploy's place: the inventory host's name, data and inventory,
    facts from the test."""
    real = inv.get_host(name)
    fake = Host({"InfinibandDevices": IB if infiniband is None else infiniband,
                 "SystemdVersion": 252})
    fake.name, fake.print_prefix = real.name, f"[{real.name}] "
    fake.data, fake.groups, fake.inventory = real.data, real.groups, real.inventory  # type: ignore[attr-defined]
    for module in (service, group_unit, warmup):
        monkeypatch.setattr(module, "host", fake)
    return fake


def launch_of(host: Host) -> Launch:
    prof = hostconfig.profile_for(host)  # type: ignore[arg-type]
    return render_all(prof, rank=groups.rank_for(host, prof))[0]  # type: ignore[arg-type]


def unit_of(host: Host) -> str:
    launch = launch_of(host)
    values = service.unit_file(hostconfig.profile_for(host), launch, RELEASE)  # type: ignore[arg-type]
    return render_template("sglang.service.j2", **{k: v for k, v in values.items()
                                                   if k not in ("src", "dest", "mode")})


def test_the_unit_allow_list_includes_every_member(monkeypatch: pytest.MonkeyPatch) -> None:
    inv = inventory(sglang_allowed_clients=["192.0.2.0/24"])
    unit = unit_of(on(monkeypatch, inv, "b200-02"))
    allow = [line for line in unit.splitlines() if line.startswith("IPAddressAllow=")]
    assert allow == ["IPAddressAllow=localhost 192.0.2.0/24",
                     "IPAddressAllow=10.0.0.11/32 10.0.0.12/32"]
    assert "IPAddressDeny=any" in unit
    assert "--node-rank 1 --dist-init-addr 10.0.0.11:20000" in unit


def test_a_server_on_one_host_gets_neither_peers_nor_infiniband(
        monkeypatch: pytest.MonkeyPatch) -> None:
    inv = inventory(sglang_allowed_clients=["192.0.2.0/24"])
    unit = unit_of(on(monkeypatch, inv, "b200-03"))
    assert [line for line in unit.splitlines() if line.startswith("IPAddressAllow=")] == \
        ["IPAddressAllow=localhost 192.0.2.0/24"]
    assert not any(line.startswith("DeviceAllow=/dev/infiniband") for line in unit.splitlines())


def test_without_an_allow_list_no_peers_are_needed(monkeypatch: pytest.MonkeyPatch) -> None:
    unit = unit_of(on(monkeypatch, inventory(), "b200-01"))
    assert "IPAddressAllow" not in unit and "IPAddressDeny" not in unit


def test_infiniband_devices_are_allowed_only_where_present(
        monkeypatch: pytest.MonkeyPatch) -> None:
    with_ib = unit_of(on(monkeypatch, inventory(), "b200-01"))
    assert [line for line in with_ib.splitlines() if "/dev/infiniband" in line
            and not line.startswith("#")] == [f"DeviceAllow={d} rw" for d in IB]
    assert "DevicePolicy=closed" in with_ib
    without = unit_of(on(monkeypatch, inventory(), "b200-01", infiniband=[]))
    assert directives(with_ib).count("DeviceAllow") == \
        directives(without).count("DeviceAllow") + len(IB)
    assert not any(line.startswith("DeviceAllow=/dev/infiniband") for line in
                   without.splitlines())


def test_the_infiniband_fact_keeps_kernel_device_names_only() -> None:
    assert parse(["uverbs1", "rdma_cm", "uverbs0", "umad0", "issm0"]) == [
        "/dev/infiniband/issm0", "/dev/infiniband/rdma_cm", "/dev/infiniband/umad0",
        "/dev/infiniband/uverbs0", "/dev/infiniband/uverbs1"]
    assert parse(["../sda", "x y", "uverbs0 rw\nDeviceAllow=/dev/sda", "", "UVERBS0",
                  "$(id)"]) == []


def test_nccl_and_gloo_go_to_the_environment_file_never_the_unit(
        monkeypatch: pytest.MonkeyPatch) -> None:
    inv = inventory(nccl_socket_ifname="^docker,lo", gloo_socket_ifname="ens1f0",
                    nccl_ib_hca="mlx5_0:1,mlx5_1", env=None)
    host = on(monkeypatch, inv, "b200-02")
    cfg = hostconfig.of(host)  # type: ignore[arg-type]
    text = service.environment(launch_of(host), {}, cfg.network_env)
    assert "NCCL_SOCKET_IFNAME='^docker,lo'\n" in text
    assert "GLOO_SOCKET_IFNAME='ens1f0'\n" in text and "NCCL_IB_HCA='mlx5_0:1,mlx5_1'\n" in text
    assert "SOCKET_IFNAME" not in unit_of(host) and "IB_HCA" not in unit_of(host)


def test_a_member_is_not_warmed_apart(monkeypatch: pytest.MonkeyPatch) -> None:
    host = on(monkeypatch, inventory(), "b200-02")
    assert commands(warmup.caches_warmed, hostconfig.profile_for(host),  # type: ignore[arg-type]
                    launch_of(host), RELEASE, 1800) == []
    assert "one rank of a multi-node server" in host.noops[0]


def test_a_member_loads_its_ports_table_as_it_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    """Its rendezvous to the members alone, per port: the unit-wide allow-list lets every
    allowed client reach every port (issue 44)."""
    inv = inventory(sglang_allowed_clients=["192.0.2.0/24"])
    host = on(monkeypatch, inv, "b200-02")
    unit = unit_of(host)
    name = "sglang_fleet_sglang_10_0_0_12"
    assert "ExecStartPre=+/usr/sbin/nft -f /etc/sglang/sglang.nft" in unit.splitlines()
    assert f"ExecStopPost=-+/usr/sbin/nft delete table inet {name}" in unit.splitlines()
    rules = service.firewall(hostconfig.profile_for(host), launch_of(host))  # type: ignore[arg-type]
    assert rules is not None and f"table inet {name} {{" in rules
    assert "elements = { 127.0.0.1/32, 10.0.0.12/32, 10.0.0.11/32 }" in rules
    assert "tcp dport { 20000 } ip saddr != @peers4 drop" in rules
    # a server on one host, over HTTP, without DP attention: no table, no nft
    alone = on(monkeypatch, inv, "b200-03")
    assert service.firewall(hostconfig.profile_for(alone), launch_of(alone)) is None  # type: ignore[arg-type]
    assert "nft" not in unit_of(alone)
