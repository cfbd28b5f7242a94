"""Multi-node groups, declared in the inventory: the hosts whose data says ``sglang_group =
"NAME"`` run one server together (``parallel.nnodes`` of them), their inventory order their
ranks. Rank 0's address is the rendezvous (``--dist-init-addr``), and rank 0 alone answers the
API: the routers take its URL only (``is_worker``).

    # inventories/b200.py
    hosts = [("b200-01", {"sglang_group": "tp16-a"}),     # rank 0
             ("b200-02", {"sglang_group": "tp16-a"})]     # rank 1

A deploy sees the whole inventory (``--limit`` runs fewer hosts but keeps them all in it), so
every member derives the same ranks.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from typing import Any

from pyinfra.api.host import Host

from sglang_fleet.config import keys
from sglang_fleet.config.multinode import GROUP_KEY, Rank, same_launch
from sglang_fleet.config.profile import Profile
from sglang_fleet.config.render import render
from sglang_fleet.errors import InputError, Problem
from sglang_fleet.hostconfig.access import is_serving, lenient, of
from sglang_fleet.hostconfig.keys import ROUTERS_GROUP
from sglang_fleet.hostconfig.serving import PROFILE_KEY, declared_profile
from sglang_fleet.ops.unitfile import UnsafeValue, networks


def _inventory(host: Host) -> Iterable[Host]:
    return getattr(host, "inventory", None) or [host]


def _group_of(host: Host) -> str | None:
    # A peer's other data problems are its own to say (its run, or ``of`` when it is read).
    return lenient(host)[0].sglang_group


def group_hosts(host: Host) -> list[Host]:
    """The hosts of ``host``'s group in rank (inventory) order; none when it has no group."""
    name = of(host).sglang_group
    return [h for h in _inventory(host) if _group_of(h) == name] if name else []


def rank_of(host: Host) -> int | None:
    """``host``'s rank in its group (None: no group)."""
    names = [h.name for h in group_hosts(host)]
    return names.index(host.name) if host.name in names else None


def is_worker(host: Host) -> bool:
    """Whether the routers take ``host``'s servers: not a rank >= 1 of a group, whose server
    answers 200 on /health and 404 on every API path (SGLang's dummy health server)."""
    return (rank_of(host) or 0) == 0


def rank0(host: Host) -> Host | None:
    """The rank 0 of ``host``'s group (None: no group)."""
    members = group_hosts(host)
    return members[0] if members else None


def units_of(hosts: Iterable[Host]) -> list[list[Host]]:
    """``hosts`` as the units a roll or a teardown moves: each group whole (in rank order,
    where its rank 0 comes), every other host alone."""
    found: list[list[Host]] = []
    by_group: dict[str, list[Host]] = {}
    for host in hosts:
        name = _group_of(host)
        if not name:
            found.append([host])
        elif name in by_group:
            by_group[name].append(host)
        else:
            by_group[name] = [host]
            found.append(by_group[name])
    return found


def partial_groups(selected: Iterable[str], hosts: Iterable[Host], what: str) -> list[Problem]:
    """A problem for each group ``selected`` (host names: a ``--limit``) takes only part of:
    its members restart, stop and gate together, so a run over some of them would leave the
    others without their rank 0 or their peers."""
    chosen = set(selected)
    problems = []
    for unit in units_of(hosts):
        names = [h.name for h in unit]
        left_out = [n for n in names if n not in chosen]
        if _group_of(unit[0]) and left_out and len(left_out) < len(names):
            problems.append(Problem(
                what, GROUP_KEY, f"it takes part of group {_group_of(unit[0])!r} (members, rank "
                f"0 first: {', '.join(names)}): {', '.join(left_out)} left out",
                f"take every member of the group ({','.join(names)}) or none of them"))
    return problems


# Keys each member sets for itself: the servers a host sizes, and the address its own HTTP
# server listens on (hosts bound to their own address: only --host differs, see same_launch).
OWN_KEYS = ("parallel.instances", "server.host")


def _differences(first: Profile, other: Profile) -> list[str]:
    theirs = {spec.name: value for spec, value in keys.values(first)}
    return [f"{spec.name} {value!r} (rank 0: {theirs[spec.name]!r})"
            for spec, value in keys.values(other)
            if spec.name not in OWN_KEYS and value != theirs[spec.name]]


