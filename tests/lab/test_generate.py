"""The job through the lab's fleet (issue 17): 2 hosts behind the real sglang-router 0.3.2
(host data ``router_package``; the other lab modules run smg, the default), 5,000 requests
read from and written to the lab's S3 endpoint, a rolling redeploy started in the middle, the
generator killed with SIGKILL, then the same command again: exactly 5,000 unique ids in the
output and the manifest matching the shards; outages, kills, and at the end the router
switched to smg under a running job."""

from __future__ import annotations

import hashlib
import json
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sglang_fleet_lab.site import S3_CREDENTIALS
from tests.conftest import ROOT
from tests.lab.conftest import KEY_FILE, LAB, ROUTER, booted_lab, pyinfra, run, ssh, url

pytestmark = pytest.mark.lab
S3_URL = LAB.s3_url
BUCKET = "jobs"
N = 5000
OLD_ROUTER = "sglang-router"  # 0.3.2; test_a_router_switch_... ends on smg


@pytest.fixture(scope="module")
def fleet() -> Iterator[None]:
    for _ in booted_lab("--hosts", "2", "--gpus", "1"):
        result = pyinfra("deploys/sglang.py")
        assert result.returncode == 0, (result.stdout + result.stderr)[-5000:]
        result = pyinfra("deploys/router.py", "--data", f"router_package={OLD_ROUTER}")
        assert result.returncode == 0, (result.stdout + result.stderr)[-5000:]
        yield


@pytest.fixture(autouse=True)
def serving(fleet: None) -> None:
    """Each test starts with the fleet whole in the router: a test that failed before it may
    have left a server stopped (started again here, so one failure does not fail the rest)."""
    deadline = time.monotonic() + 180
    while not whole(router_health()) and time.monotonic() < deadline:
        for host in HOSTS:
            if ssh(host, "systemctl is-active --quiet sglang.service").returncode != 0:
                start_again(host)
        time.sleep(3)
    assert whole(router_health()), router_health()


@pytest.fixture
def s3(monkeypatch: pytest.MonkeyPatch) -> Any:
    import boto3

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", S3_CREDENTIALS["aws_access_key_id"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", S3_CREDENTIALS["aws_secret_access_key"])
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    client = boto3.client("s3", endpoint_url=S3_URL)
    client.create_bucket(Bucket=BUCKET)
    return client


def upload_input(s3: Any) -> None:
    """5,000 thinking-mode requests long enough (~1 s each) that the job outlasts a roll."""
    lines = (json.dumps({"id": f"job-{i}", "max_tokens": 200,
                         "messages": [{"role": "user", "content": f"task {i}"}]})
             for i in range(N))
    s3.put_object(Bucket=BUCKET, Key="in/prompts.jsonl", Body="\n".join(lines) + "\n")


def shards(s3: Any) -> list[str]:
    listing = s3.list_objects_v2(Bucket=BUCKET, Prefix="out/").get("Contents", [])
    return [o["Key"] for o in listing if o["Key"].startswith("out/shard-")]


def stamp(s3: Any, key: str) -> tuple[str, str]:
    head = s3.head_object(Bucket=BUCKET, Key=key)
    return head["ETag"], str(head["LastModified"])


def argv() -> list[str]:
    return [sys.executable, "-m", "sglang_fleet.cli", "generate",
            f"s3://{BUCKET}/in/prompts.jsonl", f"s3://{BUCKET}/out/", "--url", ROUTER,
            "--api-key-file", str(KEY_FILE),
            "--shard-size", "250", "--s3-endpoint", S3_URL, "--json"]


