"""Strings as systemd reads them back: ExecStart words, EnvironmentFile lines, free text in a unit
(Description, comments) and IP allow-lists. Nothing a profile, host data or a server supplies
is ever expanded by systemd (no ``$VAR``, no ``%`` specifier) or starts a line of its own.

    exec_start = " ".join(systemd_word(w) for w in argv)
    env_line("SGLANG_API_KEY", key)
"""

from __future__ import annotations

import ipaddress
import re

_PLAIN = re.compile(r"[A-Za-z0-9_@%+=:,./-]+")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


class UnsafeValue(ValueError):
    """A value that cannot be written into a unit or environment file as it is."""


def _no_nul(value: str, what: str) -> None:
    if "\x00" in value:
        raise UnsafeValue(f"{what} holds a NUL byte: {value!r}")


def systemd_word(word: str) -> str:
    """One argv word as ExecStart passes it on literally: ``$`` and ``%`` escaped, anything but
    plain characters in double quotes with C escapes (systemd.syntax(7))."""
    _no_nul(word, "a command-line word")
    escaped = word.replace("%", "%%").replace("$", "$$")
    if _PLAIN.fullmatch(escaped):
        return escaped
    escaped = escaped.replace("\\", "\\\\").replace('"', '\\"')
    return '"' + _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", escaped) + '"'


def unit_text(value: str) -> str:
    """Free text for a unit's Description= or a comment: one line, no specifiers."""
    return _CONTROL.sub("?", value).replace("%", "%%")


def env_line(name: str, value: str) -> str:
    """``NAME=value`` as systemd's EnvironmentFile reads it back literally (single quotes;
    double quotes with backslash escapes when the value holds a single quote)."""
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        raise UnsafeValue(f"{name!r} is not an environment variable name")
    if _CONTROL.search(value):
        raise UnsafeValue(f"the value of {name} holds a control character (newline, NUL, …)")
    if "'" not in value and "\\" not in value:
        return f"{name}='{value}'"
    return f'{name}="' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def networks(values: list[str]) -> list[str]:
    """CIDRs or addresses as ``IPAddressAllow=`` takes them, normalised; UnsafeValue if one is
    not an IP network."""
    out = []
    for value in values:
        try:
            out.append(str(ipaddress.ip_network(str(value), strict=False)))
        except ValueError:
            raise UnsafeValue(f"{value!r} is not an IP address or CIDR network") from None
    return out
