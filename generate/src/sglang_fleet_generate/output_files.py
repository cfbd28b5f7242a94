"""The files a job keeps on its output, by name, and the manifest's entry for each: what the
job writes (job.py, ledger.py, commits.py) and what ``sglang-fleet results`` reads (results.py)
agree here. The layout itself is described in job.py's docstring.

    shard_name(12)                                # 'shard-000012.jsonl'
    retry_name(2, share=(0, 3))                   # 'retry-002-0-of-3.jsonl'
    shard_index("shard-000012.jsonl", "shard-")   # 12
    manifest_share("manifest-1-of-3.json")        # (1, 3)
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Literal

import orjson

from sglang_fleet_generate.identity import DIGEST_KEY
from sglang_fleet_generate.lease import share_of
from sglang_fleet_generate.store import share_suffix

MANIFEST = "manifest.json"
FENCE_KEY = "fence"  # the run that wrote an entry's files: their x-amz-meta-fence (store.py)


def shard_name(index: int) -> str:
    return f"shard-{index:06d}.jsonl"


def failures_name(index: int) -> str:
    return f"failures-{index:06d}.jsonl"


def manifest_name(share: tuple[int, int] | None = None) -> str:
    """``manifest.json`` for a whole job, ``manifest-K-of-N.json`` for worker K of N."""
    return f"manifest{share_suffix(share)}.json"


def retry_name(round_: int, share: tuple[int, int] | None = None) -> str:
    return f"retry-{round_:03d}{share_suffix(share)}.jsonl"


def retry_failures_name(round_: int, share: tuple[int, int] | None = None) -> str:
    return f"retry-failures-{round_:03d}{share_suffix(share)}.jsonl"


def gathered_failures_name(share: tuple[int, int] | None = None) -> str:
    return f"failures{share_suffix(share)}.jsonl"


def shard_index(name: str, prefix: str, share: tuple[int, int] | None = None) -> int | None:
    """``shard-000012.jsonl`` -> 12 for prefix "shard-"; with ``share``, only names that
    carry its suffix (``retry-002-0-of-3.jsonl`` -> 2 for share (0, 3))."""
    suffix = share_suffix(share) + ".jsonl"
    stem = name.removeprefix(prefix).removesuffix(suffix)
    if name.startswith(prefix) and name.endswith(suffix) and stem.isdigit():
        return int(stem)
    return None


def manifest_share(name: str) -> tuple[int, int] | Literal[False] | None:
    """The share a manifest's name says (None: the whole job's), False if not a manifest.
    Example: manifest_share("manifest-1-of-3.json") == (1, 3)."""
    return share_of(name.removesuffix(".json"), "manifest") if name.endswith(".json") \
        else False


def shard_entry(index: int, size: int, records: int, failures: int, data_sha: str,
                nbytes: int, input_digest: str | None = None,
                fence: str | None = None) -> dict[str, Any]:
    """A shard's manifest entry; ``fence``: the fencing token its files carry (S3).
    Example: shard_entry(2, 1000, 998, 2, "ab..", 51234)
    == {"name": "shard-000002.jsonl", "first_line": 2001, "records": 998, ...}."""
    entry = {"name": shard_name(index), "first_line": index * size + 1, "records": records,
             "failures": failures, "bytes": nbytes, "sha256": data_sha}
    if input_digest is not None:
        entry[DIGEST_KEY] = input_digest
    return fenced(entry, fence)


def round_entry(round_: int, records: int, failures: int, data_sha: str,
                nbytes: int, share: tuple[int, int] | None = None,
                fence: str | None = None) -> dict[str, Any]:
    """A --retry-failures round's manifest entry (no input digest: a round has no range)."""
    return fenced({"name": retry_name(round_, share), "round": round_, "records": records,
                   "failures": failures, "bytes": nbytes, "sha256": data_sha}, fence)


def fenced(entry: dict[str, Any], fence: str | None) -> dict[str, Any]:
    return entry if fence is None else {**entry, FENCE_KEY: fence}


def entry_files(entry: dict[str, Any]) -> list[str]:
    """A shard entry's files on the output. Example: ["shard-000002.jsonl",
    "failures-000002.jsonl"] for a shard with failed lines."""
    index = shard_index(entry["name"], "shard-")
    return [entry["name"]] + ([failures_name(index)] if entry["failures"] and index is not None
                              else [])


def failure_names(done: dict[int, dict[str, Any]], rounds: dict[int, dict[str, Any]],
                  share: tuple[int, int] | None = None) -> list[str]:
    """The failures files listing the lines still without a record: the last retry round's,
    else every shard's (by index). Example: ["failures-000000.jsonl", "failures-000007.jsonl"]
    before any round, ["retry-failures-002.jsonl"] after two."""
    if rounds:
        last = max(rounds)
        return [retry_failures_name(last, share)] if rounds[last]["failures"] else []
    return [failures_name(i) for i, e in sorted(done.items()) if e["failures"]]


def id_key(ident: str) -> int:
    """8 bytes of an id's digest: 1M ids in tens of MB."""
    return int.from_bytes(hashlib.blake2b(ident.encode(), digest_size=8).digest(), "big")


def dump_line(data: dict[str, Any]) -> bytes:
    """One JSONL line, compact UTF-8 (orjson: a tenth of json's CPU; json for what orjson
    refuses, e.g. an integer beyond 64 bits in an answer).

    Example: dump_line({"id": "é", "n": None}) == '{"id":"é","n":null}\n'.encode()
    """
    try:
        return orjson.dumps(data, option=orjson.OPT_APPEND_NEWLINE)
    except TypeError:  # orjson.JSONEncodeError is a TypeError
        return json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"
