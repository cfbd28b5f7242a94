"""The job: stream the input, send each line through the fleet, spool answers per shard, and
commit each shard once all its lines are answered or failed.

On-disk state (the output location holds all of it, so the same command resumes):

- ``shard-NNNNNN.jsonl``: the answers for input lines ``[N*S, (N+1)*S)``; its existence is the
  commit, and a finished shard is never redone nor rewritten (``S`` is ``--shard-size``).
- ``failures-NNNNNN.jsonl``: that shard's failed lines, committed just before the shard (a
  failures file without its shard is from a killed run and is deleted at the next start).
- ``manifest.json``: the job (shard size) and each shard's counts, sha256 and input digest
  (identity.py: the job is its input's content, not its path), rewritten just before each
  shard is committed, so a committed shard always has its input digest; an entry whose shard
  is missing was being committed when the run was killed and is redone. Its ``format`` is the
  input's (batchformat.py: chat or OpenAI Batch), which a resumed job's input must keep.
  ``failures.jsonl`` gathers every shard's failures when the input is done.
- ``retry-RRR.jsonl`` and ``retry-failures-RRR.jsonl``: round R of ``--retry-failures`` (a
  finished job only): the lines still failed after the previous round (or the shards) are sent
  again; their records go to the round's file, those failing again to its failures file, which
  is then the job's ``failures.jsonl``. A round is committed like a shard, so an id still lands
  in exactly one records file.

Lines of the same shard are answered in any order; an id appears in exactly one shard, and a
repeated id in the input goes to the failures file instead of being written twice.

On a resumed job each finished shard's input digest is compared as its lines are read: a
changed shard stops the run (or, with --redo-changed, is discarded and redone). Until every
finished shard has been compared, no new shard is committed, so a refused run writes nothing.

    summary = asyncio.run(run(Options("in.jsonl", "out/", "http://127.0.0.1:30000")))
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import ssl
from collections.abc import Coroutine, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Literal, TypeVar

import httpx
import orjson

from sglang_fleet.config import validators
from sglang_fleet.generate import batchformat, capacity, fingerprint
from sglang_fleet.generate.batchformat import Input
from sglang_fleet.generate.commands import results_command, retry_command
from sglang_fleet.generate.completion import Limiter, Outcome, complete
from sglang_fleet.generate.errors import GenerateError
from sglang_fleet.generate.http_pool import Pool, tls_context
from sglang_fleet.generate.identity import (
    DIGEST_KEY,
    REDO_FLAG,
    Reading,
    changed,
    conflict,
    refuse_changed,
)
from sglang_fleet.generate.interrupt import guard
from sglang_fleet.generate.outage import Breaker
from sglang_fleet.generate.progress import Display, Stats, final_table
from sglang_fleet.generate.source import LineError, input_size, read_batches
from sglang_fleet.generate.store import Store, open_store, share_suffix

MANIFEST = "manifest.json"
FAILURES = "failures.jsonl"
MAX_OPEN_SHARDS = 64
HEALTH_TIMEOUT_S = 30.0  # SGLang's /health_generate waits for a one-token generation
T = TypeVar("T")


@dataclass
class Options:
    """What ``sglang-fleet generate`` was asked to do."""

    input: str
    output: str
    url: str
    api_key: str | None = None
    model: str | None = None
    concurrency: int = 64
    shard_size: int = 1000
    retries: int = 8
    timeout: float = 3600.0
    refresh_s: float = 10.0
    json_status: bool = False
    s3_endpoint: str | None = None
    retry_failures: bool = False
    redo_changed: bool = False
    ca_bundle: str | None = None
    worker: tuple[int, int] | None = None  # --worker K/N: shards i with i % N == K
    allow_mixed: bool = False


def layout(share: tuple[int, int] | None) -> str:
    """How a share is run. Example: layout((0, 3)) == "--worker K/3"."""
    return "one run (no --worker)" if share is None else f"--worker K/{share[1]}"


def shard_name(index: int) -> str:
    return f"shard-{index:06d}.jsonl"


def failures_name(index: int) -> str:
    return f"failures-{index:06d}.jsonl"


def manifest_name(share: tuple[int, int] | None = None) -> str:
    """``manifest.json`` for a whole job, ``manifest-K-of-N.json`` for worker K of N."""
    return f"manifest{share_suffix(share)}.json"


def retry_name(round_: int, share: tuple[int, int] | None = None) -> str:
    return f"retry-{round_:03d}{share_suffix(share)}.jsonl"


def retry_failures_name(round_: int, share: tuple[int, int] | None = None) -> str:
    return f"retry-failures-{round_:03d}{share_suffix(share)}.jsonl"


def gathered_failures_name(share: tuple[int, int] | None = None) -> str:
    return f"failures{share_suffix(share)}.jsonl"


def shard_index(name: str, prefix: str, share: tuple[int, int] | None = None) -> int | None:
    """``shard-000012.jsonl`` -> 12 for prefix "shard-"; with ``share``, only names that
    carry its suffix (``retry-002-0-of-3.jsonl`` -> 2 for share (0, 3))."""
    suffix = share_suffix(share) + ".jsonl"
    stem = name.removeprefix(prefix).removesuffix(suffix)
    if name.startswith(prefix) and name.endswith(suffix) and stem.isdigit():
        return int(stem)
    return None


def manifest_share(name: str) -> tuple[int, int] | Literal[False] | None:
    """The share a manifest's name says (None: the whole job's), False if not a manifest.
    Example: manifest_share("manifest-1-of-3.json") == (1, 3)."""
    if name == MANIFEST:
        return None
    parts = name.removeprefix("manifest-").removesuffix(".json").split("-of-")
    if name.startswith("manifest-") and name.endswith(".json") and len(parts) == 2 and \
            all(x.isdigit() for x in parts):
        return int(parts[0]), int(parts[1])
    return False


@dataclass
class Shard:
    """A shard being filled: spool files, counts, and whether all its lines were read."""

    index: int
    out: IO[bytes]
    fail: IO[bytes]
    out_path: Path
    fail_path: Path
    pending: int = 0
    records: int = 0
    failures: int = 0
    read_all: bool = False
    digest: Any = field(default_factory=hashlib.sha256)
    input_digest: str | None = None
    round: int = 0  # a --retry-failures round's file, not an input range's shard

    share: tuple[int, int] | None = None  # a retry round's worker

    @property
    def names(self) -> tuple[str, str]:
        """(records file, failures file) on the output."""
        if self.round:
            return retry_name(self.round, self.share), retry_failures_name(self.round,
                                                                           self.share)
        return shard_name(self.index), failures_name(self.index)


def _entry(index: int, size: int, records: int, failures: int, data_sha: str,
           nbytes: int, input_digest: str | None = None) -> dict[str, Any]:
    entry = {"name": shard_name(index), "first_line": index * size + 1, "records": records,
             "failures": failures, "bytes": nbytes, "sha256": data_sha}
    if input_digest is not None:
        entry[DIGEST_KEY] = input_digest
    return entry


def id_key(ident: str) -> int:
    """8 bytes of an id's digest: 1M ids in tens of MB."""
    return int.from_bytes(hashlib.blake2b(ident.encode(), digest_size=8).digest(), "big")


