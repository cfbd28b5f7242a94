"""URLs the product fetches from as root (package repositories, indexes, wheel links): https
only, unless the inventory says ``allow_insecure_urls`` (a lab, a closed site mirror).

    base = checked_url(data.get("nvidia_repo_base_url"), "pyinfra data of h1",
                       "nvidia_repo_base_url", insecure_ok=False)
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

from sglang_fleet.errors import InputError

_SAFE = re.compile(r"[A-Za-z0-9._~:/?#\[\]@!&'()*+,;=%-]+")


def checked_url(value: object, source: str, key: str, insecure_ok: bool) -> str:
    """``value`` if it is an https (or, allowed, http) URL with a host and nothing a shell or a
    unit file would read specially; else an InputError naming ``key``."""
    text = str(value)
    parts = urlsplit(text) if _SAFE.fullmatch(text) else None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
        raise InputError.one(source, key, f"{text!r} is not an http(s) URL",
                             "e.g. https://mirror.example.com/path")
    if parts.scheme == "http" and not insecure_ok:
        raise InputError.one(source, key, f"{text} is plain http: what root installs from it "
                             "could be changed on the way",
                             "use https://, or set allow_insecure_urls = True for a trusted "
                             "network (a lab, a closed mirror)")
    return text
