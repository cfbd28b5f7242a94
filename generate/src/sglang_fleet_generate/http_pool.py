"""Keep-alive HTTP/1.1 connections for a job (``Pool``), and the TLS trust its https:// URLs
are checked against (``tls_context``). One completion with its retries is completion.py's.

    pool = Pool({"Authorization": "Bearer k"}, timeout=3600, only="http://10.0.0.10:30080",
                tls=tls_context(None))
    response = await pool.request("POST", "http://10.0.0.10:30080/v1/chat/completions", body)
"""

from __future__ import annotations

import asyncio
import os
import ssl
import urllib.parse

import certifi
import h11
import httpx

from sglang_fleet_generate.errors import GenerateError
from sglang_fleet_generate.text import without_userinfo

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
