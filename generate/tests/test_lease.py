"""One writer per output and per shard (issue 44): a run and a --worker run never write one
output together, a refused run touches nothing, a late PUT of a run that lost its S3 lease is
never taken as committed, and a lease whose owner /proc hides (hidepid=2) is not taken over."""

from __future__ import annotations

import io
import json
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from sglang_fleet_generate import lease, results
from sglang_fleet_generate.errors import GenerateError
from sglang_fleet_generate.store import LocalStore, S3Store
from test_job import generate, lease_body, s3, s3_server
from tests.conftest import Sims, sims, write_input

__all__ = ["s3", "s3_server", "sims"]  # the fixtures, used by name


class Stall:
    """Holds a client's PUTs of one object in flight (as a process stopped mid-request) until
    ``go`` is set: a real request, sent late."""

    def __init__(self, client: Any, name: str) -> None:
        self.name, self.held, self.go = name, threading.Event(), threading.Event()
        client.meta.events.register("before-send.s3.PutObject", self.hold)

    def hold(self, request: Any, **_: Any) -> None:
        if request.url.endswith(self.name):
            self.held.set()
            self.go.wait(60)


def stalled_writer(s3_server: str, monkeypatch: pytest.MonkeyPatch, name: str,
                   write: Any) -> tuple[S3Store, Stall, threading.Thread]:
    """A run whose write of ``name`` (``write(store)``) is in flight when it stalls: no more
    renewals, and its lease expires (time to live 3 s)."""
    import boto3

    monkeypatch.setattr(lease, "LEASE_TTL_S", 3.0)
    client = boto3.client("s3", endpoint_url=s3_server)
    store = S3Store("s3://jobs/run/", client)
    stall = Stall(client, name)
    writer = threading.Thread(target=write, args=(store,))
    writer.start()
    assert stall.held.wait(30)
    store.lease.stop.set()
    time.sleep(4.5)  # past the lease's time to live
    return store, stall, writer


def uploads(s3: Any, prefix: str) -> list[str]:
    return [u["Key"] for u in
            s3.list_multipart_uploads(Bucket="jobs", Prefix=prefix).get("Uploads", [])]


@pytest.mark.parametrize("first, second", [(None, (0, 2)), ((1, 2), None), ((0, 2), (0, 3))])
def test_runs_of_two_layouts_never_write_one_s3_output(
        s3_server: str, s3: Any, first: tuple[int, int] | None,
        second: tuple[int, int] | None) -> None:
    """While one layout's run holds its lease, a run of another is refused and aborts none of
    its uploads (before: it took its own lease and aborted them all)."""
    holder = S3Store("s3://jobs/run/", s3, share=first)
    s3.create_multipart_upload(Bucket="jobs", Key="run/shard-000001.jsonl")  # in flight
    with pytest.raises(GenerateError, match=r"s3://jobs/run/: \.lease(-\d-of-\d)?: a run of "
                       r".* is writing here \(host .*\n    fix: wait for it or stop it"):
        S3Store("s3://jobs/run/", s3, share=second)
    assert uploads(s3, "run/") == ["run/shard-000001.jsonl"]
    keys = {o["Key"] for o in s3.list_objects_v2(Bucket="jobs", Prefix="run/")["Contents"]}
    assert keys == {f"run/{holder.lease.name}"}  # the refused run's lease was given back
    holder.close()


@pytest.mark.parametrize("first, second", [(None, (0, 2)), ((1, 2), None)])
def test_runs_of_two_layouts_never_write_one_local_output(
        tmp_path: Path, first: tuple[int, int] | None, second: tuple[int, int] | None) -> None:
    holder = LocalStore(tmp_path / "out", first)
    with pytest.raises(GenerateError, match=r"out: \.lock(-1-of-2)?: a run of .* is writing "
                       "here"):
        LocalStore(tmp_path / "out", second)
    holder.close()
    LocalStore(tmp_path / "out", second).close()  # once it is gone, the other layout may run


def test_a_run_refused_by_another_layouts_manifest_aborts_nothing(
        s3_server: str, s3: Any, tmp_path: Path) -> None:
    """Worker 0/2 was killed (its lease gone) with its job unfinished: a run without --worker
    is refused by its manifest before it aborts the worker's uploads or deletes its files."""
    s3.put_object(Bucket="jobs", Key="run/manifest-0-of-2.json", Body=json.dumps(
        {"shard_size": 10, "complete": False, "shards": [], "worker": [0, 2]}).encode())
    s3.put_object(Bucket="jobs", Key="run/failures-000002.jsonl", Body=b"{}\n")
    s3.create_multipart_upload(Bucket="jobs", Key="run/shard-000002.jsonl")
    inp = write_input(tmp_path / "in.jsonl", 30)
    with pytest.raises(GenerateError, match=r"manifest-0-of-2\.json: an unfinished job run "
                       r"as --worker K/2 writes here"):
        generate(str(inp), "s3://jobs/run/", "http://127.0.0.1:9", shard_size=10,
                 s3_endpoint=s3_server)
    assert uploads(s3, "run/") == ["run/shard-000002.jsonl"]
    keys = {o["Key"] for o in s3.list_objects_v2(Bucket="jobs", Prefix="run/")["Contents"]}
    assert keys == {"run/manifest-0-of-2.json", "run/failures-000002.jsonl"}


