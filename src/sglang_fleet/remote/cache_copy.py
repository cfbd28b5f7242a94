"""Packs and unpacks a host's compiled kernels, so identical hosts compile once per fleet
(standard library only: system python, run as root).

    python -m sglang_fleet_remote.cache_copy pack --root /var/cache/sglang --digest D \\
        --inputs JSON --out /var/cache/sglang-fleet/cache-copy/D.tar.gz
    python -m sglang_fleet_remote.cache_copy unpack --root /var/cache/sglang --digest D \\
        --sha256 H --archive /var/cache/sglang-fleet/cache-copy/D.tar.gz --user sglang \\
        --record /var/cache/sglang-fleet/compiled/RELEASE-D.json --source b200-01
    python -m sglang_fleet_remote.cache_copy record --record PATH --digest D --inputs JSON

What is copied: DeepGEMM's finished kernels (``deep_gemm/cache/kernel.<name>.<digest>/``, each
published by a rename once built, so a directory there is whole), and ``MANIFEST.json`` naming the
digest of what they were compiled for. The service user writes the cache, and a compromised
server may, so:

- ``pack`` reads it through descriptors (O_NOFOLLOW at every component): only real directories
  and regular files go in, never a link, a device or a name starting with ``.`` (a build under
  way); ownership and modes are not kept (root's, 0644 or 0755).
- ``unpack`` checks the archive's sha256 before reading it, then every member before writing
  anything: a relative name under ``deep_gemm/cache/`` (or the manifest), no empty, ``.`` or
  ``..`` part, no backslash or control character, a regular file or a directory only (no link,
  hard link, device, FIFO or sparse file), no name twice, no file under a file, bounded in count
  and bytes; and the manifest's digest must be the host's own. Then it writes as the service
  user (root forks, the child drops to that user's uid and gids), through descriptors, into a
  new directory of the cache, and renames each kernel into place unless the cache has it: the
  files end the service user's, as the ones it compiles itself. Root then records the digest
  (``--record``, in root's own directory).

Prints one ``CACHECOPY <json>`` line; exit 0 when it did its job, 1 otherwise (``error`` says why).
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import hashlib
import io
import json
import os
import pwd
import re
import secrets
import stat
import sys
import tarfile
import time
import zlib
from typing import IO, Any

from .prune_caches import open_root, remove_directory  # uploaded to the host with this module

# DeepGEMM's kernels (SGLANG_DG_CACHE_DIR is <root>/deep_gemm): a directory per kernel under
# cache/, "kernel.{}.{}" holding kernel.cu and kernel.cubin, built elsewhere and renamed into
# place (strings of deep_gemm/_C.so, sgl-deep-gemm 0.1.2: "cache", "kernel.{}.{}", "Corrupted
# JIT cache directory (missing kernel.cu or kernel.cubin)"; 0.2.3.post2: "cache", "{}.{}",
# std::filesystem::rename). Locks and builds under way stay behind.
COPIED = ("deep_gemm/cache",)
MANIFEST = "MANIFEST.json"
MAX_MEMBERS = 1_000_000
MAX_BYTES = 256 << 30
MAX_DEPTH = 16
_DIGEST = re.compile(r"[0-9a-f]{16,64}")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_CONTROL = re.compile(r"[\x00-\x1f\x7f\\]")
_CHUNK = 1 << 20


class Refused(Exception):
    """The archive (or the cache) is not what it may be; nothing was written."""


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


def checked(tar: tarfile.TarFile) -> list[tarfile.TarInfo]:
    """Every member of ``tar``, each allowed, no name twice and no file under a file or where
    a directory is; Refused (naming the first one wrong) otherwise."""
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
        if problem is None and (len(members) >= MAX_MEMBERS or total > MAX_BYTES):
            problem = f"goes past {MAX_MEMBERS} members or {MAX_BYTES >> 30} GiB"
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
    while chunk := stream.read(_CHUNK):
        digest.update(chunk)
    return digest.hexdigest()


# --- pack ---------------------------------------------------------------------------------

def _open_below(fd: int, path: str) -> int | None:
    """``path`` (relative) opened below ``fd`` one real directory at a time; None if missing."""
    current = os.dup(fd)
    try:
        for part in path.split("/"):
            parent, current = current, os.open(part, _DIRECTORY, dir_fd=current)
            os.close(parent)
    except OSError as exc:
        os.close(current)
        if exc.errno in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
            return None
        raise
    return current


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
            sub = os.open(child, _DIRECTORY, dir_fd=fd)
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
        with os.fdopen(os.open(part, _NEW_FILE, 0o600), "wb") as raw, \
                tarfile.open(fileobj=raw, mode="w:gz", compresslevel=1,
                             format=tarfile.PAX_FORMAT) as tar:
            manifest = json.dumps({"digest": digest, "inputs": inputs}, sort_keys=True).encode()
            tar.addfile(_info(MANIFEST, tarfile.REGTYPE, len(manifest), 0o644),
                        io.BytesIO(manifest))
            for top in COPIED:
                fd = _open_below(root_fd, top)
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


# --- unpack -------------------------------------------------------------------------------

class _Tree:
    """Directories below one descriptor, created (0755) and opened one component at a time,
    never through a link."""

    def __init__(self, fd: int) -> None:
        self.fds: dict[str, int] = {"": fd}

    def directory(self, path: str) -> int:
        if path in self.fds:
            return self.fds[path]
        parent, _, name = path.rpartition("/")
        above = self.directory(parent)
        with contextlib.suppress(FileExistsError):
            os.mkdir(name, 0o755, dir_fd=above)
        self.fds[path] = os.open(name, _DIRECTORY, dir_fd=above)
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
    with os.fdopen(os.open(name, _NEW_FILE, mode, dir_fd=tree.directory(parent)), "wb") as out:
        left = member.size
        while left > 0:
            chunk = source.read(min(_CHUNK, left))
            if not chunk:
                raise Refused(f"the archive's member {member.name!r} is cut short")
            out.write(chunk)
            left -= len(chunk)


def _place(staging: int, cache: int, top: str) -> tuple[int, int]:
    """Each entry unpacked under ``top`` renamed into the cache's ``top`` unless the cache has
    it already: (placed, already there)."""
    source = _open_below(staging, top)
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
    tree = _Tree(os.open(staging, _DIRECTORY, dir_fd=cache))
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


def write_record(path: str, record: dict[str, Any]) -> None:
    """``record`` as JSON at ``path`` (root's directory), whole or absent."""
    os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
    part = f"{path}.part"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(part)
    with os.fdopen(os.open(part, _NEW_FILE, 0o644), "w") as out:
        json.dump(record, out, sort_keys=True)
    os.replace(part, path)


def unpack(archive: str, sha256: str, digest: str, root: str, user: str) -> dict[str, Any]:
    """Verify, then unpack ``archive`` into ``root`` as ``user``; the manifest's inputs."""
    with os.fdopen(os.open(archive, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC), "rb") as stream:
        found = sha256_of(stream)
        if found != sha256:
            raise Refused(f"the archive's sha256 is {found}, not {sha256}: nothing was "
                          "extracted")
        stream.seek(0)
        with tarfile.open(fileobj=stream, mode="r:gz") as tar:
            members = checked(tar)
            manifest = manifest_of(tar, members)
        if manifest.get("digest") != digest:
            raise Refused(f"the archive's manifest is for {manifest.get('digest')!r}, this "
                          f"host's kernels for {digest}: nothing was extracted")
        stream.seek(0)
        counts = extract_as(user, stream, members, root)
    inputs = manifest.get("inputs")
    return {"ok": True, **counts, "inputs": inputs if isinstance(inputs, dict) else {}}


def _json_object(text: str) -> dict[str, Any]:
    found = json.loads(text)
    if not isinstance(found, dict):
        raise ValueError("not a JSON object")
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sglang_fleet_remote.cache_copy")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("pack", "unpack", "record"):
        one = sub.add_parser(name)
        one.add_argument("--digest", required=True)
        if name != "record":
            one.add_argument("--root", required=True, help="the service's cache directory")
        if name != "unpack":
            one.add_argument("--inputs", required=True, type=_json_object)
    sub.choices["pack"].add_argument("--out", required=True)
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
    try:
        if args.command == "pack":
            result = pack(args.root, args.digest, args.inputs, args.out)
        elif args.command == "record":
            write_record(args.record, {"digest": args.digest, "inputs": args.inputs,
                                       "source": "compiled here", "at": time.time()})
            result = {"ok": True}
        else:
            if not _SHA256.fullmatch(args.sha256):
                parser.error(f"--sha256 {args.sha256!r}: 64 lower-case hex digits")
            result = unpack(args.archive, args.sha256, args.digest, args.root, args.user)
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
