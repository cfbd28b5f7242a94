"""Imported by every python a test starts with ``tests.noconnect.env()`` (this directory first on
its PYTHONPATH): a connection to any address outside this machine is refused before a packet
leaves, and recorded in ``$SGLANG_FLEET_NOCONNECT_LOG`` for the test to read. An audit hook
(``socket.connect``) sees every connect CPython makes, gevent's patched sockets included."""

from __future__ import annotations

import ipaddress
import os
import sys
from typing import Any


def _outside(address: Any) -> bool:
    if not isinstance(address, tuple) or not address:
        return False  # a Unix socket's path
    host = str(address[0]).split("%")[0]
    try:
        return not ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host != "localhost"


def _hook(event: str, args: tuple[Any, ...]) -> None:
    if event == "socket.connect" and _outside(args[1]):
        log = os.environ.get("SGLANG_FLEET_NOCONNECT_LOG")
        if log:
            with open(log, "a") as out:
                out.write(f"{args[1]!r}\n")
        raise ConnectionRefusedError(f"noconnect: refused a connection to {args[1]!r}: a test "
                                     "never reaches a host outside this machine")


sys.addaudithook(_hook)
