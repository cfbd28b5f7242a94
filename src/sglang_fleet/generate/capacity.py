"""How many requests the fleet behind a URL runs at once: the sum of ``max_running_requests``
over the router's healthy workers (each from its own ``/server_info``), or a single server's own;
``None`` when neither answers (the caller then uses its fixed ``--concurrency``); GenerateError
when one answers 200 with a body that is not JSON.

    limit, how = await fleet_capacity(http, "http://10.0.0.10:30080")
    # (96, "2 healthy workers: http://10.0.0.11:30000=48, http://10.0.0.12:30000=48")
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from sglang_fleet.generate.client import Pool
from sglang_fleet.generate.errors import GenerateError


def running_limit(info: dict[str, Any]) -> int | None:
    """A server's request limit from its /server_info: the resolved argument, else what each
    DP rank reports it runs (SGLang fills ``max_running_requests`` only when it was given).

    Example: running_limit({"max_running_requests": 48}) == 48
    """
    value = info.get("max_running_requests")
    if isinstance(value, int) and value > 0:
        return value
    ranks = info.get("internal_states") or []
    per_rank = [r.get("effective_max_running_requests_per_dp") for r in ranks
                if isinstance(r, dict)]
    total = sum(v for v in per_rank if isinstance(v, int))
    return total or None


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


async def server_limit(http: Pool, url: str) -> int | None:
    info, _ = await _json(http, f"{url}/server_info")
    return running_limit(info) if isinstance(info, dict) else None


async def fleet_capacity(http: Pool, url: str) -> tuple[int | None, str]:
    """(limit, how it was found) for a router's healthy workers or for a single server."""
    listing, why = await _json(http, f"{url}/workers")
    if isinstance(listing, dict) and isinstance(listing.get("workers"), list):
        healthy = [w["url"] for w in listing["workers"]
                   if isinstance(w, dict) and w.get("is_healthy") and w.get("url")]
        limits = await asyncio.gather(*(server_limit(http, str(u).rstrip("/")) for u in healthy))
        sized = [(u, n) for u, n in zip(healthy, limits, strict=True) if n]
        if sized:
            parts = ", ".join(f"{u}={n}" for u, n in sized)
            return sum(n for _, n in sized), f"{len(sized)} healthy workers: {parts}"
        return None, f"{url}/workers lists no healthy worker with a /server_info"
    own = await server_limit(http, url)
    if own:
        return own, f"{url}/server_info max_running_requests={own}"
    return None, f"{why}; {url}/server_info has no max_running_requests"
