"""Where shards go: a local directory or ``s3://bucket/prefix/``. Every object is written once
and whole: locally a write to a temporary name, fsync and rename; on S3 one PUT, or a multipart
upload that only becomes an object when it completes.

    store = open_store("s3://bucket/run-1/", s3)
    store.put_file(Path("/tmp/x"), "shard-000001.jsonl")
    names = store.names()
    reader = open_reader("s3://bucket/run-1/", s3)  # sglang-fleet results: no lease taken
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import IO, Any, Protocol

from sglang_fleet_generate.errors import GenerateError
from sglang_fleet_generate.lease import Lease, clash, layout_refusal, lease_lost, share_of
from sglang_fleet_generate.source import open_input, split_s3

MULTIPART_BYTES = 8 * 1024 * 1024

SHARD_FILE = re.compile(r"(?:shard|failures)-(\d+)\.jsonl")


class Reader(Protocol):
    """An output read only (``sglang-fleet results``): no lock, no lease, nothing written."""

    location: str

    def names(self) -> set[str]: ...

    def get_bytes(self, name: str) -> bytes | None: ...

    def open(self, name: str) -> IO[bytes]: ...

    def fence_of(self, name: str) -> str | None: ...


class Store(Reader, Protocol):
    spool: Path
    fence: str | None  # what this run's objects carry (S3: its lease's owner), None locally

    def put_file(self, path: Path, name: str) -> None: ...

    def put_bytes(self, data: bytes, name: str, fenced: bool = False) -> None: ...

    def delete(self, name: str) -> None: ...

    def tidy(self) -> None: ...

    def close(self) -> None: ...


def share_suffix(share: tuple[int, int] | None) -> str:
    """What a worker's own files carry. Example: share_suffix((0, 3)) == "-0-of-3"."""
    return "" if share is None else f"-{share[0]}-of-{share[1]}"


def owned(name: str, share: tuple[int, int] | None) -> bool:
    """Whether an output file is worker K of N's to write: its shards (index % N == K) and
    the files that carry its suffix. Example: owned("shard-000004.jsonl", (1, 3)) is True."""
    if share is None:
        return True
    found = SHARD_FILE.fullmatch(name)
    if found:
        return int(found.group(1)) % share[1] == share[0]
    return share_suffix(share) in name


class LocalReader:
    """A directory, read only: ``sglang-fleet results`` reads it while a run may write it."""

    def __init__(self, root: Path) -> None:
        self.location = str(root)
        self.root = root

    def names(self) -> set[str]:
        return {p.name for p in self.root.iterdir() if p.is_file()}

    def get_bytes(self, name: str) -> bytes | None:
        try:
            return (self.root / name).read_bytes()
        except FileNotFoundError:
            return None

    def open(self, name: str) -> IO[bytes]:
        return open_input(str(self.root / name), None, "the output")

    def fence_of(self, name: str) -> str | None:
        return None  # a local writer holds its lock until it exits: no late writes to fence