def failure_names(done: dict[int, dict[str, Any]], rounds: dict[int, dict[str, Any]],
                  share: tuple[int, int] | None = None) -> list[str]:
    """The failures files listing the lines still without a record: the last retry round's,
    else every shard's (by index). Example: ["failures-000000.jsonl", "failures-000007.jsonl"]
    before any round, ["retry-failures-002.jsonl"] after two."""
    if rounds:
        last = max(rounds)
        return [retry_failures_name(last, share)] if rounds[last]["failures"] else []
    return [failures_name(i) for i, e in sorted(done.items()) if e["failures"]]


def _round_entry(round_: int, records: int, failures: int, data_sha: str,
                 nbytes: int, share: tuple[int, int] | None = None) -> dict[str, Any]:
    return {"name": retry_name(round_, share), "round": round_, "records": records,
            "failures": failures, "bytes": nbytes, "sha256": data_sha}


def dump_line(data: dict[str, Any]) -> bytes:
    """One JSONL line, compact UTF-8 (orjson: a tenth of json's CPU; json for what orjson
    refuses, e.g. an integer beyond 64 bits in an answer).

    Example: dump_line({"id": "é", "n": None}) == '{"id":"é","n":null}\n'.encode()
    """
    try:
        return orjson.dumps(data, option=orjson.OPT_APPEND_NEWLINE)
    except TypeError:  # orjson.JSONEncodeError is a TypeError
        return json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"


