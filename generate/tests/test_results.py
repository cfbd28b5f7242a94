"""The end of a generate run and what follows it, against real simulator processes (and moto's
S3 server): ``sglang-fleet results`` (each id once across shards and retry rounds, the failed
lines, read-only beside a writer), the retry command a run prints, its --json events, and
SIGTERM stopping a run as Ctrl-C does."""

from __future__ import annotations

import hashlib
import io
import json
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import test_job as test_generate
from sglang_fleet_generate.results import show
from sglang_fleet_generate.store import open_store
from test_job import FaultyProxy, check_manifest, cli, records
from tests.conftest import Sims, write_input

# test_job's fixtures: simulator processes, moto's S3 server and a client of it
sims, s3_server, s3 = test_generate.sims, test_generate.s3_server, test_generate.s3


def results(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sglang_fleet.cli", "results", *args],
                          capture_output=True, text=True, timeout=60)


def as_cli(command: str) -> list[str]:
    """A printed ``sglang-fleet ...`` command, run with this interpreter."""
    argv = shlex.split(command)
    assert argv[0] == "sglang-fleet", command
    return [sys.executable, "-m", "sglang_fleet.cli", *argv[1:]]


def events(stdout: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stdout.splitlines()]


def snapshot(out: Path) -> dict[str, bytes]:
    return {str(p.relative_to(out)): p.read_bytes() for p in out.rglob("*") if p.is_file()}


def test_a_run_with_failures_prints_the_retry_and_results_show_each_id_once(
        sims: Sims, tmp_path: Path) -> None:
    """Three failed lines: the run names the failures file and the retry command (the one
    given, --redo-changed dropped, --retry-failures added), which works as printed; results
    then print each id once from the shards and the round, --failed the lines still failed."""
    url = sims.start("--max-running-requests", "8")
    proxy = FaultyProxy(url, every_503=10**9, every_drop=10**9, always="always-503")
    bad = ['{"id": "r1", "messages": [{"role": "user", "content": "again"}]}',  # repeated id
           'not json', '{"id": "stuck", "messages": [{"role": "user", "content": "always-503"}]}']
    inp = write_input(tmp_path / "in.jsonl", 6, extra=bad)
    out = tmp_path / "out dir"  # a space: the printed commands are quoted
    try:
        first = subprocess.run(cli(str(inp), str(out), "--url", proxy.url, "--retries", "1",
                                   "--shard-size", "4", "--redo-changed"),
                               capture_output=True, text=True, timeout=120)
        assert first.returncode == 103, first.stderr
        retry = shlex.join(["sglang-fleet", "generate", str(inp), str(out), "--url", proxy.url,
                            "--retries", "1", "--shard-size", "4", "--retry-failures"])
        assert f"3 lines failed (listed in {out}/failures.jsonl); to send them again:\n" \
               f"  {retry}\n" in first.stdout, first.stdout
        assert f"every record in one view: sglang-fleet results '{out}'" in first.stdout
        assert re.search(r"^time paused +0:00:00$", first.stdout, re.M), first.stdout
        failed = results(str(out), "--failed")
        assert failed.returncode == 0, failed.stderr
        assert failed.stdout == (out / "failures.jsonl").read_text()
        assert sorted(f["id"] for f in map(json.loads, failed.stdout.splitlines())) == \
            ["line-8", "r1", "stuck"]
        proxy.always = b"no longer"  # the outage is over: the printed command retries
        again = subprocess.run([*as_cli(retry), "--json"], capture_output=True, text=True,
                               timeout=120)
    finally:
        proxy.close()
    assert again.returncode == 102, again.stderr
    seen = events(again.stdout)
    assert [e["event"] for e in seen][-1] == "done"
    started = next(e for e in seen if e["event"] == "started")
    assert (started["input"], started["output"], started["url"], started["concurrency"]) == \
        (str(inp), str(out), proxy.url, 8)
    assert [(e["round"], e["lines"]) for e in seen if e["event"] == "retrying"] == [(1, 3)]
    done = seen[-1]
    assert done["retry_command"] == shlex.join([*shlex.split(retry), "--json"])
    assert done["results_command"] == f"sglang-fleet results '{out}'"
    assert done["paused"] is False and done["paused_s"] == 0.0

    shown = results(str(out))
    assert shown.returncode == 0, shown.stderr
    ids = [r["id"] for r in map(json.loads, shown.stdout.splitlines())]
    assert ids[-1] == "stuck" and sorted(ids) == sorted([f"r{i}" for i in range(6)] + ["stuck"])
    expected = "".join(p.read_text() for p in sorted(out.glob("shard-*.jsonl")))
    assert shown.stdout == expected + (out / "retry-001.jsonl").read_text()
    failed = results(str(out), "--failed")
    assert failed.stdout == (out / "retry-failures-001.jsonl").read_text()
    assert sorted(f["id"] for f in map(json.loads, failed.stdout.splitlines())) == \
        ["line-8", "r1"]
    # a round committed just before a kill, before its manifest entry: still in the view
    manifest = json.loads((out / "manifest.json").read_text())
    del manifest["retries"]
    (out / "manifest.json").write_text(json.dumps(manifest))
    assert results(str(out)).stdout == shown.stdout
    assert results(str(out), "--failed").stdout == failed.stdout


