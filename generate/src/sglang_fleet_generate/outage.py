"""The job's outage breaker: when the whole fleet is out (connections refused, 502/503/504, a
router with no healthy worker), the job pauses instead of failing lines, probes the fleet's
health on a backoff (1 s doubling to 30 s, after any Retry-After), and resumes by itself.

A failed try counts against a line's ``--retries`` only while the fleet is known to serve:
the health probe passes once it failed. A try that failed while the fleet was out is sent
again once the fleet is back, so a line fails only for its own reason (a 4xx, an answer it
cannot read) or after its retries while the fleet serves (a request that alone gets 503
still ends).

    breaker = Breaker(probe=health, on_pause=print, on_resume=print)
    await breaker.admit()                    # waits while paused
    ...                                      # send it
    breaker.answered()  /  counted = await breaker.counts(cause, retry_after)
"""

from __future__ import annotations

import asyncio
import email.utils
import time
from collections.abc import Awaitable, Callable

TROUBLE_STATUS = frozenset({429, 502, 503, 504})
# The routers' error codes for the fleet's trouble, measured with smg 1.13.0 and sglang-router
# 0.3.2 (smg model_gateway/src/routers/http/router.rs): 500 when the worker chosen could not be
# reached (``call_upstream_connection_failed``, 0.3.2 ``call_upstream_request_error``), and
# smg's 404 once no worker of the model is registered at all (``model_not_found``, as when a
# roll or teardown took every one out) - also its answer to a line naming a model nobody
# serves, which the health probe then tells apart (the fleet serves: the try counts).
TROUBLE_CODES = {500: (b'"code":"call_upstream_connection_failed"',
                       b'"code":"call_upstream_request_error"'),
                 404: (b'"code":"model_not_found"',)}
PROBE_FIRST_S = 1.0
PROBE_MAX_S = 30.0
RETRY_AFTER_MAX_S = 600.0


def is_trouble(status: int, body: bytes) -> bool:
    """Whether an answer says the fleet (not the request) could not serve it.

    Example: is_trouble(503, b"No available workers") is True; is_trouble(400, b"") is False.
    """
    return status in TROUBLE_STATUS or any(code in body for code in TROUBLE_CODES.get(status, ()))


def retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds a ``Retry-After`` header asks for (delta-seconds or an HTTP date), capped at
    RETRY_AFTER_MAX_S; None when absent or unreadable. Example: retry_after("7") == 7.0"""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return min(float(value), RETRY_AFTER_MAX_S)
    try:
        when = email.utils.parsedate_to_datetime(value).timestamp()
    except (TypeError, ValueError, IndexError):
        return None
    return min(max(when - (time.time() if now is None else now), 0.0), RETRY_AFTER_MAX_S)


class Breaker:
    """Serving, or paused: no request goes out until a health probe passes.

    ``probe`` is the fleet's health as the user's URL answers it (``GET /health_generate``:
    SGLang's and the router's one-token generation), None when healthy, else why not.
    """

    def __init__(self, probe: Callable[[], Awaitable[str | None]],
                 on_pause: Callable[[str], None],
                 on_resume: Callable[[float, str], None]) -> None:
        self.probe = probe
        self.on_pause = on_pause
        self.on_resume = on_resume
        self.paused_since: float | None = None
        self.cause = ""
        self.last_probe: tuple[float, str | None] = (0.0, "not probed")  # (started, why not)
        self.probing: asyncio.Task[str | None] | None = None
        self.not_before = 0.0  # a Retry-After: no request before then
        self.resumed = asyncio.Event()
        self.resumed.set()
        self.prober: asyncio.Task[None] | None = None

    @property
    def paused(self) -> bool:
        return self.paused_since is not None

    async def admit(self) -> None:
        """Wait while paused, and until any Retry-After has passed."""
        while True:
            if not self.resumed.is_set():
                await self.resumed.wait()
            wait = self.not_before - time.monotonic()
            if wait <= 0:
                return
            await asyncio.sleep(wait)

    def answered(self) -> None:
        """An answer came back: the fleet serves (a pause ends)."""
        if self.paused:
            self._resume()

    async def counts(self, cause: str, wait: float | None = None) -> bool:
        """After a try the fleet could not serve: True if it counts against the line's
        retries (the fleet's health probe, started after it failed, passes); False, and the
        job paused, if the fleet is out. Answers to other requests prove nothing here: servers
        that are stopping answer what they hold while they refuse what comes."""
        if wait:
            self.not_before = max(self.not_before, time.monotonic() + wait)
        if self.paused:
            return False
        failed_at = time.monotonic()
        why = await self._health(failed_at)
        if why is None:
            return True
        if not self.paused:
            self._pause(f"{cause}; {why}")
        return False

    async def _health(self, after: float) -> str | None:
        """The result of a probe started at or after ``after``: one at a time, shared."""
        started, why = self.last_probe
        if started >= after:
            return why
        if self.probing is None:
            self.probing = asyncio.create_task(self._probe_once())
        return await asyncio.shield(self.probing)

    async def _probe_once(self) -> str | None:
        started = time.monotonic()
        try:
            why = await self.probe()
        finally:
            self.probing = None
        self.last_probe = (started, why)
        return why

    def _pause(self, cause: str) -> None:
        self.paused_since, self.cause = time.monotonic(), cause
        self.resumed.clear()
        self.on_pause(cause)
        self.prober = asyncio.create_task(self._probe_until_healthy())

    def _resume(self) -> None:
        assert self.paused_since is not None
        paused = time.monotonic() - self.paused_since
        self.paused_since = None
        if self.prober is not None and self.prober is not asyncio.current_task():
            self.prober.cancel()
        self.prober = None
        self.resumed.set()
        self.on_resume(paused, self.cause)

    async def _probe_until_healthy(self) -> None:
        delay = PROBE_FIRST_S
        while self.paused:
            await asyncio.sleep(max(delay, self.not_before - time.monotonic()))
            why = await self._health(time.monotonic())
            if why is None and self.paused:
                self._resume()
                return
            self.cause = why or self.cause
            delay = min(delay * 2, PROBE_MAX_S)