class Job:
    """One run of a job (see the module docstring for the state it keeps)."""

    def __init__(self, opts: Options, store: Store, s3: Any, source: Input,
                 tls: ssl.SSLContext | None = None) -> None:
        self.opts = opts
        self.share = opts.worker
        self.input = source
        self.fmt = source.format or batchformat.CHAT  # the job's, once the manifest is read
        self.tls = tls
        self.store = store
        self.s3 = s3
        self.size = opts.shard_size
        self.manifest: dict[str, Any] = {}
        self.done: dict[int, dict[str, Any]] = {}
        self.rounds: dict[int, dict[str, Any]] = {}  # --retry-failures rounds committed
        self.open: dict[int, Shard] = {}
        self.seen: set[int] = set()
        self.stats = Stats()
        self.display = Display(self.stats, opts.json_status)
        self.limiter = Limiter(opts.concurrency)
        self.breaker = Breaker(self.health, self.paused, self.resumed)
        self.http: Pool | None = None
        self.window = Limiter(2 * opts.concurrency + 64)  # requests started, bounded memory
        self.shard_closed = asyncio.Event()
        self.commit_lock = asyncio.Lock()
        self.commits: set[asyncio.Task[None]] = set()
        self.errors: list[BaseException] = []
        self.unverified: set[int] = set()  # finished shards whose input is not compared yet
        self.held_commits: list[Shard] = []  # ready, waiting for every comparison
        self.failed_at: dict[int, set[int]] = {}  # a finished shard's failed line numbers
        self.fingerprints: dict[str, dict[str, Any]] = {}  # digest -> fields, on the manifest
        self.digest = fingerprint.UNKNOWN
        self.halt: GenerateError | None = None  # the fleet changed: nothing more is committed

    # ---- state on the output -------------------------------------------------------------
    def load_state(self) -> None:
        """Read the manifests (this run's, and other workers' for the layout), add this run's
        shards committed after its manifest's last write, drop its stray failures files."""
        names = self.store.names()
        manifests = self.read_manifests(names)
        self.manifest = manifests.get(self.share, {})
        self.fingerprints = dict(self.manifest.get("fingerprints") or {})
        entries = [e for m in manifests.values() for e in m.get("shards", [])]
        self.done = {i: e for e in entries if e["name"] in names
                     and self.mine(i := int(e["first_line"] - 1) // self.size)}
        for name in names:
            index = shard_index(name, "shard-")
            if index is not None and index not in self.done and self.mine(index):
                self.done[index] = self._rebuild(index, names)
        for name in names:
            index = shard_index(name, "failures-")
            if index is not None and index not in self.done and self.mine(index):
                self.store.delete(name)
        self.load_rounds(names)
        self.unverified = set(self.done)
        self.stats.shards_skipped = len(self.done)
        self.stats.skipped = sum(e["records"] for e in [*self.done.values(),
                                                        *self.rounds.values()])
        self.stats.earlier_failed = self.outstanding()

    def mine(self, index: int) -> bool:
        """Whether shard ``index`` is this run's: every shard, or worker K of N's share."""
        return self.share is None or index % self.share[1] == self.share[0]

    def read_manifests(self, names: set[str]) -> dict[tuple[int, int] | None, dict[str, Any]]:
        """Every manifest on the output, by the share that wrote it; refused if an unfinished
        one is of another layout (one run, or --worker runs of another N)."""
        found: dict[tuple[int, int] | None, dict[str, Any]] = {}
        for name in sorted(names):
            share = manifest_share(name)
            if share is False:
                continue
            raw = self.store.get_bytes(name)
            manifest = json.loads(raw) if raw else {}
            self._check_same_job(manifest, name)
            if manifest and not manifest.get("complete") and share != self.share and \
                    (share is None or self.share is None or share[1] != self.share[1]):
                raise GenerateError(
                    f"{self.store.location.rstrip('/')}/{name}: an unfinished job run as "
                    f"{layout(share)} writes here; finish it that way (the same command with "
                    f"{layout(share)}), or write to another output")
            found[share] = manifest
        return found

    def load_rounds(self, names: set[str]) -> None:
        """Retry rounds from the manifest, plus one committed just before a kill; a round's
        failures file without its records file is from a killed run."""
        self.rounds = {int(e["round"]): e for e in self.manifest.get("retries", [])}
        for name in names:
            round_ = shard_index(name, "retry-", self.share)
            if round_ is not None and round_ not in self.rounds:
                data = self.store.get_bytes(name) or b""
                fails = self.store.get_bytes(retry_failures_name(round_, self.share)) or b""
                self.rounds[round_] = _round_entry(round_, data.count(b"\n"),
                                                   fails.count(b"\n"),
                                                   hashlib.sha256(data).hexdigest(), len(data),
                                                   self.share)
        for name in names:
            round_ = shard_index(name, "retry-failures-", self.share)
            if round_ is not None and round_ not in self.rounds:
                self.store.delete(name)

    def outstanding(self) -> int:
        """Lines without a record: the last retry round's failures, else the shards'."""
        if self.rounds:
            return int(self.rounds[max(self.rounds)]["failures"])
        return sum(int(e["failures"]) for e in self.done.values())

    def _check_same_job(self, manifest: dict[str, Any], name: str) -> None:
        """Only the shard size here: the input is compared by content as it is read (its
        path may differ from run to run)."""
        where = f"{self.store.location.rstrip('/')}/{name}"
        if manifest and manifest.get("shard_size") != self.size:
            raise GenerateError(f"{where}: the job was started with --shard-size "
                                f"{manifest.get('shard_size')}; rerun with that value")
        self.fmt = batchformat.job_format(manifest, self.input.format, where, self.opts.input)

    def _rebuild(self, index: int, names: set[str]) -> dict[str, Any]:
        """The manifest entry of a shard committed just before a kill."""
        data = self.store.get_bytes(shard_name(index)) or b""
        fails = self.store.get_bytes(failures_name(index)) if failures_name(index) in names \
            else b""
        return _entry(index, self.size, data.count(b"\n"), (fails or b"").count(b"\n"),
                      hashlib.sha256(data).hexdigest(), len(data))

    async def write_manifest(self, complete: bool) -> None:
        self.manifest = {"version": 2, "input": self.opts.input, "url": self.opts.url,
                         "shard_size": self.size, batchformat.FORMAT_KEY: self.fmt.name,
                         "complete": complete, "fingerprints": self.fingerprints,
                         "records": sum(e["records"] for e in self.done.values())
                         + sum(e["records"] for e in self.rounds.values()),
                         "failures": self.outstanding(),
                         "shards": [self.done[i] for i in sorted(self.done)]}
        if self.rounds:
            self.manifest["retries"] = [self.rounds[r] for r in sorted(self.rounds)]
        if self.share is not None:
            self.manifest["worker"] = list(self.share)
        data = json.dumps(self.manifest, indent=1).encode()
        await asyncio.to_thread(self.store.put_bytes, data, manifest_name(self.share))

    # ---- shards ----------------------------------------------------------------------------
    def shard(self, index: int) -> Shard:
        if index not in self.open:
            out_path = self.store.spool / f"{shard_name(index)}.part"
            fail_path = self.store.spool / f"{failures_name(index)}.part"
            self.open[index] = Shard(index, out_path.open("wb"), fail_path.open("wb"),
                                     out_path, fail_path)
        return self.open[index]

    def close_reading(self, shard: Shard) -> None:
        shard.read_all = True
        self._maybe_commit(shard)

    def _maybe_commit(self, shard: Shard) -> None:
        if self.halt is not None:  # answered by a fleet this job did not start with
            return
        if shard.read_all and shard.pending == 0 and shard.index in self.open:
            del self.open[shard.index]
            self.shard_closed.set()
            if self.unverified:  # a changed input must not leave a single shard behind
                self.held_commits.append(shard)
            else:
                self._start_commit(shard)

    def _start_commit(self, shard: Shard) -> None:
        task = asyncio.create_task(self._commit(shard))
        self.commits.add(task)
        task.add_done_callback(self._commit_done)

    def release_commits(self) -> None:
        """Every finished shard matched the input read now: commit the shards held back."""
        held, self.held_commits = self.held_commits, []
        for shard in held:
            self._start_commit(shard)

    def _commit_done(self, task: asyncio.Task[None]) -> None:
        self.commits.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self.errors.append(task.exception())  # type: ignore[arg-type]

    async def _commit(self, shard: Shard) -> None:
        try:
            await self._write_shard(shard)
        except Exception as exc:  # S3 or disk refused: stop; a rerun redoes only this shard
            raise GenerateError(f"{self.store.location}: cannot write {shard.names[0]}"
                                f": {exc}; run the same command again to resume") from None

    async def _write_shard(self, shard: Shard) -> None:
        """Failures first, then the manifest and the shard (the commit); a retry round's
        manifest after its file (a round has no input digest to keep)."""
        shard.out.close()
        shard.fail.close()
        out_name, fail_name = shard.names
        async with self.commit_lock:
            if shard.failures:
                await asyncio.to_thread(self.store.put_file, shard.fail_path, fail_name)
            else:
                shard.fail_path.unlink()
            nbytes = shard.out_path.stat().st_size
            counts = (shard.records, shard.failures, shard.digest.hexdigest(), nbytes)
            if shard.round:
                await asyncio.to_thread(self.store.put_file, shard.out_path, out_name)
                self.rounds[shard.round] = _round_entry(shard.round, *counts, self.share)
                # a retry round runs on a finished job, which stays finished if killed now
                await self.write_manifest(complete=True)
            else:
                self.done[shard.index] = _entry(shard.index, self.size, *counts,
                                                shard.input_digest)
                await self.write_manifest(complete=False)
                await asyncio.to_thread(self.store.put_file, shard.out_path, out_name)
            self.stats.shards_written += 1

    # ---- requests --------------------------------------------------------------------------
    def record_line(self, shard: Shard, data: dict[str, Any], ok: bool) -> None:
        line = dump_line(data)
        if ok:
            shard.out.write(line)
            shard.digest.update(line)
            shard.records += 1
        else:
            shard.fail.write(line)
            shard.failures += 1

    async def handle(self, http: Pool, shard: Shard, item: Any,
                     nbytes: int, lineno: int) -> None:
        try:
            outcome = await complete(http, self.limiter, self.opts.url, item, self.opts.retries,
                                     self.breaker, self.fmt.record)
        except Exception as exc:  # a bug must not leave the shard open forever
            outcome = Outcome(None, f"internal error: {exc!r}", 1, "internal_error")
        self.finish(shard, item.id, item.sha256, outcome, nbytes, lineno)
        self.window.release()

    def finish(self, shard: Shard, ident: str, sha: str | None, outcome: Outcome,
               nbytes: int, lineno: int) -> None:
        if outcome.record is not None:
            outcome.record["fingerprint"] = self.digest
            self.record_line(shard, outcome.record, True)
        else:  # the line number lets --retry-failures find the request again
            self.record_line(shard, self.fmt.failure(ident, lineno, sha, outcome), False)
        self.stats.add(outcome.usage, nbytes, outcome.tries, outcome.record is not None)
        shard.pending -= 1
        self._maybe_commit(shard)

    def first_sight(self, ident: str) -> bool:
        """False if ``ident`` was already seen in this input (8-byte digests keep 1M ids in
        tens of MB)."""
        key = id_key(ident)
        if key in self.seen:
            return False
        self.seen.add(key)
        return True

    async def dispatch(self, http: Pool, lineno: int, raw: bytes,
                       tasks: set[asyncio.Task[None]], into: Shard | None = None) -> None:
        """Start one line's request (or fail it at once: bad line, repeated id), for its
        shard or ``into`` a retry round."""
        shard = into or self.shard(lineno // self.size)
        shard.pending += 1
        try:
            item = self.fmt.parse(lineno, raw, self.opts.input, self.opts.model)
        except LineError as exc:
            ident = self.fmt.line_id(lineno, raw)  # the line's own id when it has one
            self.first_sight(ident)
            self.finish(shard, ident, None, Outcome(None, str(exc), 1, "invalid_line"),
                        len(raw), lineno)
            return
        if not self.first_sight(item.id):
            self.finish(shard, item.id, item.sha256, Outcome(
                None, f"{self.opts.input} line {lineno + 1}: id {item.id!r} appears earlier "
                "in the input; ids must be unique", 1, "duplicate_id"), len(raw), lineno)
            return
        while len(self.open) > MAX_OPEN_SHARDS:  # one slow line holds its shard open
            self.shard_closed.clear()
            await self.shard_closed.wait()
        await self.window.acquire()
        task = asyncio.create_task(self.handle(http, shard, item, len(raw), lineno))
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    # ---- reading the input: every line once, each range compared or given its digest ------
    async def feed(self, http: Pool, batches: Iterator[list[tuple[int, bytes]]],
                   tasks: set[asyncio.Task[None]], retry: set[int] | None = None) -> None:
        """Send the lines of unfinished shards (or, for ``retry``, the failed lines again into
        a new round); a finished shard's lines only mark their ids as seen, so a repeated id
        later on fails rather than being written twice."""
        into = self.retry_shard() if retry is not None else None
        reading: Reading | None = None
        while (batch := await asyncio.to_thread(next, batches, None)) is not None:
            for lineno, raw in batch:
                index = lineno // self.size
                if not self.mine(index):
                    self.foreign(lineno, raw)
                    continue
                if reading is None or index != reading.index:
                    if reading is not None:
                        await self.end_reading(http, reading, tasks)
                    reading = self.begin_reading(index)
                reading.add(raw)
                if into is not None and lineno in (retry or ()):
                    await self.dispatch(http, lineno, raw, tasks, into=into)
                elif index in self.done:
                    await self.skip(reading, lineno, raw)
                elif into is None and raw.strip():
                    await self.dispatch(http, lineno, raw, tasks)
                elif into is None:
                    self.shard(index)
                if self.errors:
                    raise self.errors[0]
        if reading is not None:
            await self.end_reading(http, reading, tasks)
        for index in sorted(self.unverified):  # finished shards past the input's end
            await self.compare(http, Reading(index, index * self.size), tasks)
        if into is not None:
            self.close_reading(into)

    def begin_reading(self, index: int) -> Reading:
        reading = Reading(index, index * self.size)
        if index in self.done and self.opts.redo_changed:
            reading.hold(self.store.spool)
        return reading

    async def end_reading(self, http: Pool, reading: Reading,
                          tasks: set[asyncio.Task[None]]) -> None:
        try:
            if reading.index in self.done:
                await self.compare(http, reading, tasks)
            elif self.opts.retry_failures:
                raise refuse_changed(self.opts.input, reading.index, self.size,
                                     "the input has lines past the finished job's end",
                                     self.fix_changed())
            else:
                self.close_shard(reading)
        finally:
            reading.close()

    def close_shard(self, reading: Reading) -> None:
        """Every line of an unfinished range is read: its shard keeps the range's digest."""
        shard = self.shard(reading.index)
        shard.input_digest = reading.hexdigest()
        self.close_reading(shard)

    def foreign(self, lineno: int, raw: bytes) -> None:
        """A line of another worker's shard: only its id is marked, so that an id repeating
        it later on fails here as it would in one run (its owner fails a repeat of ours)."""
        self.stats.bytes_skipped += len(raw)
        if raw.strip():
            self.seen.add(id_key(self.fmt.line_id(lineno, raw)))

    async def skip(self, reading: Reading, lineno: int, raw: bytes) -> None:
        self.stats.bytes_skipped += len(raw)
        if not raw.strip():
            return
        ident = self.fmt.line_id(lineno, raw)
        key = id_key(ident)
        if key not in self.seen:
            self.seen.add(key)
            if reading.held is not None:
                reading.marked.append(key)
        elif reading.conflict is None and lineno + 1 not in await self.failed_in(reading.index):
            # unchanged lines repeat an id only where the earlier run failed them too
            reading.conflict = conflict(lineno, ident, shard_name(reading.index))

    async def failed_in(self, index: int) -> set[int]:
        """The line numbers (from 1) in a finished shard's failures file."""
        if index not in self.failed_at:
            found: set[int] = set()
            if self.done[index]["failures"]:
                data = await asyncio.to_thread(self.store.get_bytes, failures_name(index))
                found = {orjson.loads(raw).get("line") for raw in (data or b"").splitlines()}
            self.failed_at[index] = found
        return self.failed_at[index]

    async def compare(self, http: Pool, reading: Reading,
                      tasks: set[asyncio.Task[None]]) -> None:
        """A finished shard against the lines read now for its range: the same, or refused,
        or (--redo-changed) discarded and sent again."""
        why = changed(self.done[reading.index], reading)
        if why is not None:
            if not self.opts.redo_changed or self.opts.retry_failures or self.rounds:
                raise refuse_changed(self.opts.input, reading.index, self.size, why,
                                     self.fix_changed())
            self.display.event("redo", shard=shard_name(reading.index), reason=why)
            await self.discard(reading)
            await self.replay(http, reading, tasks)
        self.unverified.discard(reading.index)
        if not self.unverified:
            self.release_commits()

    def fix_changed(self) -> str:
        if self.opts.retry_failures:
            return (f"run the same command without --retry-failures, with {REDO_FLAG}, to "
                    "redo the changed shards first")
        if self.rounds and self.opts.redo_changed:
            return ("this job has --retry-failures rounds, whose records are not split by "
                    "shard: write to another output")
        return (f"rerun with {REDO_FLAG} to discard and redo only the changed shards, or "
                "write to another output")

    async def discard(self, reading: Reading) -> None:
        """Drop a changed shard: its records first (a failures file without its shard is a
        killed run's, deleted at the next start), then its manifest entry."""
        entry = self.done.pop(reading.index)
        for key in reading.marked:  # its ids are seen again as its new lines are sent
            self.seen.discard(key)
        self.stats.skipped -= int(entry["records"])
        self.stats.shards_skipped -= 1
        self.stats.bytes_skipped -= reading.nbytes
        self.stats.earlier_failed = self.outstanding()
        async with self.commit_lock:
            for name in (shard_name(reading.index), failures_name(reading.index)):
                await asyncio.to_thread(self.store.delete, name)
            await self.write_manifest(complete=False)

    async def replay(self, http: Pool, reading: Reading,
                     tasks: set[asyncio.Task[None]]) -> None:
        """Send a discarded shard's lines, as read now."""
        lines = reading.held_lines()
        for offset, raw in enumerate(lines):
            lineno = reading.first_line + offset
            if raw.strip():
                await self.dispatch(http, lineno, raw, tasks)
            else:
                self.shard(reading.index)
            if self.errors:
                raise self.errors[0]
        if lines:
            self.close_shard(reading)

    # ---- --retry-failures -------------------------------------------------------------------
    async def failed_lines(self) -> set[int]:
        """Line numbers (from 0) of the lines still without a record: the last round's
        failures, else every shard's. Example: {41, 977} after two lines failed."""
        where = self.store.location.rstrip("/")
        if not self.manifest.get("complete"):
            raise GenerateError(f"{where}: no finished job to retry (no complete manifest); "
                                "run the same command without --retry-failures first")
        names = failure_names(self.done, self.rounds, self.share)
        lines: set[int] = set()
        for name in names:
            data = await asyncio.to_thread(self.store.get_bytes, name) or b""
            for raw in data.splitlines():
                line = orjson.loads(raw).get("line")
                if not isinstance(line, int):
                    raise GenerateError(f"{where}/{name}: a failure without its line number "
                                        "(written by an older version); start a new job "
                                        "with the failed ids")
                lines.add(line - 1)
        return lines

    def retry_shard(self) -> Shard:
        """The next round's file, open among the shards (index -R: no input range)."""
        round_ = max(self.rounds, default=0) + 1
        out_path = self.store.spool / f"{retry_name(round_, self.share)}.part"
        fail_path = self.store.spool / f"{retry_failures_name(round_, self.share)}.part"
        shard = Shard(-round_, out_path.open("wb"), fail_path.open("wb"), out_path, fail_path,
                      round=round_, share=self.share)
        self.open[shard.index] = shard
        return shard

    # ---- fleet and display -----------------------------------------------------------------
    async def follow_fleet(self, http: Pool) -> None:
        """Resize to the fleet every refresh_s: workers come and go during a roll."""
        while True:
            await asyncio.sleep(self.opts.refresh_s)
            try:
                limit, how = await capacity.fleet_capacity(http, self.opts.url)
            except Exception as exc:  # an odd answer mid-roll: keep the last size
                limit, how = None, repr(exc)
            if limit and limit != self.limiter.limit:
                self.resize(limit)
                self.display.event("concurrency", limit=limit, source=how)
            await self.follow_fingerprint(http)

    async def health(self) -> str | None:
        """The fleet's health through --url (None: healthy), the outage breaker's probe."""
        url = f"{self.opts.url}/health_generate"
        assert self.http is not None
        try:
            # a new connection: a kept-alive one the server closed would say nothing of it
            response = await self.http.get(url, HEALTH_TIMEOUT_S, fresh=True)
        except httpx.HTTPError as exc:
            return f"GET /health_generate: {type(exc).__name__}"
        if response.status_code == 200:
            return None
        return f"GET /health_generate: HTTP {response.status_code}"

    def paused(self, cause: str) -> None:
        """Every request is failing and nothing is answered: lines wait instead of failing."""
        self.stats.pause_cause, self.stats.paused_since = cause, self.breaker.paused_since
        self.display.event("paused", cause=cause, waiting=self.window.busy,
                           probe="GET /health_generate, every 1 s doubling to 30 s")

    def resumed(self, seconds: float, cause: str) -> None:
        self.stats.paused_s += seconds
        self.stats.pause_cause = self.stats.paused_since = None
        self.display.event("resumed", paused_s=round(seconds, 1), cause=cause)

    def resize(self, limit: int) -> None:
        self.limiter.resize(limit)
        self.window.resize(2 * limit + 64)
        self.stats.concurrency = limit

    async def ticker(self) -> None:
        interval = 5.0 if self.opts.json_status else 0.5
        while True:
            await asyncio.sleep(interval)
            self.display.tick()

    async def size_fleet(self, http: Pool) -> None:
        limit, how = await capacity.fleet_capacity(http, self.opts.url)
        if limit is None:
            limit, how = self.opts.concurrency, f"--concurrency (fleet not sized: {how})"
        self.resize(limit)
        self.display.event("concurrency", limit=limit, source=how)

    async def take_fingerprint(self, http: Pool) -> None:
        """What answers now; refused if the job's records were answered by another fleet
        configuration, unless --allow-mixed (an unknown one, on either side, is no evidence
        of another: sglang-router 0.3.2 gives none through the router, smg does)."""
        found = await fingerprint.read(http, self.opts.url)
        digest, fields = (found.digest, found.fields) if found else (fingerprint.UNKNOWN, {})
        has_records = any(e["records"] for e in [*self.done.values(), *self.rounds.values()])
        if found is not None and self.known() and digest not in self.fingerprints and \
                has_records and not self.opts.allow_mixed:
            raise self.mixed(digest, fields, "")
        self.fingerprints[digest] = fields
        self.digest = digest
        self.display.event("fingerprint", digest=digest,
                           answered_by=fingerprint.describe(fields))

    def known(self) -> set[str]:
        """The fingerprints of this job's records that name a configuration."""
        return {d for d in self.fingerprints if d != fingerprint.UNKNOWN}

    async def follow_fingerprint(self, http: Pool) -> None:
        """A fleet whose configuration changed mid-run (a redeploy): with --allow-mixed the
        records after it name the new one; otherwise nothing more is committed and the run
        stops, naming both. A fingerprint read where none could be (a router changed to one
        that passes /get_server_info on) is learned, not a change, unless the job's earlier
        records name another."""
        found = await fingerprint.read(http, self.opts.url)
        if found is None or found.digest == self.digest or self.halt is not None:
            return
        learned = self.digest == fingerprint.UNKNOWN and (
            not self.known() or found.digest in self.fingerprints)
        if self.opts.allow_mixed or learned:
            self.fingerprints[found.digest] = found.fields
            self.digest = found.digest
            self.display.event("fingerprint", digest=found.digest, changed=not learned,
                               answered_by=fingerprint.describe(found.fields))
            return
        self.halt = self.mixed(found.digest, found.fields, " during this run")
        self.errors.append(self.halt)

    def mixed(self, digest: str, fields: dict[str, Any], when: str) -> GenerateError:
        old_digest = next(reversed(self.fingerprints)) if self.fingerprints else self.digest
        old = self.fingerprints.get(old_digest, {})
        return GenerateError(
            f"{self.store.location.rstrip('/')}/{manifest_name(self.share)}: this job's "
            f"records were answered by {fingerprint.describe(old)} [{old_digest}]; "
            f"{self.opts.url} answers{when} with {fingerprint.describe(fields)} [{digest}] "
            f"({fingerprint.differences(old, fields) or 'its fingerprint is unknown'})\n"
            f"    fix: redeploy the job's configuration, or rerun with "
            f"{fingerprint.MIXED_FLAG} to add records of this one (each record names its "
            "fingerprint), or write to another output")

    async def pick_model(self, http: Pool) -> None:
        if self.opts.model:
            return
        url = f"{self.opts.url}/v1/models"
        try:
            response = await http.get(url, 10)
        except httpx.HTTPError as exc:
            raise GenerateError(f"{url}: {type(exc).__name__} {exc}; check --url") from None
        try:
            self.opts.model = str(response.json()["data"][0]["id"])
        except (ValueError, KeyError, IndexError, TypeError):
            raise GenerateError(f"{url} answered {response.status_code} without a model name"
                                + (" (check --api-key-file)" if response.status_code == 401
                                   else "; pass --model NAME")) from None

    # ---- the run ---------------------------------------------------------------------------
    async def gather_failures(self) -> str | None:
        """``failures.jsonl``: every shard's failures, rewritten whole at the end of the input
        (after a retry round: that round's failures, or none)."""
        names = failure_names(self.done, self.rounds, self.share)
        gathered = gathered_failures_name(self.share)
        if not names:
            if self.rounds:  # every line has a record now: no stale list of failures
                await asyncio.to_thread(self.store.delete, gathered)
            return None
        chunks = [await asyncio.to_thread(self.store.get_bytes, name) for name in names]
        await asyncio.to_thread(self.store.put_bytes, b"".join(c or b"" for c in chunks),
                                gathered)
        return f"{self.store.location.rstrip('/')}/{gathered}"

    async def run(self) -> dict[str, Any]:
        await asyncio.to_thread(self.load_state)
        lines = await self.failed_lines() if self.opts.retry_failures else None
        try:
            self.stats.total_bytes = input_size(self.opts.input, self.s3)
        except Exception:  # no size (S3 HEAD refused, a pipe): no ETA, nothing else changes
            self.stats.total_bytes = None
        if self.display.bar is not None and self.stats.total_bytes:
            self.display.bar.total = self.stats.total_bytes
        headers = {"Content-Type": "application/json"}
        if self.opts.api_key:
            headers["Authorization"] = f"Bearer {self.opts.api_key}"
        http = self.http = Pool(headers, self.opts.timeout, only=self.opts.url, tls=self.tls)
        try:
            await self.pick_model(http)
            await self.size_fleet(http)
            await self.take_fingerprint(http)
            self.display.event("started", input=self.opts.input, output=self.store.location,
                               url=self.opts.url, concurrency=self.stats.concurrency)
            if lines:
                self.display.event("retrying", round=max(self.rounds, default=0) + 1,
                                   lines=len(lines))
            background = [asyncio.create_task(self.follow_fleet(http)),
                          asyncio.create_task(self.ticker())]
            tasks: set[asyncio.Task[None]] = set()
            try:
                if lines is None:
                    await self.feed(http, read_batches(self.input.lines), tasks)
                elif lines:  # nothing failed: nothing to send, no empty round
                    await self.feed(http, read_batches(self.input.lines), tasks, retry=lines)
                while tasks or self.commits:
                    await asyncio.gather(*tasks, *self.commits)
                if self.errors:
                    raise self.errors[0]
            finally:
                for task in background:
                    task.cancel()
        finally:
            await http.aclose()
        await self.write_manifest(complete=True)
        failures_file = await self.gather_failures()
        self.display.close()
        return {"output": self.store.location, "failures_file": failures_file,
                "records": self.manifest["records"], "failures": self.manifest["failures"],
                **self.stats.status()}


def check(opts: Options) -> None:
    """Options a job cannot run with. Example: check(Options("i", "o", "u", shard_size=0))
    raises GenerateError("--shard-size must be at least 1, not 0")."""
    for flag, value, low in (("--shard-size", opts.shard_size, 1),
                             ("--concurrency", opts.concurrency, 1),
                             ("--retries", opts.retries, 0), ("--timeout", opts.timeout, 1)):
        if value < low:
            raise GenerateError(f"{flag} must be at least {low}, not {value}")
    wrong = validators.url_problem(opts.url, allow_http=True)
    if wrong:  # never the URL itself here: it may hold user:password@
        raise GenerateError(f"--url: {wrong}; write http://HOST:PORT (a router or a server)"
                            + (", the key in --api-key-file" if "credentials" in wrong else ""))


async def run_job(opts: Options) -> tuple[dict[str, Any], Stats]:
    """Run (or resume) a job; the summary and the counters behind the final table."""
    check(opts)
    tls = tls_context(opts.ca_bundle)  # a bad CA file is said before the output is touched
    s3 = None
    if opts.input.startswith("s3://") or opts.output.startswith("s3://"):
        import boto3

        s3 = boto3.client("s3", endpoint_url=opts.s3_endpoint)
    # a first line of no format is refused before a request is sent or the output touched
    source = await asyncio.to_thread(batchformat.open_detected, opts.input, s3)
    try:
        store = open_store(opts.output, s3, opts.worker)
        job = Job(opts, store, s3, source, tls)
        try:
            summary = await job.run()
        finally:
            store.close()
    finally:
        source.close()
    return summary, job.stats


def run_loop(main: Coroutine[Any, Any, T]) -> T:
    """asyncio.run on uvloop where it is installed: its loop and sockets cost a fraction of
    asyncio's CPU per request (bench/generate.py), which keeps the client off the critical path."""
    try:
        import uvloop
    except ImportError:  # not on this platform: the standard loop works, only slower
        return asyncio.run(main)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(main)


def run(opts: Options, argv: Sequence[str] | None = None) -> int:
    """The command: run the job, print the final table (or a JSON line) with what to run next
    (``argv``: the command line as given, for the retry command); the exit status is 0
    when every line has a record, else 100 + the number of failed lines (at most 255)."""
    summary, stats = run_loop(guard(run_job(opts)))
    summary["retry_command"] = retry_command(argv) \
        if argv is not None and summary["failures"] else None
    summary["results_command"] = results_command(opts.output, opts.s3_endpoint)
    if opts.json_status:
        print(json.dumps({"event": "done", **summary}), flush=True)
    else:
        print(final_table(stats, summary))
    failed = int(summary["failures"])
    return 0 if failed == 0 else min(100 + failed, 255)
