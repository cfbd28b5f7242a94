"""``sglang-fleet results OUTPUT``: one view of a generate job, the final record of each id as
JSONL on stdout: every records file committed, shards in order, then the ``--retry-failures``
rounds. ``--failed`` prints the lines still without a record instead (the last round's
failures, else every shard's: output_files.failure_names, the rule --retry-failures follows).

It only reads: no lock, no lease, nothing written, so it runs beside a writer (a file is on
the output only once committed whole). Records are streamed; memory holds 8 bytes per id
(output_files.id_key), which checks that no id has two records (they cannot by construction:
a second one means the output was changed by something else, and both files are named).

    code = show("s3://data/run-1/", failed=False, s3_endpoint=None)
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO, Any

import orjson

from sglang_fleet_generate.errors import GenerateError
from sglang_fleet_generate.output_files import (
    FENCE_KEY,
    MANIFEST,
    entry_files,
    failure_names,
    failures_name,
    id_key,
    manifest_share,
    retry_failures_name,
    retry_name,
    shard_index,
    shard_name,
)
from sglang_fleet_generate.store import Reader, open_reader, owned

Entries = dict[int, dict[str, Any]]


@dataclass
class Committed:
    """What a job has committed: its records files in order, the failures files of the lines
    still without a record, and whether the manifest says the job is finished."""

    complete: bool
    records: list[str]
    failures: list[str]


def committed(reader: Reader) -> Committed:
    """The output's committed files, from its manifests (one run's, or each --worker K/N's)
    and the files on it: a manifest entry whose file is missing was being committed when a
    run stopped (an error on a finished job), and a retry round committed just before a kill
    is not listed yet (ledger.Ledger.load_rounds). A job of N workers is complete once all N are."""
    names = listing(reader)
    shards: Entries = {}
    rounds_named: list[str] = []
    failures: list[str] = []
    complete = True
    manifests = read_manifests(reader, names)
    for share, (name, manifest) in manifests.items():
        own = _listed(reader, manifest, name, "shards", "shard-", names, None)
        rounds = _listed(reader, manifest, name, "retries", "retry-", names, share)
        for file in names:  # on the output, not (yet) in the manifest
            index = shard_index(file, "shard-")
            if index is not None and index not in own and index not in shards and \
                    owned(file, share):
                own[index] = {"failures": int(failures_name(index) in names)}
            round_ = shard_index(file, "retry-", share)
            if round_ is not None and round_ not in rounds:
                rounds[round_] = {"failures": int(retry_failures_name(round_, share) in names)}
        failures += failure_names({i: e for i, e in own.items() if i not in shards}, rounds,
                                  share)
        shards.update({i: e for i, e in own.items() if i not in shards})
        rounds_named += [retry_name(r, share) for r in sorted(rounds)]
        complete = complete and bool(manifest.get("complete"))
    workers = {share for share in manifests if share is not None}
    if workers and None not in manifests:
        count = next(iter(workers))[1]
        complete = complete and {k for k, _ in workers} == set(range(count))
    return Committed(complete, [shard_name(i) for i in sorted(shards)] + rounds_named,
                     failures)


def read_manifests(reader: Reader, names: set[str] | None = None) -> \
        dict[tuple[int, int] | None, tuple[str, dict[str, Any]]]:
    """Every manifest on the output (``manifest.json``, ``manifest-K-of-N.json``), by share."""
    names = listing(reader) if names is None else names
    found = {}
    for name in sorted(names):
        share = manifest_share(name)
        if share is not False:
            found[share] = (name, read_manifest(reader, name))
    if not found:
        where = f"{reader.location.rstrip('/')}/{MANIFEST}"
        raise GenerateError(f"{where}: not found: {reader.location} is not the output of a "
                            "sglang-fleet generate run (or its run has not committed a shard "
                            "yet); give the OUTPUT the generate command wrote to")
    return found


def listing(reader: Reader) -> set[str]:
    """The output's file names; none for a path that is missing or a file (said as such)."""
    try:
        return reader.names()
    except (NotADirectoryError, FileNotFoundError):  # a file given as OUTPUT (the input, say)
        return set()


def read_manifest(reader: Reader, name: str = MANIFEST) -> dict[str, Any]:
    where = f"{reader.location.rstrip('/')}/{name}"
    try:
        raw = reader.get_bytes(name)
    except NotADirectoryError:  # a file given as OUTPUT (the input, say)
        raw = None
    if raw is None:
        raise GenerateError(f"{where}: not found: {reader.location} is not the output of a "
                            "sglang-fleet generate run (or its run has not committed a shard "
                            "yet); give the OUTPUT the generate command wrote to")
    try:
        manifest = json.loads(raw)
        entries = [*manifest["shards"], *manifest.get("retries", [])]
        if not all(isinstance(e["name"], str) and isinstance(e["failures"], int)
                   for e in entries):
            raise TypeError
    except (ValueError, KeyError, TypeError):
        raise GenerateError(f"{where}: not a manifest sglang-fleet generate writes (no list of "
                            "shards, each with its name and failures); give the OUTPUT the "
                            "generate command wrote to") from None
    return dict(manifest)


