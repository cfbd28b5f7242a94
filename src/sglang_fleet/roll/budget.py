"""A roll's budget of hosts out of service (``--max-unavailable``): the batch about to leave,
and every other host whose servers a router does not see healthy (a group whole: its rank 0's
URL stands for every member).

    unhealthy([router], {"b200-02": ["http://10.0.0.12:30000"]}, {}, ["b200-01"])
    # {"b200-02": "http://10.0.0.12:30000 is not healthy in http://10.0.0.9:30080"}
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

SHOWN = 5  # unhealthy hosts named in a line (the rest counted)


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