def test_results_read_only_beside_a_writer_and_refuse_a_repeated_id(
        sims: Sims, tmp_path: Path) -> None:
    """Results take no lock: they read an output whose writer holds it and leave it as it was;
    an id with two records (a file copied in by hand) stops them, naming both files."""
    url = sims.start("--max-running-requests", "8")
    inp = write_input(tmp_path / "in.jsonl", 25)
    out = tmp_path / "out"
    assert subprocess.run(cli(str(inp), str(out), "--url", url, "--shard-size", "10"),
                          capture_output=True, timeout=120).returncode == 0
    before = snapshot(out)
    writer = open_store(str(out), None)  # holds OUTPUT/.lock, as a run does
    try:
        shown = results(str(out))
        refused = subprocess.run(cli(str(inp), str(out), "--url", url, "--shard-size", "10"),
                                 capture_output=True, text=True, timeout=60)
    finally:
        writer.close()
    assert "another sglang-fleet generate is writing here" in refused.stderr  # the lock held
    assert shown.returncode == 0, shown.stderr
    assert sorted(r["id"] for r in map(json.loads, shown.stdout.splitlines())) == \
        sorted(f"r{i}" for i in range(25))
    assert snapshot(out) == before
    first = (out / "shard-000000.jsonl").read_text().splitlines(keepends=True)
    (out / "shard-000007.jsonl").write_text(first[3])  # another job's file, or a hand edit
    twice = results(str(out))
    assert twice.returncode == 1
    dup = json.loads(first[3])["id"]
    assert f"error: {out}: id {dup!r} has a record in shard-000000.jsonl (line 4) and in " \
           "shard-000007.jsonl (line 1)" in twice.stderr, twice.stderr
    assert "Traceback" not in twice.stderr


def test_results_of_an_unfinished_or_missing_job_say_so(
        sims: Sims, tmp_path: Path) -> None:
    url = sims.start("--max-running-requests", "8")
    inp = write_input(tmp_path / "in.jsonl", 30)
    out = tmp_path / "out"
    assert subprocess.run(cli(str(inp), str(out), "--url", url, "--shard-size", "10"),
                          capture_output=True, timeout=120).returncode == 0
    (out / "shard-000001.jsonl").unlink()  # as if killed while committing shard 1
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["complete"] = False
    (out / "manifest.json").write_text(json.dumps(manifest))
    partial = results(str(out))
    assert partial.returncode == 1
    assert sorted(r["id"] for r in map(json.loads, partial.stdout.splitlines())) == \
        sorted(f"r{i}" for i in range(30) if not 10 <= i < 20)
    assert f"error: {out}: the job is not complete" in partial.stderr
    assert "run its sglang-fleet generate command again to finish it" in partial.stderr
    manifest["complete"] = True  # a finished job missing a shard: changed by hand
    (out / "manifest.json").write_text(json.dumps(manifest))
    broken = results(str(out))
    assert broken.returncode == 1 and broken.stdout == ""
    assert f"{out}/manifest.json lists shard-000001.jsonl, which is not on the output" \
        in broken.stderr, broken.stderr
    for where in (tmp_path / "elsewhere", inp.parent, inp):  # none, no manifest, a file
        missing = results(str(where))
        assert missing.returncode == 1 and missing.stdout == ""
        assert missing.stderr.startswith(f"error: {where}/manifest.json: not found: {where} is"
                                         " not the output of a sglang-fleet generate run")
        assert "give the OUTPUT the generate command wrote to" in missing.stderr
    assert not (tmp_path / "elsewhere").exists()  # read only: not even the directory made
    (out / "manifest.json").write_text("{}")
    bad = results(str(out))
    assert bad.returncode == 1 and "manifest.json: not a manifest sglang-fleet generate " \
        "writes" in bad.stderr, bad.stderr


