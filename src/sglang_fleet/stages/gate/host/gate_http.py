"""The gate's HTTP, standard library only (urllib): one request and its whole answer, never a
redirect followed (the key goes only to the URL given), and every way of getting no HTTP answer
said in one line. ``GateError`` is what fails the gate, here since every step raises it.

    status, body = request("http://127.0.0.1:30000/server_info", key)   # (200, b'{...}')
    answered(0, b"no answer in time")          # 'did not answer: no answer in time'
"""

from __future__ import annotations

import http.client
import json
import urllib.error
import urllib.parse
import urllib.request
from typing import Any


class GateError(Exception):
    def __init__(self, message: str, details: list[str] | None = None) -> None:
        super().__init__(message)
        self.details = details or []


# What urllib raises when a peer is not an HTTP server (an SSH banner, a closed connection, a
# malformed status line or headers), when nothing answers, or when the URL is unusable.
NO_ANSWER = (urllib.error.URLError, OSError, TimeoutError, http.client.HTTPException,
             ValueError, UnicodeError)


def no_answer(exc: BaseException) -> str:
    """One line saying why a request got no HTTP answer."""
    if isinstance(exc, urllib.error.URLError) and not isinstance(exc, urllib.error.HTTPError):
        exc = exc.reason if isinstance(exc.reason, BaseException) else exc
    if isinstance(exc, http.client.BadStatusLine | http.client.LineTooLong):
        return "it did not answer HTTP (not an HTTP server on that port?)"
    if isinstance(exc, TimeoutError):
        return "no answer in time"
    text = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
    return text[:200]


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A 3xx stays the answer: urllib would follow it and send the Authorization header again
    to wherever Location names (another host, or plain http)."""

    def redirect_request(self, req: urllib.request.Request, fp: Any, code: int, msg: str,
                         headers: Any, newurl: str) -> None:
        return None


OPENER = urllib.request.build_opener(_NoRedirect)


def origin(url: str) -> str:
    """scheme://host:port of a URL, never its userinfo, path or query.

        origin("http://u:p@10.0.0.9:8080/x?y")   # 'http://10.0.0.9:8080'
    """
    try:
        parts = urllib.parse.urlsplit(url)
        host, port = parts.hostname or "?", parts.port
    except ValueError:
        return "an unusable URL"
    host = f"[{host}]" if ":" in host else host
    return f"{parts.scheme}://{host}" + (f":{port}" if port else "")


def error_answer(err: urllib.error.HTTPError) -> tuple[int, bytes]:
    """(status, body) of an HTTP error; for a 3xx, where it pointed, as it was not followed."""
    if 300 <= err.code < 400:
        where = err.headers.get("Location") if err.headers else None
        to = origin(urllib.parse.urljoin(err.filename or "", where)) if where else "nowhere"
        return err.code, (f"a redirect to {to}, not followed (the key goes only to the URL "
                          "given: give the URL it serves on)").encode()
    try:
        return err.code, err.read()
    except NO_ANSWER:
        return err.code, b""


def request(url: str, key: str | None, body: dict[str, Any] | None = None,
            timeout: float = 30) -> tuple[int, bytes]:
    """(status, body); status 0 when nothing answered HTTP, with the reason as the body."""
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    data = json.dumps(body).encode() if body is not None else None
    try:
        req = urllib.request.Request(url, data=data, headers=headers)
        with OPENER.open(req, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return error_answer(err)
    except NO_ANSWER as exc:
        return 0, no_answer(exc).encode()


def answered(status: int, raw: bytes) -> str:
    """How a request went, in words: "answered 500: <body>" or "did not answer: <why>"."""
    if status == 0:
        return f"did not answer: {raw.decode(errors='replace')}"
    body = raw[:160].decode(errors="replace").strip().replace("\n", " ")
    return f"answered {status}" + (f": {body}" if body else "")
