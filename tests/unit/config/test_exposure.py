"""Who reaches a server's own ports (config/exposure.py): the nftables table each unit loads, the
peer list SGLang checks, and the refusals before any change (issue 44's review: pickle ports
open to every local user and allowed network, gRPC workers with no key)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from sglang_fleet.config import exposure
from sglang_fleet.config.multinode import Rank
from sglang_fleet.config.profile import load
from sglang_fleet.config.render import Launch, render_all

PROFILE = "qwen3.6-27b-mtp"


def launch(version: str = "0.5.23", **args: Any) -> Launch:
    return Launch(version, (), {}, args={"port": 30000, "host": "0.0.0.0", **args})


GROUP: dict[str, Any] = {"nnodes": 2, "dist_init_addr": "10.0.0.11:20000"}
DP: dict[str, Any] = {"enable_dp_attention": True, "dp_size": 8}


def test_a_server_on_one_host_without_dp_attention_opens_no_port_of_its_own() -> None:
    assert exposure.member_ports(launch()) == []
    assert exposure.rules(launch(), [], [], "10.0.0.11", "0.0.0.0", grpc=False) is None


def test_dp_attention_on_one_host_keeps_sglangs_loopback_ports_to_the_service_user() -> None:
    # 0.5.23 server_args.py PortArgs.init_new: 127.0.0.1:port+233 and the six ports after it;
    # the worker-port handshake on --host:port+13.
    assert exposure.member_ports(launch(**DP)) == [
        ([30233, 30234, 30235, 30236, 30237, 30238, 30239], "127.0.0.1"), ([30013], "0.0.0.0")]
    text = exposure.rules(launch(**DP), [], [], "10.0.0.11", "0.0.0.0", grpc=False)
    assert text is not None
    assert ("ip daddr 127.0.0.1 tcp dport { 30233, 30234, 30235, 30236, 30237, 30238, 30239 } "
            "ip saddr != @peers4 drop") in text
    assert 'meta skuid != "sglang" reject with tcp reset' in text


def test_past_65535_sglang_counts_down() -> None:
    assert exposure.init_port(launch(port=65400, **DP)) == 65400 - 233


def test_a_group_member_keeps_the_store_and_sockets_to_its_members_on_every_address() -> None:
    text = exposure.rules(launch(**GROUP, **DP), ["10.0.0.11/32", "10.0.0.12/32"], [],
                          "10.0.0.12", "0.0.0.0", grpc=False)
    assert text is not None
    # the host's own address first: rank 1 reaches a socket on it from itself too
    assert "elements = { 127.0.0.1/32, 10.0.0.12/32, 10.0.0.11/32 }" in text
    ports = "{ 20000, 20001, 20002, 20003, 20004, 20005, 20006, 20013 }"
    assert f"        tcp dport {ports} ip saddr != @peers4 drop" in text
    assert f"ip daddr @peers4 tcp dport {ports} meta skuid" in text
    # without DP attention, only the rendezvous
    plain = exposure.rules(launch(**GROUP), ["10.0.0.11/32"], [], "10.0.0.12", "", grpc=False)
    assert plain is not None and "tcp dport { 20000 } ip saddr" in plain


def test_the_grpc_port_is_the_routers_alone_where_the_server_listens() -> None:
    text = exposure.rules(launch(host="10.0.0.11"), [], ["10.0.0.5"], "10.0.0.11", "10.0.0.11",
                          grpc=True)
    assert text is not None
    # the router, and the host itself: the gate asks on the address the server listens on
    assert "set routers4 { type ipv4_addr; flags interval; elements = { 127.0.0.1/32, " \
           "10.0.0.11/32, 10.0.0.5/32 }; }" in text
    assert "ip daddr 10.0.0.11 tcp dport 30000 ip saddr != @routers4 drop" in text
    assert "peers4 drop" not in text


def test_a_server_bound_to_a_name_is_guarded_on_every_address() -> None:
    """``server.host`` may be a host name (the server resolves it): no address to match on."""
    text = exposure.rules(launch(host="b200-01.example", **DP), [], [], "b200-01.example",
                          "b200-01.example", grpc=True)
    assert text is not None
    assert "        tcp dport 30000 ip saddr != @routers4 drop" in text
    assert "        tcp dport { 30013 } ip saddr != @peers4 drop" in text
    assert "elements = { 127.0.0.1/32 }" in text  # no name in a set


def test_the_table_is_named_for_the_unit_and_the_host_and_replaced_whole() -> None:
    text = exposure.rules(launch(**DP), [], [], "b200-01.example", "0.0.0.0", grpc=False)
    assert text is not None
    name = "sglang_fleet_sglang_b200_01_example"
    # nft -f is one transaction: declare, delete, define (no rule of the old table survives)
    assert text.splitlines()[1:4] == [f"table inet {name} {{}}", f"delete table inet {name}",
                                      f"table inet {name} {{"]
    assert exposure.unit_lines("sglang.service", "b200-01.example") == [
        "ExecStartPre=+/usr/sbin/nft -f /etc/sglang/sglang.nft",
        f"ExecStopPost=-+/usr/sbin/nft delete table inet {name}"]


@pytest.mark.parametrize("case", [
    dict(args=DP, peers=[], routers=[], bind="0.0.0.0", grpc=False),
    dict(args={**GROUP, **DP}, peers=["10.0.0.11/32", "fd00::2/128"], routers=[], bind="",
         grpc=False),
    dict(args={"host": "127.0.0.11"}, peers=[], routers=["127.0.0.12"], bind="127.0.0.11",
         grpc=True),
    dict(args={"host": "::"}, peers=[], routers=["fd00::5"], bind="::", grpc=True),
])
def test_nft_takes_every_table(case: dict[str, Any], tmp_path: Path) -> None:
    """The kernel's own parser, in check mode (nothing loaded): needs nft and root."""
    nft = shutil.which("nft") or "/usr/sbin/nft"
    text = exposure.rules(launch(**case["args"]), case["peers"], case["routers"], "10.0.0.11",
                          case["bind"], grpc=case["grpc"], user="root")
    assert text is not None
    path = tmp_path / "t.nft"
    path.write_text(text)
    if not Path(nft).exists():
        pytest.fail("nft is missing: apt-get install nftables (.ci/run installs it)")
    done = subprocess.run([nft, "-c", "-f", str(path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr + text


def test_zmq_peers_where_the_release_has_them() -> None:
    group = launch(**GROUP, **DP)
    assert exposure.zmq_peers(group, ["10.0.0.11/32", "10.0.0.12/32"]) == {
        "SGLANG_ZMQ_ALLOWED_PEERS": "127.0.0.1,10.0.0.11,10.0.0.12"}
    assert exposure.zmq_peers(launch(**DP), []) == {"SGLANG_ZMQ_ALLOWED_PEERS": "127.0.0.1"}
    assert exposure.zmq_peers(launch("0.5.22", **GROUP, **DP), ["10.0.0.11/32"]) == {}
    assert exposure.zmq_peers(launch(**GROUP), ["10.0.0.11/32"]) == {}


def problems(launches: list[Launch], allowed: tuple[str, ...] = (), trusted: tuple[str, ...] = (),
             users: tuple[str, ...] = (), grpc: bool = False) -> list[str]:
    profile = load(PROFILE, {"server.router_connection": "grpc",
                             "server.api_key_secret": None} if grpc else {})
    found = exposure.problems(profile, launches, allowed, trusted, list(users), "data of h")
    return [f"{p.key}: {p.message} | {p.fix}" for p in found]


def test_a_multi_node_group_needs_an_allow_list() -> None:
    profile = load(PROFILE, {"parallel.nnodes": 2, "parallel.tp": 16}).for_gpus(8, "a host")
    member = render_all(profile, rank=Rank(1, "10.0.0.11"))
    [found] = problems(member)
    assert found.startswith("sglang_allowed_clients: the servers are one multi-node group")
    assert problems(member, allowed=("10.0.0.0/24",)) == []


def test_dp_attention_across_hosts_needs_sglangs_peer_check() -> None:
    [found] = problems([launch("0.5.22", **GROUP, **DP)], allowed=("10.0.0.0/24",))
    assert found.startswith("engine.version: DP attention across hosts")
    assert "pin SGLang 0.5.23 or later" in found
    assert problems([launch(**GROUP, **DP)], allowed=("10.0.0.0/24",)) == []


def test_people_on_the_host_must_be_named_for_what_loopback_cannot_keep_from_them() -> None:
    [found] = problems([launch(**DP)], users=("alice", "bob"), trusted=("bob",))
    assert found.startswith("sglang_trusted_local_users: alice log in to this host")
    assert "sglang_trusted_local_users = ['alice']" in found
    assert problems([launch(**DP)], users=("alice",), trusted=("alice",)) == []
    [grpc] = problems([launch()], users=("alice",), grpc=True)
    assert "the gRPC port, which checks no key" in grpc
    assert problems([launch()], users=("alice",)) == []  # plain HTTP: its key guards it