class LocalStore(LocalReader):
    """A directory; partial shards are spooled in its ``.spool`` so the commit is a rename;
    worker K of N (``share``) holds its own lock and spool beside the other workers'. A lock
    is held until its process exits, even stopped (SIGSTOP), so no other run takes over while
    a write may still come: a local output needs no fencing."""

    fence: str | None = None

    def __init__(self, root: Path, share: tuple[int, int] | None = None) -> None:
        super().__init__(root)
        suffix = share_suffix(share)
        try:
            root.mkdir(parents=True, exist_ok=True)
            self.lock = (root / f".lock{suffix}").open("w")
        except OSError as exc:
            raise GenerateError(f"{root}: cannot write the output: {exc.strerror}") from None
        try:  # two runs on one output would write the same shards
            fcntl.flock(self.lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise GenerateError(f"{root}: another sglang-fleet generate is writing here; "
                                "wait for it or stop it") from None
        self.check_layout(share)
        try:
            self.spool = root / f".spool{suffix}"
            shutil.rmtree(self.spool, ignore_errors=True)  # a killed run's partial shards
            self.spool.mkdir()
        except OSError as exc:
            raise GenerateError(f"{root}: cannot write the output: {exc.strerror}") from None

    def check_layout(self, share: tuple[int, int] | None) -> None:
        """Taken after this run's own lock (of two runs starting at once, at least one sees
        the other): refused while a run of another layout holds its lock here."""
        for path in sorted(self.root.glob(".lock*")):
            theirs = share_of(path.name, ".lock")
            if theirs is False or not clash(theirs, share):
                continue
            with path.open("rb") as probe:
                try:
                    fcntl.flock(probe, fcntl.LOCK_SH | fcntl.LOCK_NB)
                except OSError:
                    self.lock.close()
                    raise layout_refusal(self.location, path.name, theirs, share,
                                         "it holds that lock") from None

    def put_file(self, path: Path, name: str) -> None:
        with path.open("rb+") as f:
            os.fsync(f.fileno())
        os.replace(path, self.root / name)
        self._sync_dir()

    def put_bytes(self, data: bytes, name: str, fenced: bool = False) -> None:
        tmp = self.spool / f"{name}.tmp"
        tmp.write_bytes(data)
        self.put_file(tmp, name)

    def delete(self, name: str) -> None:
        (self.root / name).unlink(missing_ok=True)

    def tidy(self) -> None:
        pass  # a killed run's partial shards went with the spool at the start

    def _sync_dir(self) -> None:
        fd = os.open(self.root, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def close(self) -> None:
        shutil.rmtree(self.spool, ignore_errors=True)
        self.lock.close()


class S3Reader:
    """A bucket prefix, read only: no lease taken (a run may be writing it)."""

    def __init__(self, url: str, s3: Any) -> None:
        self.location = url
        self.bucket, prefix = split_s3(url)
        self.prefix = prefix if not prefix or prefix.endswith("/") else prefix + "/"
        self.s3 = s3
        self.etags: dict[str, str] = {}  # of the objects read or written, by name
        try:
            s3.head_bucket(Bucket=self.bucket)
        except Exception as exc:
            raise GenerateError(f"{url}: cannot use bucket {self.bucket!r}: {exc}") from None

    def names(self) -> set[str]:
        found: set[str] = set()
        pages = self.s3.get_paginator("list_objects_v2").paginate(Bucket=self.bucket,
                                                                   Prefix=self.prefix)
        for page in pages:
            for obj in page.get("Contents", []):
                rest = obj["Key"][len(self.prefix):]
                if rest and "/" not in rest:
                    found.add(rest)
        return found

    def get_bytes(self, name: str) -> bytes | None:
        try:
            answer = self.s3.get_object(Bucket=self.bucket, Key=self.prefix + name)
        except self.s3.exceptions.NoSuchKey:
            return None
        self.etags[name] = str(answer["ETag"])
        return bytes(answer["Body"].read())

    def fence_of(self, name: str) -> str | None:
        """The fencing token the object was written with (None: an older sglang-fleet's)."""
        try:
            head = self.s3.head_object(Bucket=self.bucket, Key=self.prefix + name)
        except self.s3.exceptions.ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey"):
                return None  # gone: no token, so not the file an entry names
            raise
        fence = head.get("Metadata", {}).get("fence")
        return None if fence is None else str(fence)

    def open(self, name: str) -> IO[bytes]:
        return open_input(f"s3://{self.bucket}/{self.prefix}{name}", self.s3, "the output")


class S3Store(S3Reader):
    """A bucket prefix; partial shards are spooled in a local temporary directory. One run
    writes it, holding its lease (lease.py), as the lock on a local output does: taken before
    anything under the prefix is touched, checked before each write, given back at close.
    Every object written carries the lease's owner as its fencing token (``fence``), and a
    manifest is replaced only if it is still the one this run read or wrote (If-Match), so a
    late write of a run that lost the lease is refused or, for a shard, found out by readers."""

    def __init__(self, url: str, s3: Any, share: tuple[int, int] | None = None) -> None:
        from boto3.s3.transfer import TransferConfig

        super().__init__(url, s3)
        self.config = TransferConfig(multipart_threshold=MULTIPART_BYTES,
                                     multipart_chunksize=MULTIPART_BYTES)
        self.share = share
        self.lease = Lease(s3, self.bucket, self.prefix, url, share)
        self.lease.acquire()  # before tidy()'s aborts: they are safe only with no other run
        self.lease.check_layout(self.names())
        self.fence: str | None = str(self.lease.owner["owner"])
        self.spool = Path(tempfile.mkdtemp(prefix="sglang-generate-"))

    def tidy(self) -> None:
        """Once the run is past every refusal: the killed runs' multipart uploads go."""
        self.abort_stale_uploads()

    def abort_stale_uploads(self) -> None:
        """Abort the multipart uploads a killed run left under the prefix: they never became
        objects, but S3 keeps (and bills) their parts. This run holds the prefix's lease, so
        none of them is live; a deeper prefix is another job's and is left alone."""
        try:
            pages = self.s3.get_paginator("list_multipart_uploads").paginate(
                Bucket=self.bucket, Prefix=self.prefix)
            for page in pages:
                for upload in page.get("Uploads", []):
                    name = upload["Key"][len(self.prefix):]
                    if "/" not in name and owned(name, self.share):  # not another worker's
                        self.s3.abort_multipart_upload(Bucket=self.bucket, Key=upload["Key"],
                                                       UploadId=upload["UploadId"])
        except Exception:  # no permission to list or abort: the job itself is unaffected
            pass

    def put_file(self, path: Path, name: str) -> None:
        self.lease.ensure()
        self.s3.upload_file(str(path), self.bucket, self.prefix + name, Config=self.config,
                            ExtraArgs={"Metadata": {"fence": self.fence}})
        path.unlink()

    def put_bytes(self, data: bytes, name: str, fenced: bool = False) -> None:
        """``fenced``: replace only the object this run last read or wrote (a manifest), so
        that a late PUT of a run that lost the lease fails rather than undoing this run's."""
        self.lease.ensure()
        condition = ({"IfMatch": self.etags[name]} if name in self.etags
                     else {"IfNoneMatch": "*"}) if fenced else {}
        try:
            answer = self.s3.put_object(Bucket=self.bucket, Key=self.prefix + name, Body=data,
                                        Metadata={"fence": str(self.fence)}, **condition)
        except Exception as exc:
            if lease_lost(exc):
                raise GenerateError(f"{self.location}: {name} was written by another run "
                                    "since this one read it (a run that lost the lease, "
                                    "writing late), so this run stops\n    fix: run the same "
                                    "command again") from None
            raise
        self.etags[name] = str(answer["ETag"])

    def delete(self, name: str) -> None:
        self.lease.ensure()
        self.s3.delete_object(Bucket=self.bucket, Key=self.prefix + name)

    def close(self) -> None:
        self.lease.release()
        shutil.rmtree(self.spool, ignore_errors=True)


def open_reader(location: str, s3: Any) -> Reader:
    """An output to read (``s3://`` or a directory), without its writer's lock or lease:
    every object on it is written once and whole, so a reader sees only committed files."""
    if location.startswith("s3://"):
        return S3Reader(location, s3)
    return LocalReader(Path(location))


def open_store(location: str, s3: Any, share: tuple[int, int] | None = None) -> Store:
    """The store for an output location (``s3://`` or a directory); ``share`` (worker K of N,
    --worker) takes that share's lease or lock instead of the whole job's."""
    if location.startswith("s3://"):
        return S3Store(location, s3, share)
    return LocalStore(Path(location), share)
