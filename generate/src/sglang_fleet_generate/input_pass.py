"""One pass over the input: every line read once, and each one sent (its shard unfinished, or
a failed line in a --retry-failures round), failed at once (a bad line, a repeated id), or
skipped (its shard finished: only its id is marked as seen). Each finished shard's range is
compared with the digest it was made from as its lines go by; a changed one stops the run, or
with --redo-changed is discarded and sent again.

    tasks: set[asyncio.Task[None]] = set()
    await job.feed(http, read_batches(source.lines), tasks)   # every line of the input
    await job.feed(http, read_batches(source.lines), tasks, retry={41, 977})  # a retry round
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import orjson

from sglang_fleet_generate.commits import Commits
from sglang_fleet_generate.completion import Outcome, complete
from sglang_fleet_generate.http_pool import Pool
from sglang_fleet_generate.identity import REDO_FLAG, Reading, changed, conflict, refuse_changed
from sglang_fleet_generate.job_state import Shard
from sglang_fleet_generate.output_files import failures_name, id_key, shard_name
from sglang_fleet_generate.source import LineError

MAX_OPEN_SHARDS = 64  # past this, reading waits: one slow line holds its shard open
Tasks = set[asyncio.Task[None]]


class InputPass(Commits):
    """``seen``: 8-byte digests of every id read so far, so a repeated id fails."""

    # ---- one line's request ----------------------------------------------------------------
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

    async def dispatch(self, http: Pool, lineno: int, raw: bytes, tasks: Tasks,
                       into: Shard | None = None) -> None:
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
                   tasks: Tasks, retry: set[int] | None = None) -> None:
        """Send the lines of unfinished shards (or, for ``retry``, the failed lines again into
        a new round); a finished shard's lines only mark their ids as seen, so a repeated id
        later on fails rather than being written twice."""
        into = self.retry_shard() if retry is not None else None
        reading: Reading | None = None
        while (batch := await asyncio.to_thread(next, batches, None)) is not None:
            for lineno, raw in batch:
                index = lineno // self.size
                if reading is None or index != reading.index:
                    if reading is not None:
                        await self.end_reading(http, reading, tasks)
                    reading = self.begin_reading(index)
                reading.add(raw)
                if not self.mine(index):
                    self.foreign(lineno, raw)
                elif into is not None and lineno in (retry or ()):
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

    async def end_reading(self, http: Pool, reading: Reading, tasks: Tasks) -> None:
        try:
            if reading.index in self.done or reading.index in self.others:
                await self.compare(http, reading, tasks)
            elif not self.mine(reading.index):
                pass  # another worker's, not finished yet: its owner compares it
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

    # ---- a finished shard whose input changed ----------------------------------------------
    async def compare(self, http: Pool, reading: Reading, tasks: Tasks) -> None:
        """A finished shard (this run's, or another worker's) against the lines read now for
        its range: the same, or refused, or (--redo-changed) discarded and sent again; another
        worker's is left to its owner under --redo-changed."""
        index = reading.index
        why = changed(self.done.get(index) or self.others[index], reading)
        if why is not None and index in self.others:
            why = self.foreign_change(index, why)
        if why is not None:
            if not self.opts.redo_changed or self.opts.retry_failures or self.rounds:
                raise refuse_changed(self.opts.input, index, self.size, why,
                                     self.fix_changed())
            self.display.event("redo", shard=shard_name(index), reason=why)
            await self.discard(reading)
            await self.replay(http, reading, tasks)
        self.unverified.discard(index)
        if not self.unverified:
            self.release_commits()

    def foreign_change(self, index: int, why: str) -> str | None:
        """Another worker's changed shard: said with its owner and the output; None under
        --redo-changed, which each worker runs for its own shards."""
        if self.opts.redo_changed and not self.opts.retry_failures:
            self.display.event("changed_elsewhere", shard=shard_name(index), reason=why)
            return None
        assert self.share is not None  # a run without --worker owns every shard
        owner = f"--worker {index % self.share[1]}/{self.share[1]}"
        return f"{why}; it is {owner}'s shard on {self.store.location.rstrip('/')}"

    def fix_changed(self) -> str:
        if self.opts.retry_failures:
            return (f"run the same command without --retry-failures, with {REDO_FLAG}, to "
                    "redo the changed shards first")
        if self.rounds and self.opts.redo_changed:
            return ("this job has --retry-failures rounds, whose records are not split by "
                    "shard: write to another output")
        if self.share is not None:
            return (f"rerun every worker with {REDO_FLAG} (each discards and redoes its own "
                    "changed shards), or write to another output")
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

    async def replay(self, http: Pool, reading: Reading, tasks: Tasks) -> None:
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
