"""Removes, as root, the per-version caches (``/var/cache/sglang/release/<version>``) of SGLang
versions no release keeps (standard library only: system python).

    python -m sglang_fleet.remote.prune_caches --root /var/cache/sglang/release --keep 0.5.23

The service user can create, rename and link anything under its cache, at any moment, and a
compromised server may. So nothing here takes a name from a listing made earlier or follows a
link: the root is opened one component at a time with O_NOFOLLOW, its entries are read from
that descriptor, only a real directory named like a version is removed, and it is removed
through descriptors all the way down, at any depth (a link inside is unlinked, never
followed).

Root with descriptors rather than the service user: the same code removes what is there
whoever owns it (entries an older product release made as root included) and needs no
sudo/setpriv on the host, while the descriptors keep root's delete to what is under the root.
Prints one ``removed <name>`` line per directory; exit 1 with one ``error:`` line otherwise.
"""

from __future__ import annotations

import argparse
import errno
import os
import re
import sys

# caches.release_key's pattern: the only names a per-version cache directory may have.
VERSION = re.compile(r"[0-9]+(\.[0-9]+)*(\.post[0-9]+|rc[0-9]+)?")
_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
_NOT_A_DIRECTORY = (errno.ENOTDIR, errno.ELOOP)  # a file, or a link O_NOFOLLOW refused


def open_root(path: str, below: int | None = None) -> int:
    """``path`` opened one component at a time from ``/`` (or ``below``), no component a link."""
    fd = os.open("/", _DIRECTORY) if below is None else os.dup(below)
    try:
        for part in path.split("/"):
            if part:
                parent, fd = fd, os.open(part, _DIRECTORY, dir_fd=fd)
                os.close(parent)
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_below(fd: int | None, path: str) -> int | None:
    """``open_root(path, fd)``, None if a component is missing or not a real directory."""
    try:
        return open_root(path, fd)
    except OSError as exc:
        if exc.errno in (errno.ENOENT, *_NOT_A_DIRECTORY):
            return None
        raise


def remove_directory(parent: int, name: str) -> bool:
    """``name`` in ``parent`` and all under it; False (nothing removed) if it is not a real
    directory now.

    A loop, not recursion, with one directory open at a time: the service user can make a
    tree of any depth (recursion fails at 1,000 levels, a descriptor per level at the open
    file limit). The way back up is ``..``, checked to be the very directory come down from
    (an OSError if it moved meanwhile), so nothing outside the tree is ever reached."""
    fd = _open_directory(parent, name)
    if fd is None:
        return False
    # each level above the current directory: its name there, the level's identity and the
    # names in it still to remove
    above: list[tuple[str, tuple[int, int], list[str]]] = []
    try:
        todo = _names(fd)
        while todo or above:
            if todo:
                child = todo.pop()
                below = _open_directory(fd, child)
                if below is None:
                    os.unlink(child, dir_fd=fd)  # a file, or a link: unlinked, not followed
                    continue
                above.append((child, _identity(fd), todo))
                fd, left = below, fd
                os.close(left)
                todo = _names(fd)
                continue
            child, identity, todo = above.pop()
            fd, left = os.open("..", _DIRECTORY, dir_fd=fd), fd
            os.close(left)
            if _identity(fd) != identity:
                raise OSError(f"{name}: {child} was moved while it was being removed")
            os.rmdir(child, dir_fd=fd)
    finally:
        os.close(fd)
    os.rmdir(name, dir_fd=parent)
    return True


def _open_directory(parent: int, name: str) -> int | None:
    """``name`` in ``parent`` opened, None if it is not a real directory (a link included)."""
    try:
        return os.open(name, _DIRECTORY, dir_fd=parent)
    except OSError as exc:
        if exc.errno in _NOT_A_DIRECTORY:
            return None
        raise


def _names(fd: int) -> list[str]:
    with os.scandir(fd) as entries:
        return [entry.name for entry in entries]


def _identity(fd: int) -> tuple[int, int]:
    found = os.fstat(fd)
    return found.st_dev, found.st_ino


def stale(fd: int, keep: set[str]) -> list[str]:
    """The real directories under ``fd`` named as a version ``keep`` does not hold."""
    with os.scandir(fd) as entries:
        return sorted(e.name for e in entries if VERSION.fullmatch(e.name)
                      and e.name not in keep and e.is_dir(follow_symlinks=False))


def prune(root: str, keep: set[str]) -> list[str]:
    """The names removed from ``root`` (none when it is missing or not a real directory)."""
    fd = open_below(None, root)
    if fd is None:
        return []
    try:
        return [name for name in stale(fd, keep) if remove_directory(fd, name)]
    finally:
        os.close(fd)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sglang_fleet.remote.prune_caches")
    parser.add_argument("--root", required=True, help="the per-version caches' directory")
    parser.add_argument("--keep", action="append", default=[], metavar="VERSION",
                        help="a version whose caches stay (repeat)")
    args = parser.parse_args(argv)
    if not args.root.startswith("/") or ".." in args.root.split("/"):
        parser.error(f"--root {args.root!r}: an absolute path without '..'")
    try:
        for name in prune(args.root, set(args.keep)):
            print(f"removed {name}")
    except OSError as exc:
        print(f"error: pruning {args.root}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