@pytest.mark.parametrize("name", ["shard-000000.jsonl", "failures-000000.jsonl"])
def test_a_late_put_of_a_run_that_lost_the_lease_is_not_committed(
        sims: Sims, s3_server: str, s3: Any, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """A run stalls with a PUT of shard 0's records (or failures) in flight; its lease
    expires, a second run does the job; then the stalled PUT lands over shard 0's file.
    `results` refuses that shard (before: it took the stale run's file as the job's, and
    --retry-failures would have sent lines that have a record again), and the next run
    redoes it."""
    def write(store: S3Store) -> None:
        part = store.spool / f"{name}.part"
        part.write_bytes(b'{"id": "r1", "content": "from the run that lost the lease"}\n')
        store.put_file(part, name)

    stale, stall, writer = stalled_writer(s3_server, monkeypatch, name, write)
    url = sims.start("--max-running-requests", "8")
    inp = tmp_path / "in.jsonl"
    good = write_input(tmp_path / "good.jsonl", 19).read_text().splitlines(keepends=True)
    inp.write_text("".join([good[0], '{"id": "bad"}\n', *good[1:]]))  # line 2 fails
    args = (str(inp), "s3://jobs/run/", url)
    summary = generate(*args, shard_size=10, s3_endpoint=s3_server)[0]
    assert summary["records"] == 19 and summary["failures"] == 1
    stall.go.set()
    writer.join(60)
    head = s3.head_object(Bucket="jobs", Key=f"run/{name}")
    assert head["Metadata"]["fence"] == stale.fence  # the late PUT landed
    with pytest.raises(GenerateError, match=rf"run/{name}: not the file "
                       r"manifest\.json lists: a run that had lost the output's lease wrote "
                       r"it late, so it is not committed"):
        results.show("s3://jobs/run/", s3_endpoint=s3_server, out=io.BytesIO())
    summary, stats = generate(*args, shard_size=10, s3_endpoint=s3_server)
    assert stats.shards_written == 1 and summary["records"] == 19
    view = io.BytesIO()
    assert results.show("s3://jobs/run/", s3_endpoint=s3_server, out=view) == 0
    ids = [json.loads(line)["id"] for line in view.getvalue().splitlines()]
    assert sorted(ids) == sorted(f"r{i}" for i in range(19))
    failed = io.BytesIO()
    results.show("s3://jobs/run/", failed=True, s3_endpoint=s3_server, out=failed)
    assert [json.loads(line)["line"] for line in failed.getvalue().splitlines()] == [2]


def test_a_late_manifest_put_does_not_replace_the_new_runs(
        s3_server: str, s3: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The manifest is replaced only if it is still the one a run read or wrote: the stale
    run's late manifest fails instead of undoing the new run's."""
    failed: list[BaseException] = []

    def write(store: S3Store) -> None:
        try:
            store.put_bytes(b'{"by": "stale, late"}', "manifest.json", fenced=True)
        except GenerateError as exc:
            failed.append(exc)

    _, stall, writer = stalled_writer(s3_server, monkeypatch, "manifest.json", write)
    new = S3Store("s3://jobs/run/", s3)
    new.put_bytes(b'{"by": "new"}', "manifest.json", fenced=True)
    stall.go.set()
    writer.join(60)
    assert "manifest.json was written by another run since this one read it" in \
        str(failed[0])
    assert new.get_bytes("manifest.json") == b'{"by": "new"}'
    new.close()


def test_a_lease_whose_owner_proc_hides_is_not_taken_over(
        s3: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With hidepid=2, another user's process has no /proc entry: a live owner must not be
    judged gone (before: taken over at once); one that exited still is."""
    monkeypatch.setattr(lease, "PROC", tmp_path)  # a /proc that shows no other process
    live = subprocess.Popen(["sleep", "60"])
    dead = subprocess.Popen(["true"])
    dead.wait()
    here = lease.Lease(s3, "jobs", "x/", "s3://jobs/x/").owner
    try:
        for prefix, pid in (("live/", live.pid), ("dead/", dead.pid)):
            s3.put_object(Bucket="jobs", Key=f"{prefix}.lease", Body=json.dumps(
                {**here, "owner": "other", "pid": pid, "started": "1", "ttl_s": 600}).encode())
        with pytest.raises(GenerateError, match=rf"another sglang-fleet generate is writing "
                           rf"here \(host .*, pid {live.pid};"):
            S3Store("s3://jobs/live/", s3)
        S3Store("s3://jobs/dead/", s3).close()
        assert lease_body(s3, "dead/.lease") is None
    finally:
        live.kill()
        live.wait()
