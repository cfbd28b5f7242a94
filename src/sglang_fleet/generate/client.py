"""One chat completion with retries: connection errors, timeouts, 429, 502, 503 and 504 (and a
router's 500 for a worker it could not reach) are retried with exponential backoff and jitter,
after any Retry-After (a worker leaving during a roll loses nothing); any other answer is
final. During an outage of the whole fleet the tries wait on the job's breaker (outage.py).

    outcome = await complete(pool, limiter, url, item, retries=8, breaker=breaker)
"""

from __future__ import annotations

import asyncio
import collections
import os
import random
import ssl
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import certifi
import h11
import httpx
import orjson

from sglang_fleet.config.validators import without_userinfo
from sglang_fleet.generate.errors import GenerateError
from sglang_fleet.generate.outage import Breaker, is_trouble, retry_after
from sglang_fleet.generate.source import Item

BACKOFF_FIRST = 0.5
BACKOFF_MAX = 30.0
CONNECT_TIMEOUT = 10.0
Headers = list[tuple[bytes, bytes]]
Answer = tuple[int, Headers, bytes]  # status, headers, body


def tls_context(ca_bundle: str | None) -> ssl.SSLContext:
    """What https:// answers are checked against: ``--ca-bundle``, else ``SSL_CERT_FILE``, else
    certifi's public CAs. A router behind a site's private CA is reachable with either of the
    first two; GenerateError (naming the option or variable and the fix) if that file is not
    a PEM file of certificates.

        tls_context("/etc/ssl/certs/ca-certificates.crt")  # the host's store
    """
    env = os.environ.get("SSL_CERT_FILE") or None
    where, path = ("--ca-bundle", ca_bundle) if ca_bundle else ("SSL_CERT_FILE", env)
    if path is None:
        return ssl.create_default_context(cafile=certifi.where())
    try:
        return ssl.create_default_context(cafile=path)
    except OSError as exc:  # ssl.SSLError is one too: a file, but no certificate in it
        why = f"no PEM certificate in it ({exc.reason})" if isinstance(exc, ssl.SSLError) \
            else exc.strerror or str(exc)
        fix = ("give --ca-bundle the PEM file of the CA that signed the router's certificate "
               "(e.g. /etc/ssl/certs/ca-certificates.crt)" if ca_bundle else
               "point SSL_CERT_FILE at a PEM file of CA certificates, or unset it")
        raise GenerateError(f"{where}: {path}: {why}\n    fix: {fix}") from None


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


def _origin(url: str) -> tuple[str, str, int]:
    """(scheme, host, port) of an http(s) URL; httpx.UnsupportedProtocol for any other."""
    parts = urllib.parse.urlsplit(url)
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        port = -1
    if parts.scheme not in ("http", "https") or not parts.hostname or port < 0:
        raise httpx.UnsupportedProtocol(f"{without_userinfo(url)}: not an http:// or https:// "
                                        "URL")
    return parts.scheme, parts.hostname, port