def test_results_of_an_s3_output_take_no_lease(
        sims: Sims, tmp_path: Path, s3_server: str, s3: Any) -> None:
    inp = write_input(tmp_path / "in.jsonl", 250)
    url = sims.start("--max-running-requests", "16")
    done = subprocess.run(cli(str(inp), "s3://jobs/run-1/", "--url", url, "--shard-size", "100",
                              "--s3-endpoint", s3_server), capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert f"every record in one view: sglang-fleet results s3://jobs/run-1/ --s3-endpoint " \
           f"{s3_server}" in done.stdout
    objects = {o["Key"]: o["ETag"] for o in s3.list_objects_v2(Bucket="jobs")["Contents"]}
    s3.put_object(Bucket="jobs", Key="run-1/.lease", Body=b"{}")  # a writer's, held
    buffer = io.BytesIO()
    assert show("s3://jobs/run-1/", s3_endpoint=s3_server, out=buffer) == 0
    lines = buffer.getvalue().splitlines()
    assert sorted(json.loads(line)["id"] for line in lines) == sorted(f"r{i}" for i in range(250))
    manifest = json.loads(s3.get_object(Bucket="jobs", Key="run-1/manifest.json")["Body"].read())
    assert [hashlib.sha256(b"".join(line + b"\n" for line in lines[i * 100:(i + 1) * 100]))
            .hexdigest() for i in range(3)] == [e["sha256"] for e in manifest["shards"]]
    after = {o["Key"]: o["ETag"] for o in s3.list_objects_v2(Bucket="jobs")["Contents"]}
    assert after == {**objects, "run-1/.lease": after["run-1/.lease"]}
    assert s3.get_object(Bucket="jobs", Key="run-1/.lease")["Body"].read() == b"{}"
    missing = results("s3://jobs/run-2/", "--s3-endpoint", s3_server)
    assert missing.returncode == 1
    assert missing.stderr.startswith("error: s3://jobs/run-2/manifest.json: not found")
    denied = results("s3://no-such-bucket/run-1/", "--s3-endpoint", s3_server)
    assert denied.returncode == 1 and "cannot use bucket 'no-such-bucket'" in denied.stderr
    assert "Traceback" not in denied.stderr


@pytest.mark.parametrize("sig, ignore_int", [(signal.SIGTERM, True), (signal.SIGINT, False)])
def test_sigterm_stops_a_run_as_ctrl_c_does_and_the_rerun_finishes(
        sims: Sims, tmp_path: Path, sig: signal.Signals, ignore_int: bool) -> None:
    """A signal mid-job: the run unwinds (spool removed, the lock given back, every shard on
    the output whole and in the manifest), names the signal and the command to resume, exits
    128 + the signal; that command finishes the job, each id once, no shard redone. SIGTERM
    works with SIGINT ignored (a job in the background of a script)."""
    n = 1000
    url = sims.start("--max-running-requests", "16", decode="60")
    inp = write_input(tmp_path / "in.jsonl", n)
    out = tmp_path / "out"
    argv = cli(str(inp), str(out), "--url", url, "--shard-size", "50", "--json")
    shell = "trap '' INT; exec \"$@\"" if ignore_int else 'exec "$@"'
    proc = subprocess.Popen(["sh", "-c", shell, "sh", *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while len(list(out.glob("shard-*.jsonl"))) < 3:
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "no shard written in 120 s"
        time.sleep(0.05)
    proc.send_signal(sig)
    stdout, stderr = proc.communicate(timeout=60)
    resume = shlex.join(["sglang-fleet", *argv[3:]])
    assert proc.returncode == 128 + sig.value, stderr
    assert f"interrupted ({sig.name}): run the same command again to resume:\n  {resume}\n" \
        in stderr, stderr
    assert "Traceback" not in stderr
    assert events(stdout)[-1] == {"event": "interrupted", "signal": sig.name,
                                  "resume_command": resume}
    assert not (out / ".spool").exists(), "the run did not unwind (kill -9 leaves its spool)"
    manifest = json.loads((out / "manifest.json").read_text())
    listed = {e["name"]: e["sha256"] for e in manifest["shards"]}
    shards = {p.name: p for p in out.glob("shard-*.jsonl")}
    assert 3 <= len(shards) < n // 50 and manifest["complete"] is False
    for name, path in shards.items():
        assert hashlib.sha256(path.read_bytes()).hexdigest() == listed[name], name
    before = {name: p.stat().st_mtime_ns for name, p in shards.items()}
    rerun = subprocess.run(as_cli(resume), capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr
    ids = [r["id"] for r in records(out)]
    assert len(ids) == n and set(ids) == {f"r{i}" for i in range(n)}
    check_manifest(out, n)
    assert all(out.joinpath(name).stat().st_mtime_ns == t for name, t in before.items())
