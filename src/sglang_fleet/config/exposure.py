"""Who reaches a server's ports besides the one its clients use: the rendezvous and the
inter-process sockets of DP attention and of multi-node groups, which unpickle what arrives, and
the gRPC servicer's port, which checks no key. The unit's ``IPAddressAllow=`` is unit-wide (every
allowed client reaches every port), so each of these ports gets its own rule: an nftables table
per unit, loaded as the unit starts and deleted as it stops (``ExecStartPre=+``,
``ExecStopPost=+``), so no rule outlives its server.

- Inter-process ports: the group's members alone (and this host's loopback), and on any of
  those addresses only the service user's connections (an ``output`` rule on ``meta skuid``:
  another local user of a member host has a member's address too).
- The gRPC port: the routers alone (the inventory's ``routers`` hosts, else
  ``sglang_allowed_clients``), and the host itself (the gate, and status over SSH, ask here).
  Local users other than the operators are kept out by refusal (``problems``).

SGLang's layout with DP attention, read in 0.5.23 ``srt/server_args.py`` PortArgs.init_new:
on one host the init address is ``127.0.0.1:port+233`` (``ZMQ_TCP_PORT_DELTA``; ``port-233``
past 65535), across hosts ``--dist-init-addr``; the ZMQ sockets take ``port_base`` =
dist + 1 and the five after it (tokenizer, detokenizer, rpc, metrics, scheduler input, load
collector). torch's TCPStore listens on the init port on every address. The DP controller's
worker sockets take random ports: only SGLang's own peer check (``SGLANG_ZMQ_ALLOWED_PEERS``,
0.5.23 ``utils/network.py`` restrict_zmq_peers) guards those, so it is set wherever the release
has it, and DP attention across hosts is refused where it has not.

    rules(launch, peers=["10.0.0.11", "10.0.0.12"], routers=[], bind="0.0.0.0")
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable

from sglang_fleet import paths
from sglang_fleet.config import connection
from sglang_fleet.config.profile import Profile
from sglang_fleet.config.releases import at_least
from sglang_fleet.config.render import Launch
from sglang_fleet.errors import InputError, Problem

ZMQ_TCP_PORT_DELTA = 233  # 0.5.23 srt/server_args.py ZMQ_TCP_PORT_DELTA
ZMQ_PORTS = 6  # port_base .. port_base + 5 (NUM_DERIVED_PORTS without the Rust server)
HANDSHAKE_DELTA = 13  # DP_ATTENTION_HANDSHAKE_PORT_DELTA (managers/data_parallel_controller.py)
MAX_PORT = 65535
# The first release with SGLANG_ZMQ_ALLOWED_PEERS (environ.py; utils/network.py).
ZMQ_PEERS_FROM = "0.5.23"
ZMQ_PEERS_VAR = "SGLANG_ZMQ_ALLOWED_PEERS"
LOOPBACK = ("127.0.0.1", "::1")
NFT = "/usr/sbin/nft"
PACKAGE = "nftables"
WILDCARD = ("0.0.0.0", "::", "")


def dp_attention(launch: Launch) -> bool:
    """Whether the launch runs attention data parallel (SGLang's TCP inter-process sockets)."""
    args = launch.args
    return bool(args.get("enable_dp_attention")) or int(args.get("attn_dp_size") or 1) > 1


def spans_hosts(launch: Launch) -> bool:
    """Whether ``launch`` is one rank of a server over several hosts."""
    return int(launch.args.get("nnodes") or 1) > 1


def init_port(launch: Launch) -> int:
    """The rendezvous port: ``--dist-init-addr``'s, or on one host with DP attention SGLang's
    own ``port + 233`` (``port - 233`` when that passes 65535)."""
    given = launch.args.get("dist_init_addr")
    if given:
        return int(str(given).rpartition(":")[2])
    derived = launch.port + ZMQ_TCP_PORT_DELTA
    return derived if derived <= MAX_PORT else launch.port - ZMQ_TCP_PORT_DELTA


def member_ports(launch: Launch) -> list[tuple[list[int], str]]:
    """The ports only the server's own processes (its group's members) may reach, each list
    with the address it is bound on ("" for every address): the rendezvous, with DP attention
    the ZMQ ports after it and the worker-port handshake (``port + 13`` on one host, on
    ``--host``; the init port + 13 across hosts); none for a server on one host without DP
    attention (its processes talk over Unix sockets).

        >>> member_ports(Launch("0.5.23", (), {}, args={"port": 30000, "host": "0.0.0.0",
        ...                                             "enable_dp_attention": True}))
        [([30233, 30234, 30235, 30236, 30237, 30238, 30239], '127.0.0.1'), ([30013], '0.0.0.0')]
    """
    if not (spans_hosts(launch) or dp_attention(launch)):
        return []
    dist = init_port(launch)
    if not dp_attention(launch):
        return [([dist], "")]
    base = dist + 1 if dist + 1 + ZMQ_PORTS <= MAX_PORT else dist - ZMQ_PORTS - 1
    ports = [dist, *range(base, base + ZMQ_PORTS)]
    if spans_hosts(launch):  # the store on every address, the sockets on the init address
        return [([*ports, dist + HANDSHAKE_DELTA], "")]
    return [(ports, LOOPBACK[0]),
            ([launch.port + HANDSHAKE_DELTA], str(launch.args.get("host") or LOOPBACK[0]))]


def zmq_peers(launch: Launch, peers: Iterable[str]) -> dict[str, str]:
    """``SGLANG_ZMQ_ALLOWED_PEERS`` for a DP-attention server on a release that has it: the
    group's members' addresses (IP addresses, as SGLang parses them), or loopback on one
    host; nothing otherwise."""
    if not dp_attention(launch) or not at_least(launch.version, ZMQ_PEERS_FROM):
        return {}
    found = list(peers) if spans_hosts(launch) else []
    addresses = [str(ipaddress.ip_network(p, strict=False).network_address) for p in found]
    return {ZMQ_PEERS_VAR: ",".join(dict.fromkeys([*LOOPBACK[:1], *addresses]))}


def problems(profile: Profile, launches: list[Launch], allowed_clients: tuple[str, ...],
             trusted: tuple[str, ...], login_users: list[str], source: str) -> list[Problem]:
    """What keeps a host's servers from being exposed only to whom they serve, before any
    change: a multi-node group without an allow-list (its members' ports would be open to
    all), DP attention across hosts on a release without SGLang's peer check (its random
    worker ports would be), and on a host that people log in to, the ports loopback cannot
    keep from them (DP attention's worker sockets, the gRPC port) unless each is trusted by
    name (``sglang_trusted_local_users``)."""
    found = []
    first = launches[0]
    if spans_hosts(first) and not allowed_clients:
        found.append(Problem(source, "sglang_allowed_clients",
                             "the servers are one multi-node group, whose members reach one "
                             "another's rendezvous and inter-process ports: without an "
                             "allow-list the unit lets every address in",
                             "set sglang_allowed_clients to the router's and the operators' "
                             "networks, e.g. ['10.0.0.0/24'] (the members are let in by "
                             "address)"))
    if spans_hosts(first) and dp_attention(first) and not at_least(first.version, ZMQ_PEERS_FROM):
        found.append(Problem(profile.source_of("engine.version"), "engine.version",
                             f"DP attention across hosts opens SGLang's inter-process sockets on "
                             f"random ports, which SGLang {first.version} lets any address use "
                             f"(it has no {ZMQ_PEERS_VAR})",
                             f"pin SGLang {ZMQ_PEERS_FROM} or later, or run DP attention on one "
                             "host"))
    why = ("DP attention's worker sockets (random ports on loopback)" if dp_attention(first)
           else "the gRPC port, which checks no key" if connection.grpc(profile) else "")
    strangers = [user for user in login_users if user not in trusted]
    if why and strangers:
        found.append(Problem(source, "sglang_trusted_local_users",
                             f"{', '.join(strangers[:5])} log in to this host and would reach "
                             f"{why}, which no rule here can keep from a local user",
                             f"serve from a host they do not log in to, or accept it by naming "
                             f"them: sglang_trusted_local_users = {strangers[:5]!r}"))
    return found


def require(profile: Profile, launches: list[Launch], allowed_clients: tuple[str, ...],
            trusted: tuple[str, ...], login_users: list[str], source: str) -> None:
    """``problems``, raising InputError when there are any."""
    InputError.raise_any(problems(profile, launches, allowed_clients, trusted, login_users,
                                  source))


def table(unit: str, address: str) -> str:
    """The unit's nftables table: named after the unit and the address the host is reached at,
    so two hosts that share a network namespace (containers) keep theirs apart.

        >>> table("sglang-0.service", "10.0.0.11")
        'sglang_fleet_sglang_0_10_0_0_11'
    """
    stem = f"{unit.removesuffix('.service')}_{address}"
    return "sglang_fleet_" + re.sub(r"[^A-Za-z0-9]+", "_", stem).strip("_")


def rules_path(unit: str) -> str:
    """Where a unit's nftables table is kept (root's, read by ``nft`` as the unit starts)."""
    return f"{paths.SECRETS}/{unit.removesuffix('.service')}.nft"


def _split(networks: Iterable[str]) -> tuple[list[str], list[str]]:
    found = [ipaddress.ip_network(n, strict=False) for n in networks]
    unique = list(dict.fromkeys(found))
    return ([str(n) for n in unique if n.version == 4], [str(n) for n in unique if n.version == 6])


def _set(name: str, kind: str, elements: list[str]) -> list[str]:
    body = f"; elements = {{ {', '.join(elements)} }}" if elements else ""
    return [f"    set {name} {{ type {kind}; flags interval{body}; }}"]


def _ports(ports: list[int]) -> str:
    return "{ " + ", ".join(str(p) for p in ports) + " }"


def _ip(text: str) -> str | None:
    """``text`` as an IP address, or None (a host name, the wildcard)."""
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        return None


def _guard(ports: str, bind: str, set4: str, set6: str) -> list[str]:
    """Input rules dropping what reaches ``ports`` from outside the sets: on the one address the
    server listens on, or, listening on every address (or on a name, resolved by the server),
    on all of them."""
    where = _ip(bind) if bind not in WILDCARD else None
    if where is None:
        return [f"        tcp dport {ports} ip saddr != @{set4} drop",
                f"        tcp dport {ports} ip6 saddr != @{set6} drop"]
    if ipaddress.ip_address(where).version == 4:
        return [f"        ip daddr {where} tcp dport {ports} ip saddr != @{set4} drop"]
    return [f"        ip6 daddr {where} tcp dport {ports} ip6 saddr != @{set6} drop"]


def guarded(launch: Launch, grpc: bool) -> bool:
    """Whether the launch opens a port beyond its clients' one (and so has a table)."""
    return grpc or bool(member_ports(launch))


def rules(launch: Launch, peers: list[str], routers: list[str], address: str, bind: str,
          grpc: bool, user: str = paths.USER) -> str | None:
    """The unit's nftables table, or None when it opens no port beyond its clients' one.

    + peers: the group's members' addresses (a server on one host: none)
    + routers: who may use the gRPC port (``grpc``)
    + address: the host's address (the table's name)
    + bind: the address the server listens on (``server.host``)
    """
    if not guarded(launch, grpc):
        return None
    member = member_ports(launch)
    name = table(launch.unit, address)
    # The host itself, by loopback and by its own addresses: the gate and status ask from it,
    # and SGLang's own processes reach a socket on the address it is bound to from there.
    own = [*LOOPBACK, *(a for a in (_ip(address), _ip(bind)) if a and a not in WILDCARD)]
    v4, v6 = _split([*own, *peers])
    r4, r6 = _split([*own, *routers])
    lines = [f"# Managed by sglang-fleet: who reaches {launch.unit}'s own ports.",
             f"table inet {name} {{}}", f"delete table inet {name}", f"table inet {name} {{"]
    lines += _set("peers4", "ipv4_addr", v4) + _set("peers6", "ipv6_addr", v6)
    lines += _set("routers4", "ipv4_addr", r4) + _set("routers6", "ipv6_addr", r6)
    accept = ["    chain input {", "        type filter hook input priority filter; "
              "policy accept;"]
    out = ["    chain output {", "        type filter hook output priority filter; "
           "policy accept;"]
    if member:
        for ports, where in member:
            accept += _guard(_ports(ports), where, "peers4", "peers6")
        every = _ports(sorted({p for ports, _ in member for p in ports}))
        out += [f"        ip daddr @peers4 tcp dport {every} meta skuid != \"{user}\" "
                "reject with tcp reset",
                f"        ip6 daddr @peers6 tcp dport {every} meta skuid != \"{user}\" "
                "reject with tcp reset"]
    if grpc:
        accept += _guard(str(launch.port), bind, "routers4", "routers6")
    lines += [*accept, "    }", *out, "    }", "}"]
    return "\n".join(lines) + "\n"


def unit_lines(unit: str, address: str) -> list[str]:
    """The unit's lines that load its table before the server starts and delete it after the
    server has stopped (``+``: as root, outside the sandbox; ``-``: a table already gone is no
    failure)."""
    return [f"ExecStartPre=+{NFT} -f {rules_path(unit)}",
            f"ExecStopPost=-+{NFT} delete table inet {table(unit, address)}"]
