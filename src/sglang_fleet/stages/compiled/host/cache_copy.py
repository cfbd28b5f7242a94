"""Packs and unpacks a host's compiled kernels, so identical hosts compile once per fleet
(standard library only: system python, run as root).

    python -m ...cache_copy pack --root /var/cache/sglang --digest D \\
        --inputs JSON --out /var/cache/sglang-fleet/cache-copy/D.tar.gz \\
        --max-entries 100000 --max-gib 4
    python -m ...cache_copy unpack --root /var/cache/sglang --digest D \\
        --sha256 H --archive /var/cache/sglang-fleet/cache-copy/D.tar.gz --user sglang \\
        --record /var/cache/sglang-fleet/compiled/RELEASE-D.json --source b200-01 \\
        --max-entries 100000 --max-gib 4
    python -m ...cache_copy record --record PATH --digest D --inputs JSON

What is copied: DeepGEMM's finished kernels (``deep_gemm/cache/kernel.<name>.<digest>/``, each
published by a rename once built, so a directory there is whole), and ``MANIFEST.json`` naming the
digest of what they were compiled for. The service user writes the cache, and a compromised
server may, so ``pack`` (cache_pack.py) reads it through descriptors and keeps only real
directories and regular files, and ``unpack`` (cache_unpack.py) checks the archive's sha256 and
every member (cache_archive.py ``checked``) before it writes anything, as the service user.
Root then records the digest (``--record``, in root's own directory).

Prints one ``CACHECOPY <json>`` line; exit 0 when it did its job, 1 otherwise (``error`` says why).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import sys
import tarfile
import time
import zlib
from typing import Any

from .cache_archive import NEW_FILE, Bound, Refused
from .cache_pack import pack
from .cache_unpack import unpack

_DIGEST = re.compile(r"[0-9a-f]{16,64}")
_SHA256 = re.compile(r"[0-9a-f]{64}")


def write_record(path: str, record: dict[str, Any]) -> None:
    """``record`` as JSON at ``path`` (root's directory), whole or absent."""
    os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
    part = f"{path}.part"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(part)
    with os.fdopen(os.open(part, NEW_FILE, 0o644), "w") as out:
        json.dump(record, out, sort_keys=True)
    os.replace(part, path)


def _json_object(text: str) -> dict[str, Any]:
    found = json.loads(text)
    if not isinstance(found, dict):
        raise ValueError("not a JSON object")
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sglang_fleet.stages.compiled.host.cache_copy")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("pack", "unpack", "record"):
        one = sub.add_parser(name)
        one.add_argument("--digest", required=True)
        if name != "record":
            one.add_argument("--root", required=True, help="the service's cache directory")
        if name != "unpack":
            one.add_argument("--inputs", required=True, type=_json_object)
    sub.choices["pack"].add_argument("--out", required=True)
    for name in ("pack", "unpack"):  # host data kernel_share_max_entries and _max_gib
        sub.choices[name].add_argument("--max-entries", required=True, type=int)
        sub.choices[name].add_argument("--max-gib", required=True, type=int)
    for name in ("unpack", "record"):
        sub.choices[name].add_argument("--record", required=True)
    unpacking = sub.choices["unpack"]
    for option in ("--archive", "--sha256", "--user", "--source"):
        unpacking.add_argument(option, required=True)
    args = parser.parse_args(argv)
    if not _DIGEST.fullmatch(args.digest):
        parser.error(f"--digest {args.digest!r}: 16 to 64 lower-case hex digits")
    for path in (getattr(args, p, None) for p in ("root", "out", "archive", "record")):
        if path is not None and (not path.startswith("/") or ".." in path.split("/")):
            parser.error(f"{path!r}: an absolute path without '..'")
    bound = Bound(getattr(args, "max_entries", 0), getattr(args, "max_gib", 0))
    try:
        if args.command == "pack":
            result = pack(args.root, args.digest, args.inputs, args.out, bound)
        elif args.command == "record":
            write_record(args.record, {"digest": args.digest, "inputs": args.inputs,
                                       "source": "compiled here", "at": time.time()})
            result = {"ok": True}
        else:
            if not _SHA256.fullmatch(args.sha256):
                parser.error(f"--sha256 {args.sha256!r}: 64 lower-case hex digits")
            result = unpack(args.archive, args.sha256, args.digest, args.root, args.user,
                            bound)
            write_record(args.record, {"digest": args.digest, "inputs": result.pop("inputs"),
                                       "source": f"received from {args.source}",
                                       "at": time.time()})
    except (Refused, OSError, tarfile.TarError, zlib.error, EOFError) as exc:
        print("CACHECOPY " + json.dumps({"ok": False, "error": str(exc)}), flush=True)
        return 1
    print("CACHECOPY " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
