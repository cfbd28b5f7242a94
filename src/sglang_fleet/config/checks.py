"""Checks of one profile key's value, and the limits they hold it to.

A check takes a value of the key's type (the type is checked first) and returns what is wrong
with it, as a sentence, or None when it is fine. ``keys.key(check=...)`` attaches one to a key:

    >>> between(1, 64)(0)
    'must be at least 1, got 0'
    >>> one_of("off", "compile")("on")
    "must be one of off, compile; got 'on'"
    >>> port(30000) is None
    True
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from sglang_fleet import paths
from sglang_fleet.config.validators import key_shaped

Check = Callable[[Any], str | None]

MAX_INT = 2**31 - 1  # no count, size or length SGLang takes is larger
AUTO = "auto"  # parallel.instances: one server per tp x dp GPUs of each host
MAX_INSTANCES = 64
MAMBA_STRATEGIES = ("auto", "no_buffer", "extra_buffer", "extra_buffer_lazy")
WARMUP_MODES = ("off", "compile", "full")
CONNECTIONS = ("http", "grpc")  # server.router_connection
# Set by the product itself: a profile may not override them.
RESERVED_ENV = {paths.API_KEY_VAR: "server.api_key_secret",
                paths.ADMIN_API_KEY_VAR: "server.admin_api_key_secret"}
MAX_ENV = 128
MAX_EXTRA_ARGS = 256


def between(low: float | None = None, high: float | None = None, *,
            open_low: bool = False) -> Check:
    """A number from ``low`` to ``high`` (above ``low`` when ``open_low``)."""
    def check(value: Any) -> str | None:
        if low is not None and (value <= low if open_low else value < low):
            return f"must be {'greater than' if open_low else 'at least'} {low}, got {value}"
        if high is not None and value > high:
            return f"must be at most {high}, got {value}"
        return None

    return check


def count(low: int = 1) -> Check:
    """A count, size or length: ``low`` (usually 1) up to ``MAX_INT``."""
    return between(low, MAX_INT)


fraction = between(0, 1, open_low=True)  # in (0, 1]: 1 is all, 0 would be nothing


def one_of(*choices: str) -> Check:
    def check(value: Any) -> str | None:
        return None if value in choices else f"must be one of {', '.join(choices)}; got {value!r}"

    return check


def each(check: Check) -> Check:
    """``check`` applied to every item of a list; the first problem is the answer."""
    def every(value: Any) -> str | None:
        for item in value:
            wrong = check(item)
            if wrong:
                return wrong
        return None

    return every


def port(value: Any) -> str | None:
    if value < 1024:
        return (f"port {value} is privileged (below 1024): the server runs as the unprivileged "
                "user sglang, without capabilities, and could not bind it")
    if value > 65535:
        return f"must be at most 65535, got {value}"
    return None


# parallel.dist_port: below Linux's ephemeral ports (32768 and up: any outgoing connection may
# hold one), and none the product uses itself: the servers (30000 + instance, and SGLang's
# DP-attention ports up to + 13), their warm-ups (+ 1000), the router (30080) and its metrics
# (29000), DCGM's exporter (9400), nor torch's customary MASTER_PORT 29500.
EPHEMERAL = 32768
DIST_PORT = 20000


def dist_port(value: Any) -> str | None:
    if value >= EPHEMERAL:
        return (f"port {value} is in Linux's ephemeral range ({EPHEMERAL} and up): an outgoing "
                "connection may hold it when rank 0 binds it")
    return port(value)


_SECRET_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,63}$")


def secret_name(value: Any) -> str | None:
    if _SECRET_NAME.match(value) and not key_shaped(value):  # never the key pasted in its place
        return None
    return "must be the NAME of a secret (lower-case letters, digits, . _ -), never the key itself"


_ENV_NAME = re.compile(r"^[A-Z_][A-Z0-9_]*$")


def environment(value: Any) -> str | None:
    """A mapping of POSIX variable names, none of them one the product sets itself."""
    bad = [k for k in value if not _ENV_NAME.fullmatch(k)]
    if bad:
        return (f"invalid variable names: {', '.join(map(repr, bad))} (POSIX names: upper-case "
                "letters, digits and _, not starting with a digit)")
    reserved = [k for k in value if k in RESERVED_ENV]
    if reserved:
        return f"{reserved[0]} is set by the product (from {RESERVED_ENV[reserved[0]]})"
    if len(value) > MAX_ENV:
        return f"has {len(value)} variables; at most {MAX_ENV}"
    return None


def flag_words(value: Any) -> str | None:
    """Raw command-line words: a --flag first, and not too many (render checks each flag)."""
    if value and not value[0].startswith("--"):
        return f"must start with a --flag, got {value[0]!r}"
    if len(value) > MAX_EXTRA_ARGS:
        return f"has {len(value)} words; at most {MAX_EXTRA_ARGS}"
    return None


def instances(value: Any) -> str | None:
    """``auto`` or a number of servers per host."""
    if isinstance(value, str):
        return None if value == AUTO else f"must be auto or a number, got {value!r}"
    return between(1, MAX_INSTANCES)(value)


def warmup_mode(value: Any) -> str | None:
    if value is False:  # YAML reads a bare ``off`` as false
        return None
    return one_of(*WARMUP_MODES)(value)
