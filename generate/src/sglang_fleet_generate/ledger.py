"""What a job's output holds, read and written: the manifests (this run's, and other workers'
for the layout), the finished shards and retry rounds, the manifest rewritten before each
commit, and the failures gathered at the end. The files themselves: job.py's docstring.

    ledger.load_state()           # at the start: what is done, what failed, what to skip
    await ledger.write_manifest(complete=False)   # before each shard's commit
    lines = await ledger.failed_lines()           # --retry-failures: {41, 977}
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import orjson

from sglang_fleet_generate import batchformat
from sglang_fleet_generate.errors import GenerateError
from sglang_fleet_generate.job_state import JobState
from sglang_fleet_generate.lease import layout
from sglang_fleet_generate.output_files import (
    FENCE_KEY,
    entry_files,
    failure_names,
    failures_name,
    gathered_failures_name,
    manifest_name,
    manifest_share,
    retry_failures_name,
    round_entry,
    shard_entry,
    shard_index,
    shard_name,
)


class Ledger(JobState):
    """The output's record of the job: ``done`` (finished shards' entries by index),
    ``rounds`` (retry rounds' entries), and ``manifest`` as last written."""

    def load_state(self) -> None:
        """Read the manifests (this run's, and other workers' for the layout), add this run's
        shards committed after its manifest's last write, list its stray files for tidy().
        Nothing is written here: a refusal leaves the output as it was."""
        names = self.store.names()
        manifests = self.read_manifests(names)
        self.manifest = manifests.get(self.share, {})
        self.fingerprints = dict(self.manifest.get("fingerprints") or {})
        finished = {int(e["first_line"] - 1) // self.size: e for m in manifests.values()
                    for e in m.get("shards", []) if e["name"] in names}
        stale = self.written_late(finished)
        self.done = {i: e for i, e in finished.items() if self.mine(i) and i not in stale}
        self.others = {i: e for i, e in finished.items() if not self.mine(i)}
        self.strays = [shard_name(i) for i in sorted(stale)]
        for name in names:
            index = shard_index(name, "shard-")
            if index is not None and index not in finished and self.mine(index):
                self.done[index] = self._rebuild(index, names)
        for name in names:
            index = shard_index(name, "failures-")
            if index is not None and index not in self.done and self.mine(index):
                self.strays.append(name)
        self.load_rounds(names)
        self.unverified = set(self.done) | set(self.others)
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
                self.rounds[round_] = round_entry(round_, data.count(b"\n"),
                                                  fails.count(b"\n"),
                                                  hashlib.sha256(data).hexdigest(), len(data),
                                                  self.share)
        for name in names:
            round_ = shard_index(name, "retry-failures-", self.share)
            if round_ is not None and round_ not in self.rounds:
                self.strays.append(name)

    def written_late(self, finished: dict[int, dict[str, Any]]) -> set[int]:
        """This run's finished shards whose file carries another fencing token than its entry:
        a late PUT of a run that had lost the lease replaced it, so it is not committed (it
        is deleted by tidy() and redone)."""
        files = [(i, e[FENCE_KEY], name) for i, e in finished.items()
                 if self.mine(i) and FENCE_KEY in e for name in entry_files(e)]
        with ThreadPoolExecutor(16) as pool:  # one HEAD each: in parallel
            marks = pool.map(self.store.fence_of, [name for _, _, name in files])
            return {i for (i, fence, _), mark in zip(files, marks, strict=True)
                    if mark != fence}

    def tidy(self) -> None:
        """Once the run is past every refusal: delete what a killed run left (failures files
        without their shard, shards written late) and abort its uploads (S3)."""
        for name in self.strays:
            self.store.delete(name)
        self.store.tidy()

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
        return shard_entry(index, self.size, data.count(b"\n"), (fails or b"").count(b"\n"),
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
        await asyncio.to_thread(self.store.put_bytes, data, manifest_name(self.share), True)

    # ---- the lines still without a record --------------------------------------------------
    async def failed_lines(self) -> set[int]:
        """Line numbers (from 0) of the lines still without a record, what --retry-failures
        sends again: the last round's failures, else every shard's. Example: {41, 977} after
        two lines failed."""
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
