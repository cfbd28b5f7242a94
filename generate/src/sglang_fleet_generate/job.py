"""The job: stream the input, send each line through the fleet, spool answers per shard, and
commit each shard once all its lines are answered or failed.

On-disk state (the output location holds all of it, so the same command resumes):

- ``shard-NNNNNN.jsonl``: the answers for input lines ``[N*S, (N+1)*S)``; its existence is the
  commit, and a finished shard is never redone nor rewritten (``S`` is ``--shard-size``).
- ``failures-NNNNNN.jsonl``: that shard's failed lines, committed just before the shard (a
  failures file without its shard is from a killed run and is deleted at the next start).
- ``manifest.json``: the job (shard size) and each shard's counts, sha256, input digest
  (identity.py: the job is its input's content, not its path) and, on S3, fencing token
  (lease.py: the run that wrote it, which its files carry), rewritten just before each
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

On a resumed job each finished shard's input digest is compared as its lines are read (a
--worker run compares the other workers' finished shards too): a changed shard stops the run
(or, with --redo-changed, its own is discarded and redone). Until every
finished shard has been compared, no new shard is committed, so a refused run writes nothing.

The job is one object built in layers, one module each (job_state.py lists them): this module
runs it (``Job.run``) and is the command (``run``).

    code = run(Options("in.jsonl", "out/", "http://127.0.0.1:30000"))
"""

from __future__ import annotations

import asyncio
import json
import ssl
from collections.abc import Coroutine, Sequence
from typing import Any, TypeVar

from sglang_fleet_generate import batchformat, text
from sglang_fleet_generate.batchformat import Input
from sglang_fleet_generate.commands import results_command, retry_command
from sglang_fleet_generate.errors import GenerateError
from sglang_fleet_generate.fleet_watch import FleetWatch
from sglang_fleet_generate.http_pool import Pool, tls_context
from sglang_fleet_generate.input_pass import InputPass
from sglang_fleet_generate.interrupt import guard
from sglang_fleet_generate.job_state import Options
from sglang_fleet_generate.outage import Breaker
from sglang_fleet_generate.progress import Stats, final_table
from sglang_fleet_generate.source import input_size, read_batches
from sglang_fleet_generate.store import Store, open_store

T = TypeVar("T")


class Job(InputPass, FleetWatch):
    """One run of a job (see the module docstring for the state it keeps on the output)."""

    def __init__(self, opts: Options, store: Store, s3: Any, source: Input,
                 tls: ssl.SSLContext | None = None) -> None:
        super().__init__(opts, store, s3, source, tls)
        self.breaker = Breaker(self.health, self.paused, self.resumed)

    async def ticker(self) -> None:
        interval = 5.0 if self.opts.json_status else 0.5
        while True:
            await asyncio.sleep(interval)
            self.display.tick()

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
            await asyncio.to_thread(self.tidy)  # past every refusal before the input's
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
    wrong = text.url_problem(opts.url, allow_http=True)
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
