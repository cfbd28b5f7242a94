"""``cache_copy unpack``: a checked archive written as the service user (root forks, the child
drops to that user's uid and gids), through descriptors, into a new directory of the cache,
then each kernel renamed into place unless the cache has it: the files end the service user's,
as the ones it compiles itself. Standard library only: runs on the host with cache_copy.

    unpack("/var/cache/sglang-fleet/cache-copy/D.tar.gz", sha256, "D", "/var/cache/sglang",
           "sglang", Bound(100_000, 4))
    # {'ok': True, 'placed': 40, 'kept': 2, 'inputs': {...}}
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import secrets
import stat
import tarfile
from typing import IO, Any

from sglang_fleet.remote.prune_caches import open_below, open_root, remove_directory

from .cache_archive import (
    CHUNK,
    COPIED,
    DIRECTORY,
    MANIFEST,
    NEW_FILE,
    Bound,
    Refused,
    checked,
    manifest_of,
    sha256_of,
)


class _Tree:
    """Directories below a descriptor, made (0755) and opened one at a time, never via a link."""

    def __init__(self, fd: int) -> None:
        self.fds: dict[str, int] = {"": fd}

    def directory(self, path: str) -> int:
        if path in self.fds:
            return self.fds[path]
        parent, _, name = path.rpartition("/")
        above = self.directory(parent)
        with contextlib.suppress(FileExistsError):
            os.mkdir(name, 0o755, dir_fd=above)
        self.fds[path] = os.open(name, DIRECTORY, dir_fd=above)
        return self.fds[path]

    def close(self) -> None:
        for path, fd in self.fds.items():
            if path:
                os.close(fd)


def _write(tar: tarfile.TarFile, member: tarfile.TarInfo, tree: _Tree) -> None:
    parent, _, name = member.name.rpartition("/")
    if member.isdir():
        tree.directory(member.name)
        return
    source = tar.extractfile(member)
    assert source is not None  # a regular member (checked)
    mode = 0o755 if member.mode & stat.S_IXUSR else 0o644
    with os.fdopen(os.open(name, NEW_FILE, mode, dir_fd=tree.directory(parent)), "wb") as out:
        left = member.size
        while left > 0:
            chunk = source.read(min(CHUNK, left))
            if not chunk:
                raise Refused(f"the archive's member {member.name!r} is cut short")
            out.write(chunk)
            left -= len(chunk)


def _place(staging: int, cache: int, top: str) -> tuple[int, int]:
    """Each entry under ``top`` renamed into the cache unless it has it: (placed, already there)."""
    source = open_below(staging, top)
    if source is None:
        return 0, 0
    target = _Tree(cache)
    placed = kept = 0
    try:
        into = target.directory(top)
        with os.scandir(source) as entries:
            names = sorted(e.name for e in entries)
        for name in names:
            try:
                os.stat(name, dir_fd=into, follow_symlinks=False)
            except FileNotFoundError:
                os.rename(name, name, src_dir_fd=source, dst_dir_fd=into)
                placed += 1
            else:
                kept += 1
    finally:
        os.close(source)
        target.close()
    return placed, kept


def extract(stream: IO[bytes], members: list[tarfile.TarInfo], root: str) -> dict[str, int]:
    """As whoever runs it: the members into a new directory of ``root``, then each kernel into
    place; the new directory is removed at the end, whatever happened."""
    cache = open_root(root)
    staging = f".incoming-{secrets.token_hex(8)}"
    os.mkdir(staging, 0o700, dir_fd=cache)
    tree = _Tree(os.open(staging, DIRECTORY, dir_fd=cache))
    try:
        with tarfile.open(fileobj=stream, mode="r:gz") as tar:
            for member in members:
                if member.name != MANIFEST:
                    _write(tar, member, tree)
        placed = kept = 0
        for top in COPIED:
            more, there = _place(tree.fds[""], cache, top)
            placed, kept = placed + more, kept + there
        return {"placed": placed, "kept": kept}
    finally:
        tree.close()
        os.close(tree.fds[""])
        remove_directory(cache, staging)
        os.close(cache)


def drop_to(user: str) -> None:
    """This process becomes ``user`` (its uid, primary and supplementary groups) for good."""
    entry = pwd.getpwnam(user)
    if os.geteuid() == entry.pw_uid:
        return
    os.initgroups(user, entry.pw_gid)
    os.setgid(entry.pw_gid)
    os.setuid(entry.pw_uid)


def extract_as(user: str, stream: IO[bytes], members: list[tarfile.TarInfo],
               root: str) -> dict[str, int]:
    """``extract`` in a child that runs as ``user``; its result (or error) through a pipe."""
    try:
        pwd.getpwnam(user)
    except KeyError:
        raise Refused(f"no user {user!r} on this host") from None
    reader, writer = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: whatever happens, it ends here
        result: dict[str, Any] = {"error": f"unpacking as {user} failed"}
        try:
            os.close(reader)
            drop_to(user)
            result = extract(stream, members, root)
        except BaseException as exc:
            result = {"error": f"unpacking as {user}: {exc}"}
        finally:
            os.write(writer, json.dumps(result).encode())
            os._exit(1 if "error" in result else 0)
    os.close(writer)
    with os.fdopen(reader, "rb") as answer:
        said = answer.read()
    _, status = os.waitpid(pid, 0)
    try:
        result = json.loads(said)
    except ValueError:
        result = {"error": f"unpacking as {user} ended without a result (status {status})"}
    if "error" in result:
        raise Refused(str(result["error"]))
    return {k: int(v) for k, v in result.items()}


def unpack(archive: str, sha256: str, digest: str, root: str, user: str,
           bound: Bound) -> dict[str, Any]:
    """Verify, then unpack ``archive`` into ``root`` as ``user``; the manifest's inputs."""
    with os.fdopen(os.open(archive, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC), "rb") as stream:
        found = sha256_of(stream)
        if found != sha256:
            raise Refused(f"the archive's sha256 is {found}, not {sha256}: nothing was "
                          "extracted")
        stream.seek(0)
        with tarfile.open(fileobj=stream, mode="r:gz") as tar:
            members = checked(tar, bound)
            manifest = manifest_of(tar, members)
        if manifest.get("digest") != digest:
            raise Refused(f"the archive's manifest is for {manifest.get('digest')!r}, this "
                          f"host's kernels for {digest}: nothing was extracted")
        stream.seek(0)
        counts = extract_as(user, stream, members, root)
    inputs = manifest.get("inputs")
    return {"ok": True, **counts, "inputs": inputs if isinstance(inputs, dict) else {}}
