"""Text this package checks or shows: a URL (``url_problem``, never echoing its password) and
a server's text made safe for a terminal (``printable``). The deploy's config/validators.py
takes its forms from here; ``printable`` is a copy of the deploy's remote/terminal.py (a host
program, standard library only), and tests/unit/test_packaging.py fails when it differs.

    url_problem("http://user:pw@10.0.0.10:30080", allow_http=True)
    # "'http://10.0.0.10:30080' holds credentials (user:password@); give them ..."
    printable("\\x1b[2K\\rfake")   # '\\\\x1b[2K\\\\x0dfake'
"""

from __future__ import annotations

import ipaddress
import re
import unicodedata
from urllib.parse import urlsplit

_CONTROLS = [*range(0x20), *range(0x7F, 0xA0)]
_ONE_LINE = {code: f"\\x{code:02x}" for code in _CONTROLS if code != 0x09}
_LINES = {code: shown for code, shown in _ONE_LINE.items() if code != 0x0A}


def printable(text: str, lines: bool = False) -> str:
    """``text`` with its control characters shown as codes (``lines``: its newlines kept)."""
    return text.translate(_LINES if lines else _ONE_LINE)


MAX_TEXT = 4096  # characters in any one string value (a 50 MiB value would fail at exec)
_NAMES = {"\n": "a newline", "\r": "a carriage return", "\t": "a tab", "\x00": "a NUL byte",
          "\x1b": "an escape", "\u2028": "a line separator", "\u2029": "a paragraph separator",
          "\x85": "a next-line character"}


def control_char(value: str) -> str | None:
    """The first control character (or Unicode line break) in ``value``, described."""
    for i, ch in enumerate(value):
        if unicodedata.category(ch) in ("Cc", "Zl", "Zp"):
            name = _NAMES.get(ch, "")
            return (f"contains a control character (U+{ord(ch):04X}{', ' + name if name else ''})"
                    f" at position {i}")
    return None


def text_problem(value: str, max_len: int = MAX_TEXT) -> str | None:
    """What every string value must satisfy: not empty, not huge, no control characters and
    nothing systemd or a shell would expand (``${``, ``$(``, backticks)."""
    if not value.strip():
        return "is empty" if not value else "is only whitespace"
    if len(value) > max_len:
        return f"is {len(value)} characters long; at most {max_len} are accepted"
    wrong = control_char(value)
    if wrong:
        return wrong
    for token in ("${", "$(", "`"):
        if token in value:
            return (f"contains {token!r}, which a shell or systemd would expand; "
                    "values are taken literally and may not hold expansions")
    if value != value.strip():
        return "has leading or trailing whitespace"
    return None


_LABEL = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?")


def host_problem(value: str) -> str | None:
    """An IP address or a DNS host name (what a server may listen on or be reached at)."""
    try:
        ipaddress.ip_address(value)
        return None
    except ValueError:
        pass
    labels = value.rstrip(".").split(".")
    if (len(value) <= 253 and labels and all(_LABEL.fullmatch(label) for label in labels)
            and not labels[-1].isdigit()):
        return None
    return f"{value!r} is neither an IP address nor a host name"


_USERINFO = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*://)[^/?#]*@")


def without_userinfo(url: str) -> str:
    """``url`` as it may be shown: any ``user:password@`` dropped, even from a malformed URL.

    >>> without_userinfo("http://user:pass@10.0.0.9:30080/v1")
    'http://10.0.0.9:30080/v1'
    """
    return _USERINFO.sub(r"\1", url)


def url_problem(value: str, allow_http: bool) -> str | None:
    """An http(s) URL with a host; ``http://`` only when ``allow_http``. The sentence never
    holds the URL's userinfo (a password)."""
    wrong = text_problem(value, 2048)
    if wrong:
        return wrong
    shown = without_userinfo(value)
    if any(ch.isspace() for ch in value) or any(ch in value for ch in "\"'\\<>%{}|^"):
        return f"{shown!r} has characters a URL must not hold unescaped (spaces, quotes, % ...)"
    try:
        parts = urlsplit(value)
        port = parts.port
    except ValueError as exc:
        found = _USERINFO.match(value)
        secret = found.group(0)[len(found.group(1)):] if found else None
        detail = str(exc).replace(secret, "") if secret else str(exc)
        return f"{shown!r} is not a URL: {detail}"
    if parts.scheme not in ("http", "https"):
        start = "http:// or https://" if allow_http else "https://"
        return f"{shown!r} is not an http(s) URL (it must start with {start})"
    if parts.username or parts.password or "@" in parts.netloc:
        return (f"{shown!r} holds credentials (user:password@); give them through secrets "
                "or a key file, not in the URL")
    if not parts.hostname or host_problem(parts.hostname):
        return f"{shown!r} has no valid host"
    if port == 0:
        return f"{shown!r}: port 0"
    if parts.scheme == "http" and not allow_http:
        return f"{shown!r} is plain http: packages and keys fetched over it can be tampered with"
    return None
