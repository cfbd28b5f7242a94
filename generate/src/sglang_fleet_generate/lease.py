"""One writer per S3 output: a lease object under the prefix, created with a conditional PUT
(``If-None-Match: *``), renewed with ``If-Match`` on its last ETag while the job runs, and taken
over (``If-Match`` on the expired lease's ETag) only once it has expired, or at once when its
owner is a process of this host that is gone (a run killed with SIGKILL is run again at once).
S3 cannot lock, so a writer stops writing once it could not renew for two thirds of the lease's
time: the last third covers a PUT in flight and the one-second precision of LastModified.

Expiry is judged on the server's clocks alone (the lease's LastModified plus its time to live,
against the Date of the answer), so writers' clock skew does not matter.

    lease = Lease(s3, "bucket", "run-1/", "s3://bucket/run-1/")
    lease.acquire()      # GenerateError while another run holds it
    lease.ensure()       # before each write
    lease.release()

A ``--worker K/N`` run holds ``.lease-K-of-N`` for its share, and refuses to run beside a
live lease of another layout (check_layout). The lease's owner id is the run's fencing token:
every object a run writes carries it (``x-amz-meta-fence``) and its manifest entry names it,
so a late PUT of a run that lost the lease, held up past its expiry, is never taken as
committed (store.py, ledger.py, results.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
import uuid
from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import Any, Literal

from sglang_fleet_generate.errors import GenerateError

LEASE_TTL_S = 60.0
LOST = ("PreconditionFailed", "ConditionalRequestConflict")  # another writer's PUT won
PROC = Path("/proc")  # the processes this user may see (hidepid=2 hides other users')


def layout(share: tuple[int, int] | None) -> str:
    """How a share is run. Example: layout((0, 3)) == "--worker K/3"."""
    return "one run (no --worker)" if share is None else f"--worker K/{share[1]}"


def share_of(name: str, base: str) -> tuple[int, int] | Literal[False] | None:
    """The share a file's name says (None: the whole job's), False if it is not ``base``'s.
    Example: share_of(".lease-1-of-3", ".lease") == (1, 3); share_of(".lease", ".lease") is
    None."""
    if name == base:
        return None
    parts = name.removeprefix(f"{base}-").split("-of-")
    if name.startswith(f"{base}-") and len(parts) == 2 and all(x.isdigit() for x in parts):
        return int(parts[0]), int(parts[1])
    return False


def clash(a: tuple[int, int] | None, b: tuple[int, int] | None) -> bool:
    """Whether runs of shares ``a`` and ``b`` would write the same shards: one run and a
    worker, or workers of another N. Example: clash(None, (0, 2)) is True."""
    return (a is None) != (b is None) or (a is not None and b is not None and a[1] != b[1])


def layout_refusal(location: str, name: str, theirs: tuple[int, int] | None,
                   ours: tuple[int, int] | None, who: str) -> GenerateError:
    return GenerateError(f"{location}: {name}: a run of {layout(theirs)} is writing here "
                         f"({who}), and this run, {layout(ours)}, would write the same shards"
                         "\n    fix: wait for it or stop it; run a job one way only (every "
                         "worker with the same --worker K/N, or no --worker)")


def lease_name(share: tuple[int, int] | None = None) -> str:
    """Example: lease_name() == ".lease"; lease_name((2, 4)) == ".lease-2-of-4"."""
    return ".lease" if share is None else f".lease-{share[0]}-of-{share[1]}"


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def _pid_namespace() -> str:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


def _process_start(pid: int) -> str | None:
    """When a process started (clock ticks since boot), None if there is no such process;
    with a pid, it tells a reused pid from the lease's owner."""
    try:
        stat = (PROC / str(pid) / "stat").read_text()
    except FileNotFoundError:
        return None
    except OSError:
        return ""
    return stat.rsplit(")", 1)[1].split()[19]


