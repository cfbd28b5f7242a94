"""What answered a job: the served model, its source and revision, the SGLang release, the
server's sampling defaults and its speculative decoding, read from ``/server_info`` (or the
router's ``/get_server_info``, which sglang-router answers from one worker) through the URL
the user named. Every record names it by a short digest; the manifest holds each one in full.

    fp = await read(pool, "http://10.0.0.10:30080")
    fp.digest  # "3f9a0c1d2e4b5a69"
    fp.fields  # {"served_model_name": "qwen3.6-27b", "version": "0.5.23", ...}

The fields are SGLang's ServerArgs names (0.5.10 - 0.5.23 server_args.py) and the ``version``
that ``/server_info`` adds.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

import httpx

from sglang_fleet_generate.http_pool import Pool
from sglang_fleet_generate.text import printable

FIELDS = ("served_model_name", "model_path", "revision", "version", "sampling_defaults",
          "preferred_sampling_params", "speculative_algorithm", "speculative_draft_model_path",
          "speculative_draft_model_revision", "speculative_num_steps", "speculative_eagle_topk",
          "speculative_num_draft_tokens")
MIXED_FLAG = "--allow-mixed"
UNKNOWN = "unknown"  # no /server_info through the URL (not an SGLang server or router)


@dataclass(frozen=True)
class Fingerprint:
    """The fields that decide what an answer is, and their digest (16 hex digits)."""

    fields: dict[str, Any]
    digest: str



def describe(f: dict[str, Any]) -> str:
    """One line for a message, the server's text shown safe (``terminal``).
    Example: "qwen3.6-27b (/models/q@abc), SGLang 0.5.23, EAGLE"."""
    if not f:
        return "an unknown configuration (no /server_info)"
    where = f.get("model_path") or "?"
    if f.get("revision"):
        where += f"@{f['revision']}"
    spec = f.get("speculative_algorithm") or "no speculative decoding"
    steps = f.get("speculative_num_steps")
    name = f.get("served_model_name") or str(f.get("model_path") or "?").rstrip("/") \
        .rsplit("/", 1)[-1]
    return printable(f"{name} ({where}), SGLang {f.get('version') or '?'}, {spec}"
                     + (f" x{steps}" if steps else ""))


def from_info(info: dict[str, Any]) -> Fingerprint:
    """The fingerprint of a ``/server_info`` answer (a field it lacks is None)."""
    fields = {name: info.get(name) for name in FIELDS}
    text = json.dumps(fields, sort_keys=True, separators=(",", ":"), default=str)
    return Fingerprint(fields, hashlib.sha256(text.encode()).hexdigest()[:16])


async def read(http: Pool, url: str) -> Fingerprint | None:
    """The fleet's fingerprint through ``url`` (a server's ``/server_info``, else a router's
    ``/get_server_info``); None when neither answers with one."""
    for path in ("/server_info", "/get_server_info"):
        try:
            response = await http.get(f"{url}{path}", 10)
            info = response.json() if response.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            continue
        if isinstance(info, dict) and info.get("model_path"):
            return from_info(info)
    return None


def differences(old: dict[str, Any], new: dict[str, Any]) -> str:
    """The fields that differ, for a message. Example: "version 0.5.22 -> 0.5.23"."""
    return ", ".join(f"{k} {old.get(k)!r} -> {new.get(k)!r}" for k in FIELDS
                     if old.get(k) != new.get(k))
