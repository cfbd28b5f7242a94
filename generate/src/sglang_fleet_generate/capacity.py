"""How many requests the fleet behind a URL runs at once, read through that URL only: a
router's healthy workers (its ``/workers`` when the key opens it, else its ``/readiness``,
which smg and sglang-router answer anyone with ``healthy_workers``) times one worker's
``max_running_requests`` (the router's ``/get_server_info``, which smg passes to one worker;
sglang-router 0.3.2 answers it itself, without the limit), or a single server's own
``/server_info``; ``None`` when none answers (the caller then uses its fixed
``--concurrency``); GenerateError when one answers 200 with a body that is not JSON.

The key goes to no URL ``/workers`` lists: a worker's address is whatever the router was told
(another host, plain http), and the user named only the router.

    limit, how = await fleet_capacity(http, "http://10.0.0.10:30080")
    # (96, "2 healthy workers x 48 (one worker's /get_server_info through the router)")
"""

from __future__ import annotations

from typing import Any

import httpx

from sglang_fleet_generate.errors import GenerateError
from sglang_fleet_generate.http_pool import Pool


# The deploy's own (remote/capacity_figures.py, which the gate runs on hosts), copied: this
# package depends on no part of the deploy; tests/unit/test_packaging.py fails when they differ.
def running_limit(info: dict[str, Any]) -> int | None:
    """A server's running-request limit from its /server_info: what each DP rank reports it runs
    (``internal_states``, one per DP rank), else the argument, which is each DP rank's (given
    only when set; with --dp-size every replica runs that many).

        running_limit({"max_running_requests": 48, "dp_size": 8})   # 384
    """
    ranks = info.get("internal_states")
    per_rank = [r.get("effective_max_running_requests_per_dp") for r in
                (ranks if isinstance(ranks, list) else []) if isinstance(r, dict)]
    known = [v for v in per_rank if isinstance(v, int) and not isinstance(v, bool) and v > 0]
    if known:
        return sum(known)
    value, dp = info.get("max_running_requests"), info.get("dp_size")
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value * (dp if isinstance(dp, int) and not isinstance(dp, bool) and dp > 0 else 1)
    return None


async def _json(http: Pool, url: str) -> tuple[Any, str]:
    """(parsed JSON or None, why not): no answer or another status is "not reported" (a
    server without a router's /workers); a 200 that is not JSON is a broken answer, an error."""
    try:
        response = await http.get(url, 5)
    except httpx.HTTPError as exc:
        return None, f"{url}: {type(exc).__name__}"
    if response.status_code != 200:
        return None, f"{url} answered {response.status_code}"
    try:
        return response.json(), ""
    except ValueError:
        raise GenerateError(f"{url} answered 200 but not JSON: {response.content[:80]!r} "
                            "(is --url an SGLang server or router?)") from None


async def server_limit(http: Pool, url: str) -> tuple[int | None, str]:
    """(``max_running_requests`` of a ``/server_info``-shaped answer, why none)."""
    info, why = await _json(http, url)
    limit = running_limit(info) if isinstance(info, dict) else None
    return limit, why or (f"{url} has no max_running_requests" if limit is None else "")


def healthy_workers(listing: Any) -> int | None:
    """How many healthy workers a router's ``/workers`` answer lists, or its ``/readiness``
    answer counts (None: neither)."""
    if isinstance(listing, dict) and isinstance(listing.get("workers"), list):
        return sum(1 for w in listing["workers"] if isinstance(w, dict) and w.get("is_healthy"))
    count = listing.get("healthy_workers") if isinstance(listing, dict) else None
    return count if isinstance(count, int) and not isinstance(count, bool) else None


async def fleet_capacity(http: Pool, url: str) -> tuple[int | None, str]:
    """(limit, how it was found) for a router's healthy workers or for a single server."""
    listing, why = await _json(http, f"{url}/workers")
    if healthy_workers(listing) is None:  # /workers needs the router's admin key
        listing, _ = await _json(http, f"{url}/readiness")
    healthy = healthy_workers(listing)
    if healthy is not None:
        # Workers of one fleet run one profile: one worker's limit stands for each.
        if not healthy:
            return None, f"the router at {url} counts no healthy worker"
        # smg over gRPC answers 501: its workers' limits are in /workers, for the admin key
        each, no_limit = await server_limit(http, f"{url}/get_server_info")
        if each:
            return healthy * each, (f"{healthy} healthy workers x {each} (one worker's "
                                    "/get_server_info through the router)")
        return None, no_limit
    own, no_limit = await server_limit(http, f"{url}/server_info")
    if own:
        return own, f"{url}/server_info max_running_requests={own}"
    return None, f"{why}; {no_limit}"
