"""What a compiled-kernel archive of cache_copy may hold, checked before anything is written
(``checked``, ``manifest_of``, ``sha256_of``), and the descriptor helpers pack and unpack share
(standard library only: runs on the host with cache_copy).

    with tarfile.open(fileobj=stream, mode="r:gz") as tar:
        members = checked(tar, Bound(100_000, 4))   # Refused at the first member wrong
        manifest = manifest_of(tar, members)   # {"digest": ..., "inputs": {...}}
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tarfile
from dataclasses import dataclass
from typing import IO, Any

# DeepGEMM's kernels (SGLANG_DG_CACHE_DIR is <root>/deep_gemm): a directory per kernel under
# cache/, "kernel.{}.{}" holding kernel.cu and kernel.cubin, built elsewhere and renamed into
# place (strings of deep_gemm/_C.so, sgl-deep-gemm 0.1.2: "cache", "kernel.{}.{}", "Corrupted
# JIT cache directory (missing kernel.cu or kernel.cubin)"; 0.2.3.post2: "cache", "{}.{}",
# std::filesystem::rename). Locks and builds under way stay behind.
COPIED = ("deep_gemm/cache",)
MANIFEST = "MANIFEST.json"
MAX_DEPTH = 16
DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_CONTROL = re.compile(r"[\x00-\x1f\x7f\\]")
CHUNK = 1 << 20


class Refused(Exception):
    """The archive (or the cache) is not what it may be; nothing was written."""


@dataclass(frozen=True)
class Bound:
    """How much an archive may hold: its members and its files' bytes (host data sets both)."""

    entries: int
    gib: int

    def over(self, entries: int, size: int) -> str | None:
        """What ``entries`` members of ``size`` bytes in all go past, or None.

            Bound(100, 4).over(101, 0)   # 'more than 100 entries (host data ...)'
        """
        if entries > self.entries:
            past = f"{self.entries} entries (host data kernel_share_max_entries"
        elif size > self.gib << 30:
            past = f"{self.gib} GiB (host data kernel_share_max_gib"
        else:
            return None
        return f"more than {past}; raise it to share more)"


def _allowed(name: str) -> bool:
    """A member's name the archive may hold: the manifest, a copied directory or what lies
    below one, or a directory above one (``deep_gemm``)."""
    if name == MANIFEST:
        return True
    return any(name == top or name.startswith(f"{top}/") or top.startswith(f"{name}/")
               for top in COPIED)


def member_problem(member: tarfile.TarInfo) -> str | None:
    """Why ``member`` may not be extracted, or None.

        member_problem(tarfile.TarInfo("../etc/passwd"))   # "has a '..' part"
    """
    name = member.name
    if not name or name.startswith("/"):
        return "is not a relative name"
    if _CONTROL.search(name):
        return "has a control character or a backslash"
    parts = name.split("/")
    if any(part in ("", ".", "..") for part in parts):
        return "has an empty, '.' or '..' part"
    if len(parts) > MAX_DEPTH or len(name) > 4096 or any(len(p) > 255 for p in parts):
        return "is too deep or too long"
    if member.type not in (tarfile.REGTYPE, tarfile.AREGTYPE, tarfile.DIRTYPE):
        return "is not a regular file or a directory (a link, device, FIFO or sparse file)"
    if member.linkname:
        return "names a link target"
    if not _allowed(name):
        return f"is outside {', '.join(COPIED)}"
    if name == MANIFEST and not member.isreg():
        return "is not a regular file"
    if member.size < 0:
        return "has a negative size"
    return None


def checked(tar: tarfile.TarFile, bound: Bound) -> list[tarfile.TarInfo]:
    """Every member of ``tar``, each allowed, no name twice, no file under a file or where a
    directory is, and all within ``bound``; Refused (naming the first one wrong) otherwise."""
    members: list[tarfile.TarInfo] = []
    kinds: dict[str, bool] = {}  # name -> is a directory
    below: set[str] = set()  # every directory some member lies under
    total = 0
    for member in tar:
        parts = member.name.split("/")
        above = {"/".join(parts[:i]) for i in range(1, len(parts))}
        problem = member_problem(member)
        if problem is None and member.name in kinds:
            problem = "is in the archive twice"
        if problem is None and any(kinds.get(p) is False for p in above):
            problem = "lies under a file of the archive"
        if problem is None and not member.isdir() and (member.name in below or any(
                top == member.name or top.startswith(f"{member.name}/") for top in COPIED)):
            problem = "is a file where a directory belongs"
        total += max(member.size, 0)
        over = bound.over(len(members) + 1, total)
        if problem is None and over:
            problem = f"makes it {over}"
        if problem:
            raise Refused(f"the archive's member {member.name[:200]!r} {problem}: nothing "
                          "was extracted")
        kinds[member.name] = member.isdir()
        below |= above
        members.append(member)
    return members


def manifest_of(tar: tarfile.TarFile, members: list[tarfile.TarInfo]) -> dict[str, Any]:
    """The archive's ``MANIFEST.json`` (Refused when it has none or it is not JSON)."""
    found = [m for m in members if m.name == MANIFEST]
    data = tar.extractfile(found[0]) if found and found[0].size <= 1 << 20 else None
    if data is None:
        raise Refused(f"the archive has no {MANIFEST} (at most 1 MiB)")
    try:
        manifest = json.loads(data.read())
    except ValueError:
        manifest = None
    if not isinstance(manifest, dict):
        raise Refused(f"the archive's {MANIFEST} is not a JSON object")
    return manifest


def sha256_of(stream: IO[bytes]) -> str:
    digest = hashlib.sha256()
    while chunk := stream.read(CHUNK):
        digest.update(chunk)
    return digest.hexdigest()
