"""A roll's budget of hosts out of service (``--max-unavailable``): the batch about to leave,
and every other host whose servers a router does not see healthy (a group whole: its rank 0's
URL stands for every member).

    unhealthy([router], {"b200-02": ["http://10.0.0.12:30000"]}, {}, ["b200-01"])
    # {"b200-02": "http://10.0.0.12:30000 is not healthy in http://10.0.0.9:30080"}
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from sglang_fleet.fleet.router_api import RouterError

if TYPE_CHECKING:
    from sglang_fleet.roll.roll import Roll

SHOWN = 5  # unhealthy hosts named in a line (the rest counted)


def within(roll: Roll, names: list[str], say: Callable[[str], None]) -> None:
    """The batch ``names`` may leave only if the hosts then out of service, its own and those
    already unhealthy in a router, stay within the roll's ``max_unavailable`` (by default the
    batch's own and those the roll skipped: every other host must be serving, capacity stays
    N - K); else a RouterError naming them (with their SSH error when they do not answer)."""
    sick = unhealthy(roll.plan.routers, roll.serving, roll.plan.unit_of, names)
    if not sick:
        return
    limit = len(names) + len(set(sick) & set(roll.skipped)) \
        if roll.max_unavailable is None else roll.max_unavailable
    out = len(names) + len(sick)
    if out <= limit:
        say(f"already out of service: {listed(sick)}; with {', '.join(names)} out too, {out} "
            f"of --max-unavailable {limit}")
        return
    reached = [roll.hosts[n] for n in list(sick)[:SHOWN] if n in roll.hosts]
    ssh = roll.reach(reached) if reached else {}
    bound = (f"--max-unavailable {limit}" if roll.max_unavailable is not None else
             "the batch's own hosts and those skipped (--max-unavailable, by default)")
    raise RouterError(f"{listed(sick, ssh)}: taking {', '.join(names)} out too would make "
                      f"{out} hosts unavailable, more than {bound}")


def unhealthy(routers: Sequence[Any], serving: dict[str, list[str]],
              unit_of: dict[str, list[str]], leaving: list[str]) -> dict[str, str]:
    """Each host outside ``leaving`` out of service now, with what a router said (its first
    router that does not see one of its servers healthy)."""
    found: dict[str, str] = {}
    for router in routers:
        workers = router.workers()
        for name, urls in serving.items():
            sick = [u for u in urls if not workers.get(u, {}).get("is_healthy")]
            if sick and name not in leaving:
                for member in unit_of.get(name, [name]):
                    found.setdefault(member, f"{_servers(sick)} not healthy in {router.url}")
    return {name: why for name, why in found.items() if name not in leaving}


def _servers(urls: list[str]) -> str:
    """``http://h:30000 is`` or ``http://h:30001 and 6 more are``."""
    return f"{urls[0]} is" if len(urls) == 1 else f"{urls[0]} and {len(urls) - 1} more are"


def listed(hosts: dict[str, str], ssh: dict[str, str] | None = None) -> str:
    """``hosts`` and why each is out (its SSH error first when it does not answer), the first
    few by name, the rest counted.

        listed({"h2": "http://h2:30000 is not healthy in http://r:30080"})
        # 'h2 (http://h2:30000 is not healthy in http://r:30080)'
    """
    ssh = ssh or {}
    named = [f"{n} ({ssh[n] + '; ' if n in ssh else ''}{why})"
             for n, why in list(hosts.items())[:SHOWN]]
    more = len(hosts) - SHOWN
    return "; ".join(named) + (f"; and {more} more" if more > 0 else "")
