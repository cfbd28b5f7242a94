"""Start an SGLang server with its API keys from the environment (systemd's root-only
EnvironmentFile) instead of the command line, and keep the keys out of what it prints and serves.

    python -m sglang_fleet.remote.start_server sglang.launch_server \\
        --model-path /var/lib/sglang/models/m --port 30000

Standard library only (uvicorn is the release's own). The keys reach SGLang in-process, as the
flags it reads them from (``--api-key``,
``--admin-api-key``): they are in this process's ``sys.argv``, which ``/proc/PID/cmdline``, ``ps``
and ``systemctl status`` do not show (they show the argv the process was exec'd with). SGLang
logs its whole ``server_args`` (keys included: 0.5.10 ``srt/entrypoints/engine.py:181``
``logger.info(f"{server_args=}")``; 0.5.23 ``engine.py:311``) and returns them from
``/server_info`` to any client holding the client key (0.5.10 ``http_server.py:614``
``dataclasses.asdict``; 0.5.23 ``utils/common.py:3589`` ``resolved_dict``): this process's
standard streams and every HTTP response body are written with the keys masked.
"""

from __future__ import annotations

import os
import runpy
import sys
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, TextIO

# Environment variable (from the root-only EnvironmentFile) → the flag SGLang reads it from.
API_KEY, ADMIN_API_KEY = "SGLANG_API_KEY", "SGLANG_ADMIN_API_KEY"
KEYS = {API_KEY: "--api-key", ADMIN_API_KEY: "--admin-api-key"}
MASK = "<redacted>"

Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Message, Receive, Send], Awaitable[None]]


class RedactingStream:
    """A text stream that writes everything it is given except the secrets."""

    def __init__(self, stream: TextIO, secrets: list[str]) -> None:
        self._stream = stream
        self._secrets = secrets

    def write(self, text: str) -> int:
        for secret in self._secrets:
            text = text.replace(secret, MASK)
        return self._stream.write(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def redacting_app(app: App, secrets: list[str]) -> App:
    """An ASGI app whose response bodies carry ``*`` where the secrets were (same length, so
    Content-Length stays true)."""
    masks = [(s.encode(), b"*" * len(s.encode())) for s in secrets]

    async def wrapped(scope: Message, receive: Receive, send: Send) -> None:
        async def masked_send(message: Message) -> None:
            body = message.get("body")
            if message.get("type") == "http.response.body" and body:
                for secret, mask in masks:
                    body = body.replace(secret, mask)
                message["body"] = body
            await send(message)

        await app(scope, receive, masked_send if scope.get("type") == "http" else send)

    return wrapped


def mask_http(secrets: list[str]) -> None:
    """Every app served through uvicorn (SGLang's HTTP server) gets masked response bodies."""
    try:
        import uvicorn  # type: ignore[import-not-found,unused-ignore]
    except ImportError:  # a release without uvicorn serves no HTTP to mask
        return
    original = uvicorn.Config.__init__

    def init(self: Any, app: Any, *args: Any, **kwargs: Any) -> None:
        if callable(app):
            app = redacting_app(app, secrets)
        original(self, app, *args, **kwargs)

    uvicorn.Config.__init__ = init  # type: ignore[method-assign,unused-ignore]


def take_keys(environ: MutableMapping[str, str]) -> tuple[list[str], list[str]]:
    """The key flags to hand to the server and the secret values, removed from ``environ`` so
    no child process inherits them."""
    flags: list[str] = []
    secrets: list[str] = []
    for var, flag in KEYS.items():
        value = environ.pop(var, "")
        if value:
            flags += [flag, value]
            secrets.append(value)
    return flags, secrets


def main(argv: list[str]) -> None:
    if not argv:
        sys.exit("usage: python -m sglang_fleet.remote.start_server MODULE [SGLang flags...]")
    module, args = argv[0], argv[1:]
    flags, secrets = take_keys(os.environ)
    if secrets:
        sys.stdout = RedactingStream(sys.stdout, secrets)
        sys.stderr = RedactingStream(sys.stderr, secrets)
        mask_http(secrets)
    sys.argv = [module, *args, *flags]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
