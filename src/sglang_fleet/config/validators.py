"""Strict forms for every string that comes from a profile, host data or the command line.

Each function returns what is wrong with a value (a sentence), or None when it is fine:

    >>> text_problem("qwen3.6-27b\\n")
    'contains a control character (U+000A, a newline) at position 11'
    >>> pep508_problem("sglang; rm -rf /") is not None
    True

The forms are strict but realistic: what a real package name, model path, bucket, host name or
URL needs, and nothing a shell, systemd (``$``, ``%``) or a unit file line could misread.
"""

from __future__ import annotations

import ipaddress
import math
import re
import unicodedata
from urllib.parse import urlsplit

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


def finite_problem(value: float) -> str | None:
    return None if math.isfinite(value) else f"must be a finite number, got {value}"


# A credential pasted where a secret's NAME belongs: 32 hex digits (a hex key, a digest), a UUID,
# a token's prefix (OpenAI, Hugging Face, GitHub, GitLab, Slack) before 16 random characters, or
# 24 letters and digits mixed: what names people give secrets never look like these.
_KEY_SHAPED = re.compile(
    r"[0-9a-f]{32}|[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}"
    r"|(^|[^a-z0-9])(sk|pk|rk|hf|gh[oprsu]|github_pat|glpat|xox[abpr])[-_][a-z0-9_-]*[a-z0-9]{16}"
    r"|(?=[a-z]*[0-9])(?=[0-9]*[a-z])[a-z0-9]{24}", re.IGNORECASE)


def key_shaped(value: str) -> bool:
    """Whether a secret's NAME looks like a key or token (refuse it, and never print it).

        >>> key_shaped("sglang-api-key"), key_shaped("sk-" + "3f9a" * 6)
        (False, True)
    """
    return _KEY_SHAPED.search(value) is not None


# PEP 508 names (also used for extras): letters and digits, with . _ - inside.
_PEP508 = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?")


def pep508_problem(value: str) -> str | None:
    if _PEP508.fullmatch(value) and len(value) <= 128:
        return None
    return (f"{value!r} is not a package name (PEP 508: letters, digits and . _ - inside, "
            "no version, marker, URL or spaces)")


_MODULE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*")


def module_problem(value: str) -> str | None:
    if _MODULE.fullmatch(value) and len(value) <= 200:
        return None
    return f"{value!r} is not a Python module name (dotted identifiers, e.g. sglang.launch_server)"


_WORD = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


def word_problem(value: str) -> str | None:
    """Names SGLang picks from a list: parsers, backends, algorithms."""
    if _WORD.fullmatch(value):
        return None
    return f"{value!r} is not a name (letters, digits, _ . -; at most 64 characters)"


_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")


def identifier_problem(value: str) -> str | None:
    if _IDENT.fullmatch(value):
        return None
    return f"{value!r} is not a Python class name (as in config.json's architectures)"


_SERVED = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,127}")


def served_name_problem(value: str) -> str | None:
    if _SERVED.fullmatch(value):
        return None
    return (f"{value!r} is not a model name: letters, digits and . _ : / @ + - (no spaces, "
            "quotes, $ or %), at most 128 characters, starting with a letter or digit")


# Path segments of model sources: letters, digits and . _ + = @ , -; never "." or "..".
_SEGMENT = re.compile(r"[A-Za-z0-9._+=@,-]+")
_HF_PART = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9])?")
_HF_REVISION = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
SOURCE_FORMS = ("hf://ORG/NAME@REVISION (revision: a branch, tag or commit), "
                "s3://BUCKET/PREFIX, or /an/absolute/path; path parts use letters, digits "
                "and . _ + = @ , - only")


def _segments_problem(path: str) -> str | None:
    for part in path.split("/"):
        if part and not _SEGMENT.fullmatch(part):
            return f"path part {part!r} has characters a model path never needs"
        if part in (".", ".."):
            return f"path part {part!r} is not allowed"
    if "//" in path:
        return "has an empty path part (//)"
    return None


def model_source_problem(value: str) -> str | None:
    """``hf://org/name@revision``, ``s3://bucket/prefix`` or an absolute path, strictly."""
    if len(value) > 1024:
        return "is longer than 1024 characters"
    if value.startswith("hf://"):
        repo, at, revision = value[5:].partition("@")
        parts = repo.split("/")
        if len(parts) != 2 or not all(_HF_PART.fullmatch(p) for p in parts):
            return f"{value!r}: the repository must be ORG/NAME (letters, digits, . _ -)"
        if not at:
            return (f"{value!r} has no pinned revision (a commit, @ and its 40 hex digits; a "
                    "branch such as @main or a tag works, but moves)")
        if not _HF_REVISION.fullmatch(revision) or ".." in revision:
            return (f"{value!r}: the revision must be a branch, tag or commit "
                    "(letters, digits, . _ -)")
        return None
    if value.startswith("s3://"):
        bucket, _, prefix = value[5:].partition("/")
        if not _BUCKET.fullmatch(bucket) or ".." in bucket:
            return f"{value!r}: {bucket!r} is not an S3 bucket name (lower-case, digits, . -)"
        wrong = _segments_problem(prefix.rstrip("/"))
        return f"{value!r}: {wrong}" if wrong else None
    if value.startswith("/"):
        if value == "/":
            return "'/' is not a model directory"
        wrong = _segments_problem(value[1:].rstrip("/"))
        return f"{value!r}: {wrong}" if wrong else None
    return f"{value!r} is not {SOURCE_FORMS}"


_COMMIT = re.compile(r"[0-9a-fA-F]{40}")


def revision_warning(value: str) -> str | None:
    """Why an ``hf://`` source's revision may not name the same weights tomorrow, or None: a
    branch (``@main``) or a tag moves, and each host keeps what it staged first, so hosts
    staged on different days would serve different weights under one name. A commit (40 hex
    digits) does not move. (Not an error: a source that is valid stays valid.)

    >>> revision_warning("hf://Qwen/Qwen3.6-27B@main")[:52]
    "'hf://Qwen/Qwen3.6-27B@main' names a branch or a tag"
    >>> revision_warning("hf://org/m@" + "ab12" * 10) is None
    True
    """
    if not value.startswith("hf://"):
        return None
    revision = value.partition("@")[2]
    if _COMMIT.fullmatch(revision):
        return None
    return (f"{value!r} names a branch or a tag ({revision!r}), not a commit: it moves, and "
            "each host keeps the weights it staged first, so hosts staged at different times "
            "serve different weights")


REVISION_FIX = ("pin the commit: hf://ORG/NAME@ and the commit's 40 hex digits (the hub's "
                "history of the model, or `git ls-remote https://huggingface.co/ORG/NAME "
                "REVISION`)")


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
