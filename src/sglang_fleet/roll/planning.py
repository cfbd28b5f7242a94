"""A roll's plan, made and checked before any host is touched: the inventory loaded as
pyinfra's CLI loads it (with ``--data``), every host's profile rendered and preflighted, the
batches in inventory order, the URLs each host serves at now and will serve at after, and the
routers.

    found = plan("inventories/b200.py", ["sglang.memory.max_running_requests=48"], batch=1)
    [[h.name for h in b] for b in found.batches]     # [['b200-01'], ['b200-02']]
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

from pyinfra.api.host import Host

from sglang_fleet import hostconfig
from sglang_fleet.config import validators
from sglang_fleet.errors import InputError, Problem
from sglang_fleet.fleet import inventory as fleet
from sglang_fleet.fleet.inventory import load, parse_data
from sglang_fleet.fleet.router_api import Router
from sglang_fleet.hostconfig import groups, preflight
from sglang_fleet.roll import scale


@dataclass
class Plan:
    """What a roll does, in order: which hosts, K at a time, from which URLs to which."""

    inventory: str
    data: list[str]
    batches: list[list[Host]]
    before: dict[str, list[str]]  # host -> worker URLs now (what the routers know)
    after: dict[str, list[str]]  # host -> worker URLs once converged with the roll's data
    routers: list[Router]
    # host -> unit -> the URLs a router may know it by (with the inventory; with --data)
    units: dict[str, dict[str, list[str]]] = field(default_factory=dict)
    batch_instances: int | None = None  # a host's servers restarted at a time (None: whole)
    # host -> the hosts that leave and come back with it (its group, or itself alone)
    unit_of: dict[str, list[str]] = field(default_factory=dict)
    done: list[str] = field(default_factory=list)  # converged by the roll this one resumes


def grouped(errors: dict[str, InputError]) -> InputError:
    """One error per distinct problem, naming every host that has it (a bad ``--data`` value
    is everyone's problem, not the first host's).

        grouped({"a": err_a, "b": err_b})   # "pyinfra data of a, b: sglang.x: ..."
    """
    hosts_of: dict[tuple[str, str, str, str], list[str]] = {}
    for name, err in errors.items():
        for p in err.problems:
            shared = (p.source.replace(name, "\0"), p.key.replace(name, "\0"),
                      p.message.replace(name, "\0"), p.fix.replace(name, "\0"))
            hosts_of.setdefault(shared, []).append(name)
    problems = []
    for (source, key, message, fix), names in hosts_of.items():
        listed = ", ".join(names)
        where = source.replace("\0", listed) if "\0" in source else \
            f"{source} ({'host' if len(names) == 1 else 'hosts'} {listed})"
        problems.append(Problem(where, key.replace("\0", listed),
                                message.replace("\0", listed), fix.replace("\0", listed)))
    return InputError(problems)


def data_warning(data: Sequence[str]) -> str | None:
    """What to say about ``--data``: it changes these hosts, not the inventory.

        data_warning(["sglang.memory.max_running_requests=48"])   # "warning: --data ..."
    """
    if not data:
        return None
    return (f"warning: --data {' '.join(data)} is applied to the hosts but is not in the "
            "inventory: the next plain deploy (deploys/sglang.py) reverts it; to keep it, put "
            "it in the inventory's host or group data")


def plan(inventory: str, data: Sequence[str], batch: int | str,
         batch_instances: int | None = None, done: Collection[str] = ()) -> Plan:
    """The roll of ``inventory`` with ``data``, ``batch`` units (a group, or a host alone) at
    a time (a count, or a percentage of the units to roll); the hosts in ``done`` (converged by
    the roll this one resumes) are not rolled again, but still counted as serving."""
    scale.amount("--batch", batch, 1)  # a bad value is refused before the inventory loads
    if batch_instances is not None and batch_instances < 1:
        raise InputError.one("--batch-instances", "",
                             f"must be at least 1, got {batch_instances}",
                             "a host's servers restarted at a time, e.g. --batch-instances 2, "
                             "or leave it out to restart a host's servers together")
    now, then = load(inventory, {}), load(inventory, parse_data(data))
    hosts = fleet.serving_hosts(then)
    if not hosts:
        raise InputError.one(inventory, "sglang_profile", "no serving hosts",
                             "give hosts a serving profile in their group data")
    after, units, errors = {}, {}, {}
    members: dict[str, list[str]] = {}  # a rank >= 1's units: it leaves with its rank 0's URLs
    for host in hosts:  # every host's change is checked before the first one is touched
        try:
            profile = hostconfig.profile_for(host)
            launches = preflight.launches(
                host, profile, preflight.Facts(gpu_count=hostconfig.gpu_count(host)))
            routed = fleet.routed_unit_urls(host, profile, launches)  # none on a rank >= 1
            after[host.name] = list(routed.values())
            units[host.name] = {unit: [url] for unit, url in routed.items()}
            if not groups.is_worker(host):
                members[host.name] = [launch.unit for launch in launches]
        except InputError as err:
            errors[host.name] = err
    if errors:
        raise grouped(errors)
    _fits(batch_instances, after)
    routers = fleet.routers(then)
    for router in routers:
        wrong = validators.url_problem(router.url, allow_http=True)
        if wrong:
            raise InputError.one(f"pyinfra data of {fleet.ROUTERS_GROUP}", "router_url", wrong,
                                 "set router_url = 'http://HOST:PORT' (or leave it out)")
    if not routers:
        raise InputError.one(inventory, fleet.ROUTERS_GROUP,
                             "no router: a roll takes hosts out of the router and puts them "
                             "back", "put the router hosts in a group 'routers' and run "
                             "deploys/router.py")
    before = {h.name: fleet.unit_urls(h) for h in fleet.serving_hosts(now)}
    for name, by_unit in before.items():
        for unit, url in by_unit.items():
            known = units.setdefault(name, {}).setdefault(unit, [])
            known[:0] = [url] if url not in known else []
    _leave_with_rank0(units, members, {h.name: h for h in hosts})
    whole = groups.units_of(hosts)  # each group one unit: never split across batches
    unit_of = {h.name: [m.name for m in unit] for unit in whole for h in unit}
    todo = [unit for unit in whole if not all(h.name in done for h in unit)]
    size = scale.amount("--batch", batch, len(whole))  # of the fleet, resumed or not
    return Plan(inventory=inventory, data=list(data),
                batches=[[h for unit in todo[i:i + size] for h in unit]
                         for i in range(0, len(todo), size)],
                before={name: list(by_unit.values()) for name, by_unit in before.items()},
                after=after,
                routers=[r.api() for r in routers], units=units,
                batch_instances=batch_instances, unit_of=unit_of,
                done=[n for n in unit_of if n in done])


def _leave_with_rank0(units: dict[str, dict[str, list[str]]], members: dict[str, list[str]],
                      hosts: dict[str, Host]) -> None:
    """A rank >= 1 of a group serves through its rank 0: when a member's first disruptive
    command comes (a reboot, its stop), the group's server, rank 0's URL, leaves the routers.
    So each member's units name its rank 0's URLs (those the routers may know it by)."""
    for name, member_units in members.items():
        first = groups.rank0(hosts[name])
        by_unit = units.get(first.name, {}) if first is not None else {}
        urls = list(dict.fromkeys(url for known in by_unit.values() for url in known))
        units[name] = {unit: list(urls) for unit in member_units}


def _fits(batch_instances: int | None, after: dict[str, list[str]]) -> None:
    """``--batch-instances`` no larger than the servers of any host of the roll.

        _fits(2, {"b200-01": ["http://10.0.0.11:30000"]})   # InputError: ... runs 1 server
    """
    after = {name: urls for name, urls in after.items() if urls}  # a rank >= 1 routes none
    fewer = {name: len(urls) for name, urls in after.items()
             if batch_instances is not None and len(urls) < batch_instances}
    if fewer:
        hosts = ", ".join(f"{name} runs {n} server{'s' if n > 1 else ''}"
                          for name, n in fewer.items())
        raise InputError.one("--batch-instances", "",
                             f"{batch_instances} is more than a host's servers: {hosts}",
                             f"give at most {min(len(u) for u in after.values())} (the fewest "
                             "servers a host of the roll runs: parallel.instances), or leave it "
                             "out to restart each host's servers together")
