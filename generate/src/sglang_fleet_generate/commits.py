"""The shards being filled and their commit. Each open shard spools its records and failures to
local files; once all its lines are read and answered it is committed: failures file, manifest,
then the records file, whose existence on the output is the commit (a retry round: its file,
then the manifest). Commits wait while a finished shard's input is not compared yet, so that a
refused (changed) input leaves nothing behind.

    shard = commits.shard(3)                  # spool files for input lines [3S, 4S)
    commits.record_line(shard, record, ok=True)
    commits.close_reading(shard)              # every line read: committed once answered
"""

from __future__ import annotations

import asyncio
from typing import Any

from sglang_fleet_generate.errors import GenerateError
from sglang_fleet_generate.job_state import Shard
from sglang_fleet_generate.ledger import Ledger
from sglang_fleet_generate.output_files import (
    dump_line,
    failures_name,
    retry_failures_name,
    retry_name,
    round_entry,
    shard_entry,
    shard_name,
)


class Commits(Ledger):
    """``open``: the shards being filled, by index (a retry round's at -R)."""

    def shard(self, index: int) -> Shard:
        if index not in self.open:
            out_path = self.store.spool / f"{shard_name(index)}.part"
            fail_path = self.store.spool / f"{failures_name(index)}.part"
            self.open[index] = Shard(index, out_path.open("wb"), fail_path.open("wb"),
                                     out_path, fail_path)
        return self.open[index]

    def retry_shard(self) -> Shard:
        """The next round's file, open among the shards (index -R: no input range)."""
        round_ = max(self.rounds, default=0) + 1
        out_path = self.store.spool / f"{retry_name(round_, self.share)}.part"
        fail_path = self.store.spool / f"{retry_failures_name(round_, self.share)}.part"
        shard = Shard(-round_, out_path.open("wb"), fail_path.open("wb"), out_path, fail_path,
                      round=round_, share=self.share)
        self.open[shard.index] = shard
        return shard

    def record_line(self, shard: Shard, data: dict[str, Any], ok: bool) -> None:
        line = dump_line(data)
        if ok:
            shard.out.write(line)
            shard.digest.update(line)
            shard.records += 1
        else:
            shard.fail.write(line)
            shard.failures += 1

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
                self.rounds[shard.round] = round_entry(shard.round, *counts, self.share,
                                                       self.store.fence)
                # a retry round runs on a finished job, which stays finished if killed now
                await self.write_manifest(complete=True)
            else:
                self.done[shard.index] = shard_entry(shard.index, self.size, *counts,
                                                     shard.input_digest, self.store.fence)
                await self.write_manifest(complete=False)
                await asyncio.to_thread(self.store.put_file, shard.out_path, out_name)
            self.stats.shards_written += 1