def _alive(pid: int) -> bool:
    """Whether ``pid`` may run though /proc does not show it: with ``hidepid=2`` another
    user's processes are hidden there, yet kill(pid, 0) still tells ESRCH (none) from EPERM
    (someone else's)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # EPERM: it runs, as another user
        pass
    return True


def _who(body: dict[str, Any]) -> str:
    return f"host {body.get('host', '?')}, pid {body.get('pid', '?')}"


def _error_code(exc: Exception) -> str:
    return str(getattr(exc, "response", {}).get("Error", {}).get("Code", ""))


def lease_lost(exc: Exception) -> bool:
    """Whether S3 refused a conditional write because another writer's PUT came first."""
    return _error_code(exc) in LOST


class Lease:
    """The single-writer lease of one S3 output (or of one worker's share of it)."""

    def __init__(self, s3: Any, bucket: str, prefix: str, location: str,
                 share: tuple[int, int] | None = None) -> None:
        self.s3, self.bucket, self.location = s3, bucket, location
        self.name = lease_name(share)
        self.prefix, self.share = prefix, share
        self.key = prefix + self.name
        self.ttl = LEASE_TTL_S
        self.owner = {"owner": uuid.uuid4().hex, "host": socket.gethostname(), "pid": os.getpid(),
                      "boot_id": _boot_id(), "pid_ns": _pid_namespace(),
                      "started": _process_start(os.getpid())}
        self.etag: str | None = None
        self.deadline = 0.0  # monotonic: past it, this run no longer knows it holds the lease
        self.lost: str | None = None
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.thread: threading.Thread | None = None

    # ---- taking it ---------------------------------------------------------------------------
    def acquire(self) -> None:
        for _ in range(5):  # each turn loses a race to another run at most once
            if self._put(IfNoneMatch="*"):
                break
            current = self._read(self.key)
            if current is None:
                continue  # released between our PUT and our GET
            body, etag, expires = current
            if not self._expired(body, expires):
                raise self._refusal(body, expires)
            if self._put(IfMatch=etag):
                break
        else:
            raise GenerateError(f"{self.location}: {self.name}: other runs keep taking this "
                                "output's lease\n    fix: run one job per output")
        self.thread = threading.Thread(target=self._renew_loop, daemon=True,
                                       name="sglang-fleet-lease")
        self.thread.start()

    def _body(self) -> bytes:
        expires = datetime.now(UTC) + timedelta(seconds=self.ttl)
        return json.dumps({**self.owner, "ttl_s": self.ttl,
                           "expires_utc": expires.isoformat(timespec="seconds")}).encode()

    def _put(self, **condition: str) -> bool:
        """One conditional PUT of the lease; False if the condition failed."""
        sent = time.monotonic()
        try:
            answer = self.s3.put_object(Bucket=self.bucket, Key=self.key, Body=self._body(),
                                        ContentType="application/json", **condition)
        except Exception as exc:
            if _error_code(exc) in LOST:
                return False
            if _error_code(exc) in ("NotImplemented", "InvalidArgument"):
                raise GenerateError(f"{self.location}: {self.name}: the S3 endpoint refused a "
                                    f"conditional PUT ({exc})\n    fix: use an endpoint with "
                                    "conditional writes (If-None-Match, If-Match)") from None
            raise GenerateError(f"{self.location}: {self.name}: cannot write the lease: "
                                f"{exc}") from None
        self.etag = str(answer["ETag"])
        self.deadline = sent + self.ttl * 2 / 3
        return True

    def _read(self, key: str) -> tuple[dict[str, Any], str, datetime] | None:
        """A lease on S3: (its body, ETag, expiry by the server's clock), None if absent."""
        try:
            answer = self.s3.get_object(Bucket=self.bucket, Key=key)
        except Exception as exc:
            if _error_code(exc) in ("NoSuchKey", "404"):
                return None
            raise GenerateError(f"{self.location}: {self.name}: cannot read the lease: "
                                f"{exc}") from None
        try:
            body = json.loads(answer["Body"].read())
            ttl = float(body["ttl_s"])
        except (ValueError, KeyError, TypeError):
            body, ttl = {}, LEASE_TTL_S  # not ours to read: it still expires
        expires = answer["LastModified"] + timedelta(seconds=ttl + 1)  # LastModified: to 1 s
        return body, str(answer["ETag"]), self._on_this_clock(answer, expires)

    @staticmethod
    def _on_this_clock(answer: Any, expires: datetime) -> datetime:
        """The expiry moved onto this host's clock by the server's Date (skew-free)."""
        date = answer.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get("date")
        if not date:
            return expires
        return expires - parsedate_to_datetime(date) + datetime.now(UTC)

    def _expired(self, body: dict[str, Any], expires: datetime) -> bool:
        return datetime.now(UTC) >= expires or self._owner_gone(body)

    def _owner_gone(self, body: dict[str, Any]) -> bool:
        """The lease's owner was a process of this host, this boot and this pid namespace
        that no longer runs (its pid gone, or reused by a process started later)."""
        here = self.owner
        if not here["boot_id"] or any(body.get(k) != here[k] for k in ("host", "boot_id",
                                                                         "pid_ns")):
            return False
        pid = body.get("pid")
        if not isinstance(pid, int) or pid == os.getpid():
            return False
        start = _process_start(pid)
        if start is None:
            return not _alive(pid)
        return bool(start) and body.get("started") not in (None, start)

    def check_layout(self, names: set[str]) -> None:
        """Taken after this run's own lease, so that of two runs of other layouts starting at
        once at least one sees the other: while a live lease of a run that would write the
        same shards (one run beside a worker) is under the prefix, give ours back and refuse."""
        for name in sorted(names):
            theirs = share_of(name, ".lease")
            if theirs is False or not clash(theirs, self.share):
                continue
            current = self._read(self.prefix + name)
            if current is not None and not self._expired(current[0], current[2]):
                self.release()
                raise layout_refusal(self.location, name, theirs, self.share,
                                     _who(current[0]))

    def _refusal(self, body: dict[str, Any], expires: datetime) -> GenerateError:
        who = _who(body)
        when = expires.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        return GenerateError(f"{self.location}: {self.name}: another sglang-fleet generate is "
                             f"writing here ({who}; its lease, renewed while it runs, expires "
                             f"at {when})\n    fix: wait for it or stop it (a stopped run's "
                             "lease is free once it expires; on the same host at once)")

    # ---- holding it --------------------------------------------------------------------------
    def _renew_loop(self) -> None:
        while not self.stop.wait(self.ttl / 3):
            self.renew()
            if self.lost:
                return

    def renew(self) -> None:
        with self.lock:
            if self.lost or self.etag is None:
                return
            try:
                if not self._put(IfMatch=self.etag):
                    self.lost = "another run took it over"
            except GenerateError as exc:  # S3 unreachable for now: ensure() judges the time
                if time.monotonic() > self.deadline:
                    self.lost = f"not renewed in time ({exc})"

    def ensure(self) -> None:
        """Before each write: this run still holds the lease, or the write must not happen."""
        if not self.lost and time.monotonic() > self.deadline:
            self.renew()
        if self.lost or time.monotonic() > self.deadline:
            raise GenerateError(f"{self.location}: {self.name}: this run lost the output's "
                                f"lease ({self.lost or 'not renewed in time'}), so it stops "
                                "writing\n    fix: run the same command again to resume once "
                                "no other run writes here")

    def release(self) -> None:
        """Give the lease back, unless another run holds it now."""
        self.stop.set()
        if self.thread is not None:
            self.thread.join(5)
        with self.lock:
            if self.lost or self.etag is None:
                return
            # failing: not ours any more, or S3 unreachable; either way it expires by itself
            with contextlib.suppress(Exception):
                self.s3.delete_object(Bucket=self.bucket, Key=self.key, IfMatch=self.etag)
            self.etag = None
