"""Several workers on one job (``--worker K/N``), and the fingerprint of what answered, against
real simulator servers: three workers with one killed -9 and run again write each id once; a
resume against a fleet of another release is refused unless --allow-mixed."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from test_job import cli, run_cli
from tests.conftest import ROOT, Sims, sims, write_input

__all__ = ["sims"]  # the fixture, used by name
N = 900
SHARD = 50  # 18 shards, 6 for each of three workers


def results(out: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sglang_fleet.cli", "results", str(out),
                           *flags], cwd=ROOT, capture_output=True, text=True, timeout=120)


def wait_for(path: Path, pattern: str, proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 120
    while not list(path.glob(pattern)):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)


def test_three_workers_one_killed_then_rerun_write_each_id_once(sims: Sims,
                                                                 tmp_path: Path) -> None:
    url = sims.start("--max-running-requests", "16", decode="300")  # ~30 ms a request
    inp = write_input(tmp_path / "in.jsonl", N, max_tokens=10)
    out = tmp_path / "out"

    def worker(k: int, n: int = 3) -> list[str]:
        return cli(str(inp), str(out), "--url", url, "--shard-size", str(SHARD),
                   "--worker", f"{k}/{n}", "--json")

    procs = [subprocess.Popen(worker(k), cwd=ROOT, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for k in range(3)]
    deadline = time.monotonic() + 120
    while not any(int(s.name[6:12]) % 3 == 1 for s in out.glob("shard-*.jsonl")):
        assert procs[1].poll() is None and time.monotonic() < deadline, procs[1].communicate()
        time.sleep(0.05)  # until worker 1 has committed a shard
    procs[1].send_signal(signal.SIGKILL)
    procs[1].wait()
    for k in (0, 2):
        _, err = procs[k].communicate(timeout=300)
        assert procs[k].returncode == 0, err[-3000:]
    killed = json.loads((out / "manifest-1-of-3.json").read_text())
    # the manifest is written just before its shard: a kill between the two leaves it listed
    committed = [e for e in killed["shards"] if (out / e["name"]).exists()]
    assert killed["complete"] is False and committed
    assert results(out).returncode == 1  # worker 1 has not finished: the job is not complete

    other = subprocess.run(worker(1, 2), cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert other.returncode == 1
    assert "manifest-1-of-3.json: an unfinished job run as --worker K/3 writes here" in \
        other.stderr, other.stderr

    rerun = subprocess.run(worker(1), cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    done = json.loads(rerun.stdout.splitlines()[-1])
    assert done["skipped"] == SHARD * len(committed) and done["failures"] == 0
    for k in range(3):
        manifest = json.loads((out / f"manifest-{k}-of-3.json").read_text())
        assert manifest["complete"] and manifest["worker"] == [k, 3]
        assert {e["name"] for e in manifest["shards"]} == \
            {f"shard-{i:06d}.jsonl" for i in range(k, N // SHARD, 3)}
    view = results(out)
    assert view.returncode == 0, view.stderr
    ids = [json.loads(line)["id"] for line in view.stdout.splitlines()]
    assert len(ids) == N and set(ids) == {f"r{i}" for i in range(N)}


def test_a_resume_against_another_release_is_refused_unless_mixed_is_allowed(
        sims: Sims, tmp_path: Path) -> None:
    first = sims.start("--max-running-requests", "8", decode="300", release="0.5.23")
    inp = write_input(tmp_path / "in.jsonl", 400, max_tokens=10)
    out = tmp_path / "out"
    job = subprocess.Popen(cli(str(inp), str(out), "--url", first, "--shard-size", "40"),
                           cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for(out, "shard-*.jsonl", job)
    job.send_signal(signal.SIGKILL)
    job.wait()
    other = sims.start("--max-running-requests", "8", release="0.5.22")
    before = {p.name: p.stat().st_mtime_ns for p in out.glob("*.json*")}
    refused = subprocess.run(cli(str(inp), str(out), "--url", other, "--shard-size", "40"),
                             cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 1, refused.stderr
    assert "SGLang 0.5.23" in refused.stderr and "answers with" in refused.stderr
    assert "version '0.5.23' -> '0.5.22'" in refused.stderr and "--allow-mixed" in refused.stderr
    assert {p.name: p.stat().st_mtime_ns for p in out.glob("*.json*")} == before  # unwritten

    mixed = subprocess.run(cli(str(inp), str(out), "--url", other, "--shard-size", "40",
                               "--allow-mixed"), cwd=ROOT, capture_output=True, text=True,
                           timeout=300)
    assert mixed.returncode == 0, mixed.stderr[-3000:]
    manifest = json.loads((out / "manifest.json").read_text())
    versions = {d: f["version"] for d, f in manifest["fingerprints"].items()}
    assert sorted(versions.values()) == ["0.5.22", "0.5.23"]
    rows = [json.loads(line) for line in results(out).stdout.splitlines()]
    assert len(rows) == 400 and {r["fingerprint"] for r in rows} == set(versions)


def files(out: Path) -> dict[str, bytes]:
    """The output's files, but for the runs' lock files (taking a lock creates its file)."""
    return {p.name: p.read_bytes() for p in out.iterdir()
            if p.is_file() and not p.name.startswith(".lock")}


def test_a_worker_on_an_edited_input_is_refused_for_another_workers_shards(
        sims: Sims, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Worker 1/2 finishes on the input; a line is inserted at the top; worker 0/2 then runs:
    refused, naming worker 1's shard, writing nothing (before: it compared only its own
    shards, so 2 lines had no record, 2 ids two, and every worker exited 0). With
    --redo-changed each worker redoes its own changed shards: each id once."""
    url = sims.start("--max-running-requests", "8")
    inp = write_input(tmp_path / "in.jsonl", 40)
    out = tmp_path / "out"

    def worker(k: int, *flags: str) -> tuple[int, str]:
        return run_cli(capsys, str(inp), str(out), "--url", url, "--shard-size", "10",
                       "--worker", f"{k}/2", "--json", *flags)

    assert worker(1)[0] == 0
    before = files(out)
    inp.write_text('{"id": "new", "messages": [{"role": "user", "content": "first"}]}\n'
                   + inp.read_text())
    code, err = worker(0)
    assert code == 1, err
    assert f"error: {inp}: lines 11-20 (shard 1): shard-000001.jsonl was made from other " \
           f"lines" in err and f"it is --worker 1/2's shard on {out}" in err, err
    assert "\n    fix: rerun every worker with --redo-changed" in err, err
    assert files(out) == before
    for k in (0, 1):
        code, err = worker(k, "--redo-changed")
        assert code == 0, err
    view = results(out)
    assert view.returncode == 0, view.stderr
    ids = [json.loads(line)["id"] for line in view.stdout.splitlines()]
    assert sorted(ids) == sorted(["new"] + [f"r{i}" for i in range(40)])
    for k in (0, 1):
        assert worker(k)[0] == 0  # the job is now the new input's, for both workers
