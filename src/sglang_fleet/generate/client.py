"""One chat completion with retries: connection errors, timeouts, 429, 502, 503 and 504 are
retried with exponential backoff and jitter (a worker leaving during a roll loses nothing);
any other answer is final.

    outcome = await complete(pool, limiter, url, item, retries=8)
"""

from __future__ import annotations

import asyncio
import collections
import json
import random
import ssl
import time
from dataclasses import dataclass
from typing import Any

import certifi
import httpx

from sglang_fleet.generate.source import Item

RETRY_STATUS = frozenset({429, 502, 503, 504})
BACKOFF_FIRST = 0.5
BACKOFF_MAX = 30.0


@dataclass
class Outcome:
    """A record to write (``record``) or a failure (``error``), and the tries it took."""

    record: dict[str, Any] | None
    error: str | None
    tries: int


class Pool:
    """httpx transports (connection pools) shared by at most ``per_pool`` requests each.

    httpcore scans every connection of a pool on each request, so one pool with hundreds of
    connections spends milliseconds of CPU per request; many small pools, driven through
    httpx's transport API (no per-request cookie, auth and redirect handling, which this job
    does not use), keep the client from being the bottleneck (measured in bench/generate.py).

        pool = Pool({"Authorization": "Bearer k"}, timeout=3600)
        response = await pool.request("POST", url, body)
    """

    def __init__(self, headers: dict[str, str], timeout: float, per_pool: int = 4) -> None:
        self.per_pool = per_pool
        self.headers = headers
        self.timeout = {"connect": 10.0, "read": timeout, "write": timeout, "pool": timeout}
        # one TLS context for all: httpx loads the CA bundle per transport otherwise (~60 ms)
        self.tls = ssl.create_default_context(cafile=certifi.where())
        self.pools: list[httpx.AsyncHTTPTransport] = []
        self.free: list[httpx.AsyncHTTPTransport] = []

    def _take(self) -> httpx.AsyncHTTPTransport:
        if not self.free:
            pool = httpx.AsyncHTTPTransport(verify=self.tls)
            self.pools.append(pool)
            self.free.extend([pool] * self.per_pool)
        return self.free.pop()

    async def request(self, method: str, url: str, body: bytes | None = None,
                      timeout: float | None = None) -> httpx.Response:
        """The whole response (read and closed), or an httpx.HTTPError."""
        extensions = {"timeout": self.timeout if timeout is None else
                      {"connect": timeout, "read": timeout, "write": timeout, "pool": timeout}}
        request = httpx.Request(method, url, headers=self.headers, content=body,
                                extensions=extensions)
        pool = self._take()
        try:
            response = await pool.handle_async_request(request)
            try:
                await response.aread()
            finally:
                await response.aclose()
            return response
        finally:
            self.free.append(pool)

    async def get(self, url: str, timeout: float) -> httpx.Response:
        """A GET (fleet sizing, model name)."""
        return await self.request("GET", url, timeout=timeout)

    async def aclose(self) -> None:
        for pool in self.pools:
            await pool.aclose()


class Limiter:
    """A semaphore whose size can change while it is held (the fleet grows and shrinks).

    Without locks: the event loop runs one coroutine at a time, and this is taken and given
    back a thousand times a second.
    """

    def __init__(self, limit: int) -> None:
        self.limit = max(1, limit)
        self.busy = 0
        self.waiters: collections.deque[asyncio.Future[None]] = collections.deque()

    async def acquire(self) -> None:
        if self.busy < self.limit and not self.waiters:
            self.busy += 1
            return
        waiter = asyncio.get_running_loop().create_future()
        self.waiters.append(waiter)
        try:
            await waiter  # the slot was counted for us by _wake
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.release()
            raise

    def release(self) -> None:
        self.busy -= 1
        self._wake()

    def resize(self, limit: int) -> None:
        self.limit = max(1, limit)
        self._wake()

    def _wake(self) -> None:
        while self.waiters and self.busy < self.limit:
            waiter = self.waiters.popleft()
            if not waiter.done():
                self.busy += 1
                waiter.set_result(None)


def backoff(attempt: int) -> float:
    """Seconds to wait before try ``attempt + 1`` (full jitter). Example: backoff(0) <= 0.5"""
    return random.uniform(0, min(BACKOFF_MAX, BACKOFF_FIRST * 2 ** attempt))


def to_record(item: Item, answer: dict[str, Any], latency: float, server: str) -> dict[str, Any]:
    """The output record; ``content`` and ``reasoning_content`` are kept exactly as answered
    (null stays null, "" stays "")."""
    choice = answer["choices"][0]
    message = choice.get("message") or {}
    return {"id": item.id, "request_sha256": item.sha256,
            "reasoning_content": message.get("reasoning_content"),
            "content": message.get("content"), "finish_reason": choice.get("finish_reason"),
            "usage": answer.get("usage"), "latency_s": round(latency, 4), "server": server}


async def _try(pool: Pool, url: str, item: Item) -> tuple[httpx.Response | None, str]:
    try:
        return await pool.request("POST", f"{url}/v1/chat/completions", item.body), ""
    except httpx.HTTPError as exc:
        return None, f"{type(exc).__name__}: {exc}"[:300]


async def complete(http: Pool, limiter: Limiter, url: str, item: Item,
                   retries: int) -> Outcome:
    """Send ``item`` until it is answered or ``retries`` retries are spent; the slot is held
    only while a request is in flight, not while backing off."""
    error = ""
    for attempt in range(retries + 1):
        if attempt:
            await asyncio.sleep(backoff(attempt - 1))
        await limiter.acquire()
        start = time.monotonic()
        try:
            response, error = await _try(http, url, item)
        finally:
            limiter.release()
        if response is None:
            continue
        if response.status_code == 200:
            try:
                answer = json.loads(response.content)
                record = to_record(item, answer, time.monotonic() - start, url)
            except (ValueError, KeyError, IndexError, TypeError) as exc:
                return Outcome(None, f"unreadable answer: {exc!r}", attempt + 1)
            return Outcome(record, None, attempt + 1)
        error = f"HTTP {response.status_code}: {response.text[:300]}"
        if response.status_code not in RETRY_STATUS:
            return Outcome(None, error, attempt + 1)
    return Outcome(None, f"gave up after {retries + 1} tries; last: {error}", retries + 1)
