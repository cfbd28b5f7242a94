"""``cache_copy pack``: the copied caches under the service's cache directory and a manifest
into a gzip archive, read through descriptors (O_NOFOLLOW at every component): only real
directories and regular files go in, never a link, a device or a name starting with ``.`` (a
build under way); ownership and modes are not kept (root's, 0644 or 0755); refused past its
bound of entries and bytes, so nothing over it is shared. Standard library only: runs on the
host with cache_copy.

    pack("/var/cache/sglang", "0123456789abcdef", {"release": "0.5.23"},
         "/var/cache/sglang-fleet/cache-copy/0123456789abcdef.tar.gz", Bound(100_000, 4))
    # {'ok': True, 'files': 42, 'bytes': 9000000, 'archive_bytes': 3000000, 'sha256': '...'}
"""

from __future__ import annotations

import contextlib
import errno
import io
import json
import os
import stat
import tarfile
import time
from typing import IO, Any

from sglang_fleet.remote.prune_caches import open_below, open_root

from .cache_archive import (
    COPIED,
    DIRECTORY,
    MANIFEST,
    MAX_DEPTH,
    NEW_FILE,
    Bound,
    Refused,
    sha256_of,
)


def _info(name: str, kind: bytes, size: int = 0, mode: int = 0o755) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.size, info.mode, info.mtime = kind, size, mode, int(time.time())
    return info


class _Archive:
    """The archive being written, its files and bytes so far, refused past its bound before a
    member goes in (the service user may have filled the cache with anything)."""

    def __init__(self, tar: tarfile.TarFile, bound: Bound) -> None:
        self.tar, self.bound = tar, bound
        self.entries = self.files = self.size = 0

    def add(self, info: tarfile.TarInfo, source: IO[bytes] | None = None) -> None:
        self.entries, self.size = self.entries + 1, self.size + info.size
        over = self.bound.over(self.entries, self.size)
        if over:
            raise Refused(f"the kernels under {', '.join(COPIED)} come to {over}: not shared")
        self.files += info.isreg()
        self.tar.addfile(info, source)


def _add_tree(archive: _Archive, fd: int, name: str, depth: int) -> None:
    """The real directories and regular files below ``fd`` into the archive under ``name``.
    Names starting with ``.`` (builds under way) and anything else (links, devices, sockets,
    FIFOs) are left out."""
    archive.add(_info(name, tarfile.DIRTYPE))
    with os.scandir(fd) as entries:
        names = sorted(e.name for e in entries if not e.name.startswith("."))
    for child in names:
        st = os.stat(child, dir_fd=fd, follow_symlinks=False)
        if stat.S_ISDIR(st.st_mode) and depth < MAX_DEPTH:
            sub = os.open(child, DIRECTORY, dir_fd=fd)
            try:
                _add_tree(archive, sub, f"{name}/{child}", depth + 1)
            finally:
                os.close(sub)
        elif stat.S_ISREG(st.st_mode):
            _add_file(archive, fd, child, f"{name}/{child}")


def _add_file(archive: _Archive, fd: int, child: str, name: str) -> None:
    """One regular file (checked again once open: it may have been swapped); left out when
    it is no longer a regular file."""
    try:
        handle = os.open(child, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK,
                         dir_fd=fd)
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ELOOP):
            return
        raise
    with os.fdopen(handle, "rb") as source:
        st = os.fstat(source.fileno())
        if stat.S_ISREG(st.st_mode):
            mode = 0o755 if st.st_mode & stat.S_IXUSR else 0o644
            archive.add(_info(name, tarfile.REGTYPE, st.st_size, mode), source)


def pack(root: str, digest: str, inputs: dict[str, Any], out: str,
         bound: Bound) -> dict[str, Any]:
    """The copied caches and a manifest into ``out`` (root's, 0600); Refused past ``bound``."""
    os.makedirs(os.path.dirname(out), mode=0o700, exist_ok=True)
    part = f"{out}.part"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(part)
    root_fd = open_root(root)
    try:
        with os.fdopen(os.open(part, NEW_FILE, 0o600), "wb") as raw, \
                tarfile.open(fileobj=raw, mode="w:gz", compresslevel=1,
                             format=tarfile.PAX_FORMAT) as tar:
            archive = _Archive(tar, bound)
            manifest = json.dumps({"digest": digest, "inputs": inputs}, sort_keys=True).encode()
            archive.add(_info(MANIFEST, tarfile.REGTYPE, len(manifest), 0o644),
                        io.BytesIO(manifest))
            for top in COPIED:
                fd = open_below(root_fd, top)
                if fd is None:
                    continue
                try:
                    parents = top.split("/")[:-1]
                    for i in range(len(parents)):
                        archive.add(_info("/".join(parents[:i + 1]), tarfile.DIRTYPE))
                    _add_tree(archive, fd, top, 1)
                finally:
                    os.close(fd)
    finally:
        os.close(root_fd)
    with open(part, "rb") as done:
        sha = sha256_of(done)
    os.replace(part, out)
    # the manifest is not a kernel file
    return {"ok": True, "files": archive.files - 1, "bytes": archive.size - len(manifest),
            "archive_bytes": os.path.getsize(out), "sha256": sha}
