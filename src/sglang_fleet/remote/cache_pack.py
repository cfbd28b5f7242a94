"""``cache_copy pack``: the copied caches under the service's cache directory and a manifest
into a gzip archive, read through descriptors (O_NOFOLLOW at every component): only real
directories and regular files go in, never a link, a device or a name starting with ``.`` (a
build under way); ownership and modes are not kept (root's, 0644 or 0755). Standard library
only: runs on the host with cache_copy.

    pack("/var/cache/sglang", "0123456789abcdef", {"release": "0.5.23"},
         "/var/cache/sglang-fleet/cache-copy/0123456789abcdef.tar.gz")
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
from typing import Any

from .cache_archive import COPIED, DIRECTORY, MANIFEST, MAX_DEPTH, NEW_FILE, open_below, sha256_of
from .prune_caches import open_root  # uploaded to the host with this module


def _info(name: str, kind: bytes, size: int = 0, mode: int = 0o755) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.size, info.mode, info.mtime = kind, size, mode, int(time.time())
    return info


def _add_tree(tar: tarfile.TarFile, fd: int, name: str, depth: int) -> tuple[int, int]:
    """The real directories and regular files below ``fd`` into ``tar`` under ``name``: how
    many files and bytes. Names starting with ``.`` (builds under way) and anything else
    (links, devices, sockets, FIFOs) are left out."""
    tar.addfile(_info(name, tarfile.DIRTYPE))
    files = size = 0
    with os.scandir(fd) as entries:
        names = sorted(e.name for e in entries if not e.name.startswith("."))
    for child in names:
        st = os.stat(child, dir_fd=fd, follow_symlinks=False)
        if stat.S_ISDIR(st.st_mode) and depth < MAX_DEPTH:
            sub = os.open(child, DIRECTORY, dir_fd=fd)
            try:
                more, grown = _add_tree(tar, sub, f"{name}/{child}", depth + 1)
            finally:
                os.close(sub)
            files, size = files + more, size + grown
        elif stat.S_ISREG(st.st_mode):
            done = _add_file(tar, fd, child, f"{name}/{child}")
            files, size = files + (done >= 0), size + max(done, 0)
    return files, size


def _add_file(tar: tarfile.TarFile, fd: int, child: str, name: str) -> int:
    """One regular file (checked again once open: it may have been swapped); its size, or -1
    when it is no longer a regular file."""
    try:
        handle = os.open(child, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK,
                         dir_fd=fd)
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ELOOP):
            return -1
        raise
    with os.fdopen(handle, "rb") as source:
        st = os.fstat(source.fileno())
        if not stat.S_ISREG(st.st_mode):
            return -1
        mode = 0o755 if st.st_mode & stat.S_IXUSR else 0o644
        tar.addfile(_info(name, tarfile.REGTYPE, st.st_size, mode), source)
        return st.st_size


def pack(root: str, digest: str, inputs: dict[str, Any], out: str) -> dict[str, Any]:
    """The copied caches under ``root`` and a manifest into ``out`` (root's, 0600)."""
    os.makedirs(os.path.dirname(out), mode=0o700, exist_ok=True)
    part = f"{out}.part"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(part)
    root_fd = open_root(root)
    files = size = 0
    try:
        with os.fdopen(os.open(part, NEW_FILE, 0o600), "wb") as raw, \
                tarfile.open(fileobj=raw, mode="w:gz", compresslevel=1,
                             format=tarfile.PAX_FORMAT) as tar:
            manifest = json.dumps({"digest": digest, "inputs": inputs}, sort_keys=True).encode()
            tar.addfile(_info(MANIFEST, tarfile.REGTYPE, len(manifest), 0o644),
                        io.BytesIO(manifest))
            for top in COPIED:
                fd = open_below(root_fd, top)
                if fd is None:
                    continue
                try:
                    parents = top.split("/")[:-1]
                    for i in range(len(parents)):
                        tar.addfile(_info("/".join(parents[:i + 1]), tarfile.DIRTYPE))
                    more, grown = _add_tree(tar, fd, top, 1)
                finally:
                    os.close(fd)
                files, size = files + more, size + grown
    finally:
        os.close(root_fd)
    with open(part, "rb") as done:
        sha = sha256_of(done)
    os.replace(part, out)
    return {"ok": True, "files": files, "bytes": size, "archive_bytes": os.path.getsize(out),
            "sha256": sha}
