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

import math
import re

# The forms every string, host and URL must have: one code with the batch client, which depends
# on no part of the deploy (the deploy depends on it).
from sglang_fleet_generate.text import MAX_TEXT as MAX_TEXT
from sglang_fleet_generate.text import control_char as control_char
from sglang_fleet_generate.text import host_problem as host_problem
from sglang_fleet_generate.text import text_problem as text_problem
from sglang_fleet_generate.text import url_problem as url_problem
from sglang_fleet_generate.text import without_userinfo as without_userinfo


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
