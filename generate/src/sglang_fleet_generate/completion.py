"""One chat completion with retries: connection errors, timeouts, 429, 502, 503 and 504 (and a
router's 500 for a worker it could not reach) are retried with exponential backoff and jitter,
after any Retry-After (a worker leaving during a roll loses nothing); any other answer is
final. During an outage of the whole fleet the tries wait on the job's breaker (outage.py).
The connections are http_pool.py's.

    outcome = await complete(pool, limiter, url, item, retries=8, breaker=breaker)
"""

from __future__ import annotations

import asyncio
import collections
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx
import orjson

from sglang_fleet_generate.http_pool import Pool
from sglang_fleet_generate.outage import Breaker, is_trouble, retry_after
from sglang_fleet_generate.source import Item

BACKOFF_FIRST = 0.5
BACKOFF_MAX = 30.0


@dataclass
class Outcome:
    """A record to write (``record``) or a failure (``error``, and ``code``, its kind), and the
    tries it took; ``status`` and ``body``: the last answer other than 200, if there was one;
    ``usage``: the answer's token counts (for the progress counters, whatever the record's
    shape)."""

    record: dict[str, Any] | None
    error: str | None
    tries: int
    code: str | None = None
    status: int | None = None
    body: Any = None
    usage: Any = None


Build = Callable[[Item, dict[str, Any], float, str], dict[str, Any]]


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


def refused(error: str, tries: int, response: httpx.Response | None) -> Outcome:
    """No record: the last try's answer (status and body: JSON, else its first 300
    characters), or none at all (a connection error, a timeout)."""
    if response is None:
        return Outcome(None, error, tries, "no_answer")
    try:
        body = orjson.loads(response.content)
    except ValueError:
        body = response.text[:300]
    return Outcome(None, error, tries, "http_error", response.status_code, body)


async def complete(http: Pool, limiter: Limiter, url: str, item: Item,
                   retries: int, breaker: Breaker, build: Build = to_record) -> Outcome:
    """Send ``item`` until it is answered, it fails for its own reason, or ``retries`` retries
    are spent while the fleet serves (``breaker``: tries during an outage wait and do not
    count); the slot is held only while a request is in flight, not while backing off.
    ``build`` makes the record of a 200 answer (a KeyError, IndexError, TypeError or
    ValueError there: an unreadable answer)."""
    error, counted, sent = "", 0, 0
    while True:
        await breaker.admit()
        await limiter.acquire()
        start = time.monotonic()
        try:
            response, error = await _try(http, url, item)
        finally:
            limiter.release()
        sent += 1
        wait = None
        if response is not None:
            if response.status_code == 200:
                breaker.answered()
                try:
                    answer = orjson.loads(response.content)  # 10x json's speed, same values
                    record = build(item, answer, time.monotonic() - start, url)
                except (ValueError, KeyError, IndexError, TypeError) as exc:
                    return Outcome(None, f"unreadable answer: {exc!r}", sent,
                                   "unreadable_answer")
                return Outcome(record, None, sent, usage=answer.get("usage"))
            error = f"HTTP {response.status_code}: {response.text[:300]}"
            if not is_trouble(response.status_code, response.content):
                breaker.answered()  # the fleet answered; the request was refused
                return refused(error, sent, response)
            wait = retry_after(response.headers.get("retry-after"))
        if await breaker.counts(error, wait):
            counted += 1
            if counted > retries:
                return refused(f"gave up after {counted} tries while the fleet served"
                               + (f" ({sent} sent)" if sent > counted else "")
                               + f"; last: {error}", sent, response)
            await asyncio.sleep(max(backoff(counted - 1), wait or 0))