def _membership(host: Host, nnodes: int) -> list[Host]:
    """The group's hosts, checked: as many as the profile's nnodes, each serving."""
    cfg = of(host)
    if not cfg.sglang_group:
        if nnodes == 1:
            return []
        raise InputError.one(cfg.source, GROUP_KEY,
                             f"parallel.nnodes is {nnodes}: {host.name} serves one rank of a "
                             f"server over {nnodes} hosts, but has no group",
                             f"set {GROUP_KEY} = 'NAME' in the host data of the {nnodes} hosts "
                             "of the server, rank 0 first in the inventory (its address is the "
                             "rendezvous), or set parallel.nnodes: 1")
    members = group_hosts(host)
    names = ", ".join(h.name for h in members)
    problems = [Problem(f"pyinfra data of {h.name}", PROFILE_KEY,
                        f"{h.name} is in {GROUP_KEY} {cfg.sglang_group!r} but serves no profile",
                        f"give it the group's sglang_profile, or remove its {GROUP_KEY}")
                for h in members if not is_serving(h)]
    if len(members) != nnodes:
        problems.append(Problem(cfg.source, GROUP_KEY,
                                f"group {cfg.sglang_group!r} has {len(members)} host(s) "
                                f"({names}), parallel.nnodes is {nnodes}",
                                f"put exactly {nnodes} hosts in {GROUP_KEY} "
                                f"{cfg.sglang_group!r}, or set parallel.nnodes: {len(members)}"))
    InputError.raise_any(problems)
    return members


def _member_launch(prof: Profile, rank: Rank) -> tuple[str, ...]:
    """What a member renders, sized as every member is (one server: its share of the GPUs)."""
    sized = prof.for_gpus(prof.parallel.gpus_per_instance, "a member")
    return render(sized, rank=rank).argv


def rank_for(host: Host, prof: Profile) -> Rank | None:
    """``host``'s rank in its group and rank 0's address, for ``render``; None for a server on
    one host. InputError when the group is not one server (missing, another size, members'
    profiles or launches differ)."""
    nnodes = prof.parallel.nnodes
    members = _membership(host, nnodes)
    if nnodes == 1:
        return None
    first = members[0]
    group = of(host).sglang_group
    base = declared_profile(first)
    problems = []
    for member in members[1:]:
        differs = _differences(base, declared_profile(member))
        if differs:
            problems.append(Problem(
                f"pyinfra data of {member.name}", PROFILE_KEY,
                f"{member.name} serves another profile than {first.name}, rank 0 of group "
                f"{group!r}: {'; '.join(differs[:3])}",
                "give every host of the group the same sglang_profile and overrides: they run "
                "one server"))
    InputError.raise_any(problems)
    address = of(first).address
    problems = same_launch({m.name: _member_launch(declared_profile(m), Rank(i, address))
                            for i, m in enumerate(members)}, first.name)
    InputError.raise_any(problems)
    return Rank([m.name for m in members].index(host.name), address)


def peer_networks(host: Host) -> list[str]:
    """Every member's address for the unit's ``IPAddressAllow=`` (its own too: rank 0 reaches
    its rendezvous at its address, not ``localhost``); InputError for a name."""
    found: list[str] = []
    problems = []
    for member in group_hosts(host):
        address = of(member).address
        try:
            found += networks([address])
        except UnsafeValue:
            problems.append(Problem(
                f"pyinfra data of {member.name}", "sglang_address",
                f"{address!r} is not an IP address: {host.name}'s unit lets its group's "
                "members in by address (sglang_allowed_clients is set)",
                f"set sglang_address = 'IP' for {member.name} (where the group's members reach "
                "it)"))
    InputError.raise_any(problems)
    return found


def router_networks(worker: Host) -> list[str]:
    """Who may use a gRPC-mode worker's port: each ``routers`` host's address, or without that
    group (routers run elsewhere) ``sglang_allowed_clients``; InputError for a name."""
    inventory = getattr(worker, "inventory", None)
    group = (inventory.get_group(ROUTERS_GROUP, None) if inventory else None) or []
    if not group:
        return list(of(worker).sglang_allowed_clients)
    found, problems = [], []
    for router in group:
        try:
            found.append(str(ipaddress.ip_address(of(router).address)))
        except ValueError:
            problems.append(Problem(
                f"pyinfra data of {router.name}", "sglang_address",
                f"{of(router).address!r} is not an IP address: {worker.name}'s gRPC port lets "
                "the routers in by address",
                f"set sglang_address = 'IP' for {router.name} (where the workers see its "
                "requests come from)"))
    InputError.raise_any(problems)
    return found


def describe(host: Host) -> dict[str, Any] | None:
    """``{"group": NAME, "rank": R, "size": N, "rank0": HOST}`` for status (None: no group)."""
    members = group_hosts(host)
    if not members:
        return None
    return {"group": of(host).sglang_group, "rank": rank_of(host), "size": len(members),
            "rank0": members[0].name}
