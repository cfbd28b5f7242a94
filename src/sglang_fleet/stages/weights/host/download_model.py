"""Download model weights onto a host's local disk, once: runs ON the host with the tools venv's
python (the weights stage uploads it), with boto3 for S3 and huggingface_hub for the hub.

    python -m sglang_fleet.stages.weights.host.download_model s3://bucket/prefix \\
        /var/lib/sglang/models/NAME [--endpoint-url URL]
    python -m sglang_fleet.stages.weights.host.download_model hf://org/name@revision \\
        /var/lib/sglang/models/NAME [--token-file F] [--reuse /var/lib/sglang/models/OLD]

Files land in ``DEST.partial`` and are verified (size, and the ETag's MD5 for single-part
objects) before ``DEST.partial`` is renamed to ``DEST``: a partial model is never at DEST, and an
interrupted run resumes with the files it had finished. A manifest in DEST recording the same
source makes re-runs free; one recording another source is staged again. ``--reuse OLD`` links
the files of OLD (an earlier name of DEST) instead of downloading them, when OLD's manifest
records the same source.

While it downloads it prints a line every ``--progress-seconds`` (10): bytes staged of the
total, the rate over the last half minute and the time left (``progress.py``); the weights
stage shows each line as it comes, prefixed with the host.

Exit 0 when DEST is complete; anything else prints one line per failure (what failed, which
object, the endpoint, why) on stderr and exits 1, never a traceback.

Object and file names come from the bucket or the repository, and this runs as root: every name
of a listing is checked (``name_problem``) before any file is written, and files are written
under DEST.partial without following a symlink, so no name reaches outside DEST.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import hashlib
import json
import os
import shutil
import stat
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from sglang_fleet.remote.progress import (
    EVERY,
    Meter,
    Reporter,
    say,
)
from sglang_fleet.remote.progress import size as in_units

MANIFEST = ".sglang-fleet-manifest.json"


class StageError(Exception):
    """One failure, as the one line the deploy shows.

        str(StageError("download", "s3://b/p/a.bin", "http://s3:9000", "connection refused"))
        # 'error: download of s3://b/p/a.bin from http://s3:9000 failed: connection refused'
    """

    def __init__(self, what: str, item: str, endpoint: str, reason: str) -> None:
        super().__init__(f"error: {what} of {item} from {endpoint} failed: {reason}")


def reason(exc: BaseException) -> str:
    """An exception in a few words: its type and the first line of its message."""
    text = (str(exc).strip().splitlines() or [""])[0]
    text = text if len(text) <= 200 else text[:200] + " …"
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _load(path: Path) -> dict[str, Any]:
    try:
        data: dict[str, Any] = json.loads(path.read_text())
        return data
    except (OSError, ValueError):
        return {}


def _md5(f: IO[bytes]) -> str:
    digest = hashlib.md5(usedforsecurity=False)
    f.seek(0)
    for block in iter(lambda: f.read(1 << 20), b""):
        digest.update(block)
    return digest.hexdigest()


def name_problem(name: str, root: Path) -> str | None:
    """Why ``name`` (an object key under the prefix, a repository's file name) may not become a
    file under ``root``, or None. A bucket or a repository is not trusted: ``../../etc/cron.d/x``
    or ``/etc/x`` (``PREFIX//etc/x``) would otherwise be written by root anywhere on the host.

        name_problem("../x", Path("/m.partial"))  # "a '..' part"
    """
    if not name:
        return "an empty name"
    if "\0" in name or "\\" in name:
        return "a NUL or a backslash in the name"
    if name.startswith("/"):
        return "an absolute name"
    for part in name.split("/"):
        if part in ("", ".", ".."):
            return f"a {part!r} part" if part else "an empty part (//)"
    if name == MANIFEST:
        return f"the name of the stage's own manifest ({MANIFEST})"
    # A symlink already under root (a host's own, an earlier run's) must not lead outside it.
    real_root = os.path.realpath(root)
    if os.path.commonpath([real_root, os.path.realpath(root / name)]) != real_root:
        return f"it resolves outside {root}"
    return None


def check_names(source: str, names: list[str], root: Path, endpoint: str) -> None:
    """Refuse the whole listing, before anything is written, naming its first bad name."""
    for name in names:
        problem = name_problem(name, root)
        if problem:
            raise StageError("listing", source, endpoint,
                             f"refused {name!r}: {problem}; nothing was written (remove or "
                             "rename that object, or stage another source)")


def _open_dir(root: Path, parts: list[str]) -> int:
    """A descriptor of ``root/parts...``, made where missing, never through a symlink."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for part in parts:
            with contextlib.suppress(FileExistsError):
                os.mkdir(part, 0o755, dir_fd=fd)
            sub = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = sub
    except BaseException:
        os.close(fd)
        raise
    return fd


def _is_file(dir_fd: int, name: str) -> bool:
    try:
        return stat.S_ISREG(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except FileNotFoundError:
        return False


def _download(url: str, where: str, dir_fd: int, base: str, size: int, etag: str,
              into: Callable[[IO[bytes]], object]) -> None:
    """Into ``base.download`` (a symlink there is refused, not followed), checked, then
    renamed over ``base`` (which replaces a symlink instead of writing through it)."""
    tmp = base + ".download"
    fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644,
                 dir_fd=dir_fd)
    with os.fdopen(fd, "w+b") as f:
        try:
            into(f)
        except Exception as exc:
            raise StageError("download", url, where, reason(exc)) from None
        got = f.seek(0, os.SEEK_END)
        if got != size:
            raise StageError("check", url, where, f"{got} bytes, S3 says {size}")
        if "-" not in etag and _md5(f) != etag:
            raise StageError("check", url, where, f"MD5 differs from the ETag {etag}")
    os.replace(tmp, base, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)


def bytes_under(root: Path) -> int:
    """Bytes written under ``root`` so far (regular files, links not followed; a sparse file
    counts what it holds), for a download that reports nothing itself."""
    total = 0
    for where, _, names in os.walk(root):
        for name in names:
            if name == MANIFEST:
                continue
            try:
                st = os.lstat(os.path.join(where, name))
            except FileNotFoundError:  # renamed into place meanwhile: counted next time
                continue
            if stat.S_ISREG(st.st_mode):
                total += min(st.st_size, st.st_blocks * 512)
    return total


def announce(source: str, files: int, total: int, already: int, emit: Callable[[str], None],
             commit: str | None = None) -> None:
    """The first line: what is staged, how much, and how much an earlier run left here."""
    at = f" at commit {commit}" if commit else ""
    kept = f" ({in_units(already)} of it staged by an earlier run)" if already else ""
    emit(f"weights: {source}{at}: {files} files, {in_units(total)}{kept}")


def stage_s3(source: str, partial: Path, endpoint: str | None, workers: int,
             every: float = EVERY, emit: Callable[[str], None] = say) -> dict[str, Any]:
    import boto3
    from boto3.s3.transfer import TransferConfig
    from botocore.config import Config

    bucket, _, prefix = source[len("s3://"):].partition("/")
    prefix = prefix.rstrip("/") + "/" if prefix else ""
    # Bounded: an endpoint that went away fails the run in about a minute, not an hour.
    s3 = boto3.client("s3", endpoint_url=endpoint, config=Config(
        connect_timeout=10, read_timeout=60, retries={"max_attempts": 3, "mode": "standard"}))
    where = str(s3.meta.endpoint_url)
    objects = []
    try:
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            for obj in page.get("Contents", []):
                if not obj["Key"].endswith("/"):
                    objects.append((obj["Key"][len(prefix):], obj["Size"],
                                    obj["ETag"].strip('"')))
    except Exception as exc:  # botocore's errors, whatever the transport says
        raise StageError("listing", source, where, reason(exc)) from None
    if not objects:
        raise StageError("listing", source, where, "no objects there (check the bucket, "
                         "prefix and credentials)")
    check_names(source, [name for name, _, _ in objects], partial, where)
    progress_path = partial / MANIFEST
    progress = _load(progress_path)
    # Files an interrupted run of this source finished (another source's are not these).
    done: dict[str, Any] = progress.get("files", {}) if progress.get("source") == source else {}
    config = TransferConfig(multipart_threshold=8 << 20, multipart_chunksize=8 << 20,
                            max_concurrency=workers)
    total = sum(size for _, size, _ in objects)
    already = sum(size for name, size, etag in objects
                  if done.get(name) == {"size": size, "etag": etag})
    announce(source, len(objects), total, already, emit)
    meter = Meter(total, already)  # boto3 calls back with each chunk's bytes, from its threads

    def fetch(item: tuple[str, int, str]) -> tuple[str, dict[str, Any]]:
        name, size, etag = item
        *parents, base = name.split("/")
        dir_fd = _open_dir(partial, parents)
        try:
            if done.get(name) == {"size": size, "etag": etag} and _is_file(dir_fd, base):
                return name, done[name]
            url = f"s3://{bucket}/{prefix}{name}"
            _download(url, where, dir_fd, base, size, etag,
                      lambda f: s3.download_fileobj(bucket, prefix + name, f, Config=config,
                                                    Callback=meter.add))
        finally:
            os.close(dir_fd)
        return name, {"size": size, "etag": etag}

    failures = []
    with Reporter(lambda: "weights: " + meter.line(), every, emit), \
            concurrent.futures.ThreadPoolExecutor(max(1, workers // 4)) as pool:
        futures = [pool.submit(fetch, item) for item in objects]
        for future in futures:  # in order, as pool.map; a failure cancels what has not begun
            try:
                name, entry = future.result()
            except StageError as err:
                failures.append(err)
                for later in futures:
                    later.cancel()  # those running now finish and report their own failure
                continue
            except concurrent.futures.CancelledError:
                continue
            done[name] = entry
            progress_path.write_text(json.dumps({"source": source, "files": done}))
    if failures:
        raise StageFailed(failures)
    return {"source": source, "files": done}


class StageFailed(Exception):
    """Several failures of one run (one line each)."""

    def __init__(self, failures: list[StageError]) -> None:
        super().__init__("\n".join(dict.fromkeys(str(f) for f in failures)))


def stage_hf(source: str, partial: Path, token_file: str | None, every: float = EVERY,
             emit: Callable[[str], None] = say) -> dict[str, Any]:
    from huggingface_hub import HfApi, constants, snapshot_download

    repo, _, revision = source[len("hf://"):].partition("@")
    token = Path(token_file).read_text().strip() if token_file else None
    try:
        info = HfApi().model_info(repo, revision=revision, files_metadata=True, token=token)
    except Exception as exc:
        raise StageError("listing", source, constants.ENDPOINT, reason(exc)) from None
    siblings = info.siblings or []
    check_names(source, [sibling.rfilename for sibling in siblings], partial, constants.ENDPOINT)
    total = sum(sibling.size or 0 for sibling in siblings)
    announce(source, len(siblings), total, 0, emit, info.sha)
    # huggingface_hub says nothing a deploy can show: the bytes under the directory tell.
    meter = Meter(total, measure=lambda: bytes_under(partial))
    try:
        # The commit whose file names were checked, not whatever the revision names by now.
        with Reporter(lambda: "weights: " + meter.line(), every, emit):
            snapshot_download(repo_id=repo, revision=info.sha or revision,
                              local_dir=str(partial), token=token)
    except Exception as exc:
        raise StageError("download", source, constants.ENDPOINT, reason(exc)) from None
    files = {}
    for sibling in siblings:
        path = partial / sibling.rfilename
        if not path.is_file() or path.is_symlink() or \
                (sibling.size is not None and path.stat().st_size != sibling.size):
            raise StageError("check", f"{source}/{sibling.rfilename}", constants.ENDPOINT,
                             "not a file of the hub's size")
        files[sibling.rfilename] = {"size": sibling.size, "sha": info.sha}
    return {"source": source, "files": files}


def main() -> int:
    """Stage, printing one line per failure instead of a traceback."""
    try:
        return stage()
    except (StageError, StageFailed) as err:
        print(err, file=sys.stderr)
    except OSError as err:  # the local disk: full, read-only, permissions
        print(f"error: writing {err.filename or 'the model'} failed: {reason(err)}",
              file=sys.stderr)
    return 1


def normalized(source: str) -> str:
    """As the deploy names sources (render.normalized_source): ``s3://b/p/`` is ``s3://b/p``."""
    return source.rstrip("/") if source.startswith("s3://") else source


def recorded_source(directory: Path) -> str | None:
    """The source a staged model's manifest records (None: no manifest, or none readable)."""
    source = _load(directory / MANIFEST).get("source")
    return normalized(source) if isinstance(source, str) else None


def reuse(source: str, old: Path, dest: Path, partial: Path) -> bool:
    """Hard-link a model staged at ``old`` (an earlier name of the same source) into ``dest``:
    no download, and ``old`` stays whole for a unit that still names it (a rollback)."""
    if old == dest or recorded_source(old) != source:
        return False
    if partial.exists():
        shutil.rmtree(partial)
    shutil.copytree(old, partial, symlinks=True, copy_function=os.link)
    os.replace(partial, dest)
    print(f"{dest}: linked from {old} (staged there from the same source)")
    return True


def settled(source: str, dest: Path, partial: Path, old: Path | None) -> bool:
    """True when DEST holds SOURCE without a download (staged already, or linked from OLD);
    says so, or why DEST is staged again."""
    if not (dest / MANIFEST).is_file():
        return old is not None and not dest.exists() and reuse(source, old, dest, partial)
    held = recorded_source(dest)
    if held == source:
        print(f"{dest}: already staged")
        return True
    # Its name no longer says which weights it holds: they are never served for SOURCE.
    print(f"{dest}: holds {held or 'an unreadable manifest'}, not {source}: staging again")
    return False


def stage() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("source")
    ap.add_argument("dest", type=Path)
    ap.add_argument("--endpoint-url")
    ap.add_argument("--token-file")
    ap.add_argument("--workers", type=int, default=16)
    ap.add_argument("--reuse", type=Path, help="an earlier directory of the same source")
    ap.add_argument("--progress-seconds", type=float, default=EVERY,
                    help="seconds between two progress lines (0: none)")
    args = ap.parse_args()
    dest: Path = args.dest
    source = normalized(args.source)
    partial = dest.with_name(dest.name + ".partial")
    if settled(source, dest, partial, args.reuse):
        return 0
    partial.mkdir(parents=True, exist_ok=True)
    tic = time.monotonic()
    if source.startswith("s3://"):
        manifest = stage_s3(source, partial, args.endpoint_url, args.workers,
                            args.progress_seconds)
    elif source.startswith("hf://"):
        manifest = stage_hf(source, partial, args.token_file, args.progress_seconds)
    else:
        raise StageError("staging", source, "-", "not an s3:// or hf:// source")
    if not (partial / "config.json").is_file():
        raise StageError("check", source, args.endpoint_url or "-",
                         "no config.json: not a model directory")
    (partial / MANIFEST).write_text(json.dumps(manifest, indent=1))
    if dest.exists():
        shutil.rmtree(dest)
    os.replace(partial, dest)
    size = sum(f["size"] or 0 for f in manifest["files"].values())
    seconds = max(time.monotonic() - tic, 1e-3)
    print(f"{dest}: staged {len(manifest['files'])} files, {size / 1e9:.2f} GB in {seconds:.1f} s "
          f"({size / 1e6 / seconds:.0f} MB/s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