class Pool:
    """Keep-alive HTTP/1.1 connections for the job, an httpx transport cut to what it needs.

    httpcore's pool runs each request through anyio and a pool scan: about a millisecond of
    CPU per request, as much as the rest of the job. Here each connection is an asyncio
    protocol driving h11 (httpcore's own HTTP/1.1 state machine, so the parsing is the same),
    a request goes out in one write, and answers come back as httpx.Response objects with
    httpx's exceptions, so callers and retries are unchanged.

        pool = Pool({"Authorization": "Bearer k"}, timeout=3600, only="http://10.0.0.10:30080",
                    tls=tls_context(None))
        response = await pool.request("POST", url, body)

    With ``only``, a URL of any other origin (scheme, host, port) is refused before anything is
    sent: the headers hold the key, and it goes to the origin the user named alone.
    """

    def __init__(self, headers: dict[str, str], timeout: float, only: str | None = None,
                 tls: ssl.SSLContext | None = None) -> None:
        self.headers = [(k.encode(), v.encode()) for k, v in headers.items()]
        self.timeout = timeout
        self.only = _origin(only) if only is not None else None
        self.tls = tls  # None: tls_context(None), made on the first https:// URL
        self.idle: dict[tuple[str, str, int], list[_Connection]] = {}
        self.targets: dict[str, tuple[tuple[str, str, int], bytes, bytes]] = {}
        self.live: set[_Connection] = set()

    def _target(self, url: str) -> tuple[tuple[str, str, int], bytes, bytes]:
        """(origin, Host header, request target) of a URL, parsed once per URL."""
        found = self.targets.get(url)
        if found is None:
            parts = urllib.parse.urlsplit(url)
            origin = _origin(url)
            if self.only is not None and origin != self.only:
                scheme, name, port = origin
                raise httpx.UnsupportedProtocol(
                    f"{scheme}://{name}:{port}: not the origin of --url (the key goes there "
                    "alone)")
            path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
            host = parts.netloc.rpartition("@")[2]  # never user:password in a header
            found = (origin, host.encode(), path.encode())
            if len(self.targets) < 64:  # a handful of URLs in a job (its router, its workers)
                self.targets[url] = found
        return found

    async def _connect(self, origin: tuple[str, str, int]) -> _Connection:
        scheme, host, port = origin
        loop = asyncio.get_running_loop()
        tls = None
        if scheme == "https":
            if self.tls is None:
                self.tls = tls_context(None)
            tls = self.tls
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT):
                _, conn = await loop.create_connection(
                    lambda: _Connection(origin), host, port, ssl=tls,
                    server_hostname=host if tls else None)
        except TimeoutError:
            raise httpx.ConnectTimeout(f"{host}:{port}: no connection in "
                                       f"{CONNECT_TIMEOUT:g} s") from None
        except (OSError, ssl.SSLError) as exc:
            raise httpx.ConnectError(f"{host}:{port}: {exc}") from None
        self.live.add(conn)
        return conn

    async def _take(self, origin: tuple[str, str, int], fresh: bool = False) -> _Connection:
        idle = None if fresh else self.idle.get(origin)
        while idle:
            conn = idle.pop()
            if conn.reusable():
                return conn
            conn.close()
            self.live.discard(conn)
        return await self._connect(origin)

    def _give_back(self, conn: _Connection) -> None:
        if conn.reusable():
            self.idle.setdefault(conn.origin, []).append(conn)
        else:
            conn.close()
            self.live.discard(conn)

    async def request(self, method: str, url: str, body: bytes | None = None,
                      timeout: float | None = None, fresh: bool = False) -> httpx.Response:
        """The whole response, or an httpx.HTTPError (ConnectError, ReadTimeout,
        RemoteProtocolError...)."""
        origin, host, target = self._target(url)
        headers = [(b"Host", host), *self.headers]
        if body is not None:
            headers.append((b"Content-Length", str(len(body)).encode()))
        conn = await self._take(origin, fresh)
        try:
            status, reply_headers, content = await conn.exchange(
                method.encode(), target, headers, body, self.timeout if timeout is None
                else timeout)
        except BaseException:
            conn.close()
            self.live.discard(conn)
            raise
        self._give_back(conn)
        return httpx.Response(status, headers=reply_headers, content=content)

    async def get(self, url: str, timeout: float, fresh: bool = False) -> httpx.Response:
        """A GET (fleet sizing, model name)."""
        return await self.request("GET", url, timeout=timeout, fresh=fresh)

    async def aclose(self) -> None:
        for conn in self.live:
            conn.close()
        self.live.clear()
        self.idle.clear()


class _Connection(asyncio.Protocol):
    """One HTTP/1.1 connection: h11 parses, the event loop feeds it."""

    def __init__(self, origin: tuple[str, str, int]) -> None:
        self.origin = origin
        self.h11 = h11.Connection(h11.CLIENT)
        self.transport: asyncio.Transport | None = None
        self.waiter: asyncio.Future[None] | None = None
        self.lost = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.h11.receive_data(data)
        self._wake()

    def eof_received(self) -> bool:
        self._closed()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed()

    def _closed(self) -> None:
        """The server closed: h11 turns that into ConnectionClosed, an error mid-answer, or
        the end of an answer that runs to the close."""
        if not self.lost:
            self.lost = True
            self.h11.receive_data(b"")
        self._wake()

    def _wake(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    def reusable(self) -> bool:
        """Idle, open and both sides done with the last exchange (keep-alive)."""
        return not self.lost and self.h11.our_state is h11.IDLE \
            and self.h11.their_state is h11.IDLE

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
        self.lost = True

    async def exchange(self, method: bytes, target: bytes, headers: Headers,
                       body: bytes | None, timeout: float) -> Answer:
        """Send one request (one write) and read its whole response."""
        assert self.transport is not None
        try:
            out = self.h11.send(h11.Request(method=method, target=target, headers=headers))
            if body:
                out += self.h11.send(h11.Data(data=body))
            out += self.h11.send(h11.EndOfMessage())
        except h11.LocalProtocolError as exc:
            raise httpx.LocalProtocolError(str(exc)) from None
        self.transport.write(out)
        try:
            async with asyncio.timeout(timeout):
                answer = await self._read()
        except TimeoutError:
            raise httpx.ReadTimeout(f"no answer in {timeout:g} s") from None
        except h11.RemoteProtocolError as exc:
            raise httpx.RemoteProtocolError(str(exc)) from None
        if self.h11.our_state is h11.DONE and self.h11.their_state is h11.DONE:
            self.h11.start_next_cycle()
        return answer

    async def _read(self) -> Answer:
        status = 0
        headers: Headers = []
        chunks: list[bytes] = []
        while True:
            event = self.h11.next_event()
            if event is h11.NEED_DATA:
                if self.lost:  # closed by us (a timeout) or the end was already fed to h11
                    raise httpx.RemoteProtocolError("connection closed mid-answer")
                self.waiter = asyncio.get_running_loop().create_future()
                await self.waiter
                self.waiter = None
            elif isinstance(event, h11.Response):
                status, headers = event.status_code, list(event.headers)
            elif isinstance(event, h11.Data):
                chunks.append(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage):
                return status, headers, b"".join(chunks)
            elif isinstance(event, h11.ConnectionClosed):  # httpcore's words for the same
                raise httpx.RemoteProtocolError("Server disconnected without sending a response.")


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
