"""What ``sglang-fleet generate`` was asked (``Options``) and what one run of a job holds in
memory (``JobState``, with the ``Shard`` files being filled), declared in one place.

A job is one object, ``job.Job``, built in layers over this state, one module each:

- ``ledger.Ledger``: what the output holds (manifests, finished shards, retry rounds);
- ``commits.Commits``: the shards being filled, and their commit once every line is in;
- ``input_pass.InputPass``: one pass over the input, each line sent, skipped or compared;
- ``fleet_watch.FleetWatch``: the fleet's size, health and fingerprint while the job runs;
- ``job.Job``: the run itself, which starts and ends all of the above.

The layers share this state rather than passing it around: a line's answer touches the shard's
spool file, the counters, the commit path and the fleet's fingerprint at once.

    state = JobState(Options("in.jsonl", "out/", "http://127.0.0.1:30000"), store, None, source)
    state.size  # 1000, the --shard-size
"""

from __future__ import annotations

import asyncio
import hashlib
import ssl
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from sglang_fleet_generate import batchformat, fingerprint
from sglang_fleet_generate.batchformat import Input
from sglang_fleet_generate.completion import Limiter
from sglang_fleet_generate.errors import GenerateError
from sglang_fleet_generate.http_pool import Pool
from sglang_fleet_generate.outage import Breaker
from sglang_fleet_generate.output_files import (
    failures_name,
    retry_failures_name,
    retry_name,
    shard_name,
)
from sglang_fleet_generate.progress import Display, Stats
from sglang_fleet_generate.store import Store


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


class JobState:
    """Every field one run of a job keeps (see the module docstring for who uses which)."""

    breaker: Breaker  # set by job.Job: its probe and callbacks are FleetWatch's

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
        self.others: dict[int, dict[str, Any]] = {}  # other workers' finished shards, compared
        self.strays: list[str] = []  # a killed run's files, deleted once past every refusal
        self.rounds: dict[int, dict[str, Any]] = {}  # --retry-failures rounds committed
        self.open: dict[int, Shard] = {}
        self.seen: set[int] = set()
        self.stats = Stats()
        self.display = Display(self.stats, opts.json_status)
        self.limiter = Limiter(opts.concurrency)
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