def test_roll_and_kill_9_mid_job_then_rerun_writes_each_id_once(fleet: None, s3: Any) -> None:
    upload_input(s3)
    first = subprocess.Popen(argv(), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
    deadline = time.monotonic() + 600
    while len(shards(s3)) < 2:
        assert first.poll() is None, first.communicate()
        assert time.monotonic() < deadline, "no shard in S3 after 600 s"
        time.sleep(0.5)
    roll = subprocess.Popen(["sglang-fleet", "roll", "inventories/lab.py", "--data",
                             "sglang.memory.max_running_requests=40"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    time.sleep(20)  # the roll is draining or restarting the first host now
    first.send_signal(signal.SIGKILL)
    first.wait()
    committed = {k: stamp(s3, k) for k in shards(s3)}
    assert 2 <= len(committed) < N // 250, "the kill must land mid-job"
    assert roll.poll() is None, "the roll must still be going when the job is run again"
    rerun = subprocess.run(argv(), cwd=ROOT, capture_output=True, text=True, timeout=1800)
    roll_out, _ = roll.communicate(timeout=900)
    assert roll.returncode == 0, roll_out[-5000:]
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    events = [json.loads(line) for line in rerun.stdout.splitlines()]
    done = events[-1]
    assert done["event"] == "done" and done["failures"] == 0
    assert done["skipped"] == 250 * len(committed) and done["done"] + done["skipped"] == N
    # sized from the router's workers, or --concurrency where /workers needs the admin key
    assert events[0]["event"] == "concurrency" and events[0]["limit"] >= 1

    manifest = json.loads(s3.get_object(Bucket=BUCKET, Key="out/manifest.json")["Body"].read())
    assert manifest["complete"] is True and manifest["records"] == N
    assert {f"out/{e['name']}" for e in manifest["shards"]} == set(shards(s3))
    ids: list[str] = []
    for entry in manifest["shards"]:
        data = s3.get_object(Bucket=BUCKET, Key=f"out/{entry['name']}")["Body"].read()
        assert hashlib.sha256(data).hexdigest() == entry["sha256"], entry["name"]
        rows = [json.loads(line) for line in data.splitlines()]
        assert len(rows) == entry["records"]
        assert all(r["reasoning_content"] and r["usage"]["completion_tokens"] for r in rows)
        ids += [r["id"] for r in rows]
    assert len(ids) == N and set(ids) == {f"job-{i}" for i in range(N)}
    for key, before in committed.items():  # shards finished before the kill were not redone
        assert stamp(s3, key) == before, key
    assert run("sglang-fleet", "lab", "status").returncode == 0


HOSTS = {host: url(host, 30000) for host in ("lab1", "lab2")}


def router_health() -> dict[str, bool]:
    """Each server's health as the router sees it (its /workers, with the admin key)."""
    from sglang_fleet.fleet.router_api import Router, RouterError
    from sglang_fleet_lab.state import load

    try:
        workers = Router(ROUTER, load().api_key("admin"), timeout=5).workers()
    except RouterError:
        return {}
    return {host: bool(workers.get(url, {}).get("is_healthy")) for host, url in HOSTS.items()}


def ended(job: subprocess.Popen[str]) -> tuple[str, str]:
    """A job's output, killed first if it still runs (a test that gives up on it must not
    wait for it, nor leave it running)."""
    if job.poll() is None:
        job.kill()
    return job.communicate(timeout=60)


def start_again(host: str) -> bool:
    """Start a stopped server. In the lab's nspawn guests systemd 252 can fail to remove a
    stopped unit's cgroup ("Failed to kill control group ...: Input/output error") and the next
    start then ends at once with status 219/CGROUP; a start a few seconds later succeeds."""
    for _ in range(3):
        if ssh(host, "systemctl reset-failed sglang.service; "
                     "systemctl start sglang.service").returncode == 0:
            return True
        time.sleep(5)
    return False


OUTAGE = 20  # seconds both servers stay stopped: far longer than any line's retries last


def test_every_server_stopped_20_s_mid_job_pauses_it_and_fails_nothing(
        fleet: None, tmp_path: Path) -> None:
    """Both hosts' servers stopped (systemctl stop: they drain, then the router has no worker)
    for 20 s in the middle of a job with --retries 2: the job pauses, says why, probes the
    fleet's health (1 s doubling: probes at 1, 3, 7 and 15 s fail), resumes by itself once the
    router has its workers back, and ends with every id once and no failed line."""
    n = 2000  # ~2 min at 16 at a time (~1 s each): the outage lands in the middle
    source = tmp_path / "prompts.jsonl"
    source.write_text("".join(json.dumps({"id": f"out-{i}", "max_tokens": 200, "messages": [
        {"role": "user", "content": f"task {i}"}]}) + "\n" for i in range(n)))
    out = tmp_path / "out"
    job = subprocess.Popen(
        [sys.executable, "-m", "sglang_fleet.cli", "generate", str(source), str(out), "--url",
         ROUTER, "--api-key-file", str(KEY_FILE), "--shard-size", "100", "--retries", "2",
         "--concurrency", "16", "--json"], cwd=ROOT, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while not list(out.glob("shard-*.jsonl")):
        assert job.poll() is None and time.monotonic() < deadline, ended(job)
        time.sleep(0.5)
    try:
        for host in HOSTS:
            stopped = ssh(host, "systemctl stop sglang.service")
            assert stopped.returncode == 0, stopped.stderr
        time.sleep(OUTAGE)
        assert job.poll() is None, ("the job ended during the outage: make it longer",
                                    ended(job))
    finally:  # the servers back whatever happened: the module's later tests need them
        started = {host: start_again(host) for host in HOSTS}
    assert all(started.values()), [ssh(h, "systemctl status sglang.service --no-pager; "
                                          "journalctl -u sglang -n 40 -o cat").stdout[-4000:]
                                   for h, ok in started.items() if not ok]
    stdout, stderr = job.communicate(timeout=900)
    assert job.returncode == 0, stderr[-3000:]
    events = [json.loads(line) for line in stdout.splitlines()]
    paused = [e for e in events if e["event"] == "paused"]
    resumed = [e for e in events if e["event"] == "resumed"]
    # paused for the outage (the fleet was out from the second stop's drain for OUTAGE s)
    assert paused and resumed and sum(e["paused_s"] for e in resumed) >= OUTAGE - 5, \
        (paused, resumed)
    assert "/health_generate" in paused[0]["cause"], paused[0]
    done = events[-1]
    assert done["event"] == "done" and done["failures"] == 0, done
    view = run("sglang-fleet", "results", str(out))
    assert view.returncode == 0, view.stderr
    ids = [json.loads(line)["id"] for line in view.stdout.splitlines()]
    assert len(ids) == n and set(ids) == {f"out-{i}" for i in range(n)}
    wait = time.monotonic() + 120
    while not whole(router_health()) and time.monotonic() < wait:
        time.sleep(2)
    assert whole(router_health()), "the fleet did not come back whole"


def test_the_fleet_heals_while_servers_are_killed(fleet: None, tmp_path: Path) -> None:
    """4,000 requests through the router while a server is killed with SIGKILL every ~30 s
    (lab1 and lab2 in turn, once both are healthy again): systemd restarts
    it, the router stops sending it requests and takes it back once healthy, and the job ends
    with every id once and no failure."""
    n = 4000  # ~150 s at 16 at a time (~1 s each): room for a kill of each host
    source = tmp_path / "prompts.jsonl"
    source.write_text("".join(json.dumps({"id": f"heal-{i}", "max_tokens": 200, "messages": [
        {"role": "user", "content": f"task {i}"}]}) + "\n" for i in range(n)))
    out = tmp_path / "out"
    job = subprocess.Popen(
        [sys.executable, "-m", "sglang_fleet.cli", "generate", str(source), str(out), "--url",
         ROUTER, "--api-key-file", str(KEY_FILE), "--shard-size", "250", "--concurrency", "16",
         "--json"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    kills: list[tuple[str, float]] = []
    seen_unhealthy: set[str] = set()
    last = time.monotonic() - 10  # the first kill 20 s in
    deadline = last + 900
    while job.poll() is None and time.monotonic() < deadline:
        health = router_health()
        seen_unhealthy |= {h for h, ok in health.items() if not ok}
        if health and all(health.values()) and time.monotonic() - last >= 30:
            victim = "lab1" if len(kills) % 2 == 0 else "lab2"
            killed = ssh(victim, "kill -9 $(systemctl show -p MainPID --value sglang.service)")
            assert killed.returncode == 0, killed.stderr
            kills.append((victim, time.monotonic()))
            last = time.monotonic()
        time.sleep(1)
    stdout, stderr = job.communicate(timeout=60)
    assert job.returncode == 0, stderr[-3000:]
    assert len(kills) >= 2, f"the job ended after {len(kills)} kill(s): make it longer"
    assert {victim for victim, _ in kills} <= seen_unhealthy  # the router saw each one down
    done = [json.loads(line) for line in stdout.splitlines()][-1]
    assert done["event"] == "done" and done["failures"] == 0, done
    ids = [json.loads(line)["id"] for shard in sorted(out.glob("shard-*.jsonl"))
           for line in shard.read_text().splitlines()]
    assert len(ids) == n and set(ids) == {f"heal-{i}" for i in range(n)}
    wait = time.monotonic() + 120  # the last victim may still wait out its RestartSec
    while not whole(router_health()) and time.monotonic() < wait:
        time.sleep(2)
    assert whole(router_health()), "the fleet did not come back whole"
    restarts = {h: ssh(h, "systemctl show -p NRestarts --value sglang.service").stdout.strip()
                for h in HOSTS}
    assert all(int(restarts[h]) >= 1 for h in {victim for victim, _ in kills}), restarts


def whole(health: dict[str, bool]) -> bool:
    return set(health) == set(HOSTS) and all(health.values())


def test_a_router_switch_to_smg_under_a_running_job_fails_nothing(
        fleet: None, tmp_path: Path) -> None:
    """The router deploy with the default gateway, while a job runs through the router: the
    unit restarts onto smg (its own venv; the worker list becomes the file smg watches, the old
    environment-file list goes), the job pauses for the restart and fails no line, and the
    next router deploy changes nothing."""
    n = 1500
    source = tmp_path / "prompts.jsonl"
    source.write_text("".join(json.dumps({"id": f"sw-{i}", "max_tokens": 200, "messages": [
        {"role": "user", "content": f"task {i}"}]}) + "\n" for i in range(n)))
    out = tmp_path / "out"
    job = subprocess.Popen(
        [sys.executable, "-m", "sglang_fleet.cli", "generate", str(source), str(out), "--url",
         ROUTER, "--api-key-file", str(KEY_FILE), "--shard-size", "100", "--retries", "2",
         "--concurrency", "16", "--json"], cwd=ROOT, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while not list(out.glob("shard-*.jsonl")):
        assert job.poll() is None and time.monotonic() < deadline, ended(job)
        time.sleep(0.5)
    switched = pyinfra("deploys/router.py")
    assert switched.returncode == 0, (switched.stdout + switched.stderr)[-5000:]
    assert job.poll() is None, "the job ended before the switch: make it longer"
    stdout, stderr = job.communicate(timeout=900)
    assert job.returncode == 0, stderr[-3000:]
    done = [json.loads(line) for line in stdout.splitlines()][-1]
    assert done["event"] == "done" and done["failures"] == 0, done
    unit = ssh("lab1", "systemctl cat sglang-router.service").stdout
    assert "smg.cli launch" in unit and "--discovery-file /etc/sglang-router/workers.json" in unit
    files = ssh("lab1", "ls /etc/sglang-router /opt/sglang/router").stdout.split()
    assert "workers.json" in files and "workers.env" not in files, files
    assert "smg-1.13.0" in files and "sglang-router-0.3.2" in files, files
    title = ssh("lab1", "ps -o args= -p $(systemctl show -p MainPID --value sglang-router)")
    assert title.stdout.strip() == "smg::router", title.stdout
    assert whole(router_health()), router_health()
    again = pyinfra("deploys/router.py")
    out_text = again.stdout + again.stderr
    assert again.returncode == 0 and re.search(r"Grand total\s+\d+\s+-\s+-", out_text), \
        out_text[-3000:]