def _listed(reader: Reader, manifest: dict[str, Any], manifest_file: str, key: str,
            prefix: str, names: set[str], share: tuple[int, int] | None) -> Entries:
    """The manifest's entries under ``key`` whose file is on the output, by index (round)."""
    found: Entries = {}
    for entry in manifest.get(key, []):
        index = shard_index(entry["name"], prefix, share)
        if entry["name"] in names and index is not None:
            if key == "shards":
                check_fence(reader, entry, manifest_file)
            found[index] = entry
        elif manifest.get("complete") or key == "retries":  # a round is listed once written
            raise GenerateError(f"{reader.location.rstrip('/')}/{manifest_file} lists "
                                f"{entry['name']}, which is not on the output; run the "
                                "generate command again: it redoes a missing shard")
    return found


def check_fence(reader: Reader, entry: dict[str, Any], manifest_file: str) -> None:
    """A shard whose file carries another fencing token than its entry was replaced by a late
    write of a run that had lost the output's lease: not committed (lease.py)."""
    for name in entry_files(entry) if FENCE_KEY in entry else []:
        if reader.fence_of(name) != entry[FENCE_KEY]:
            raise GenerateError(f"{reader.location.rstrip('/')}/{name}: not the file "
                                f"{manifest_file} lists: a run that had lost the output's "
                                "lease wrote it late, so it is not committed; run the "
                                "generate command again: it redoes that shard")


def show(output: str, failed: bool = False, s3_endpoint: str | None = None,
         out: IO[bytes] | None = None) -> int:
    """Print the records (or, ``failed``, the failed lines); 0, or 1 when the job is not
    complete yet (what it has committed is printed)."""
    refused: tuple[type[Exception], ...] = ()
    s3 = None
    if output.startswith("s3://"):
        import boto3
        from botocore.exceptions import BotoCoreError, ClientError

        s3, refused = boto3.client("s3", endpoint_url=s3_endpoint), (BotoCoreError, ClientError)
    out = out or sys.stdout.buffer
    try:
        reader = open_reader(output, s3)
        job = committed(reader)
        if failed:
            copy_lines(reader, job.failures, out)
        else:
            copy_records(reader, job.records, out)
        out.flush()
    except BrokenPipeError:  # the reader went away (| head): main's to handle
        raise
    except OSError as exc:  # a file of the output (named), else the standard output
        raise GenerateError(f"{exc.filename or 'standard output'}: {exc.strerror}") from None
    except refused as exc:  # S3 said no (access denied, no such key): its code is in the text
        raise GenerateError(f"{output}: cannot read the output: {exc}") from None
    if not job.complete:
        print(f"error: {output}: the job is not complete (its manifest says so): the "
              f"{'failed lines' if failed else 'records'} committed so far were printed; run "
              "its sglang-fleet generate command again to finish it", file=sys.stderr)
        return 1
    return 0


def lines_of(reader: Reader, name: str) -> Iterator[bytes]:
    """A file's lines, streamed, each ending with a newline."""
    with reader.open(name) as stream:
        for raw in stream:
            yield raw if raw.endswith(b"\n") else raw + b"\n"


def copy_lines(reader: Reader, names: list[str], out: IO[bytes]) -> None:
    for name in names:
        for raw in lines_of(reader, name):
            out.write(raw)


def copy_records(reader: Reader, names: list[str], out: IO[bytes]) -> None:
    """Each records file's lines, checking on the way that no id comes twice."""
    seen: set[int] = set()
    for index, name in enumerate(names):
        for lineno, raw in enumerate(lines_of(reader, name), 1):
            ident = record_id(reader, name, lineno, raw)
            key = id_key(ident)
            if key in seen:
                first = holder(reader, names[:index + 1], ident, (name, lineno))
                if first is not None:  # else two ids share 8 bytes of digest: both kept
                    raise GenerateError(
                        f"{reader.location.rstrip('/')}: id {ident!r} has a record in {first} "
                        f"and in {name} (line {lineno}); one job writes an id once, so these "
                        "files were changed or copied in by something else: keep the one you "
                        "trust, or run the job again into a new output")
            seen.add(key)
            out.write(raw)


def record_id(reader: Reader, name: str, lineno: int, raw: bytes) -> str:
    try:
        ident = orjson.loads(raw)["id"]
    except (ValueError, KeyError, TypeError):
        ident = None
    if not isinstance(ident, str):
        raise GenerateError(f"{reader.location.rstrip('/')}/{name} line {lineno}: not a "
                            "record (JSON with a string id); the file was changed by "
                            "something else: run the job again into a new output")
    return ident


def holder(reader: Reader, names: list[str], ident: str, upto: tuple[str, int]) -> str | None:
    """The first file (before line ``upto``) with a record of ``ident``: read again, only
    when its 8-byte digest was seen before."""
    for name in names:
        for lineno, raw in enumerate(lines_of(reader, name), 1):
            if (name, lineno) == upto:
                return None
            if orjson.loads(raw).get("id") == ident:
                return f"{name} (line {lineno})"
    return None
