"""The job rides out an outage of its whole fleet: the only server killed mid-job, then started
again on its port; nothing fails, every id is written once, and the pause is said."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from sglang_fleet_generate.outage import Breaker, is_trouble, retry_after
from test_job import cli, records
from tests.conftest import Sims, free_port, sims, write_input

__all__ = ["sims"]  # the fixture, used by name
N = 600


def test_the_only_server_killed_mid_job_pauses_the_job_and_loses_nothing(
        sims: Sims, tmp_path: Path) -> None:
    port = free_port()
    slow = ("--max-running-requests", "8")
    sims.start(*slow, port=port, decode="400")  # 20 tokens: 50 ms a request, ~10 s a job
    inp = write_input(tmp_path / "in.jsonl", N, max_tokens=20)
    out = tmp_path / "out"
    job = subprocess.Popen(cli(str(inp), str(out), "--url", f"http://127.0.0.1:{port}",
                               "--retries", "2", "--shard-size", "50", "--json"),
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not list(out.glob("shard-*.jsonl")):
        assert job.poll() is None and time.monotonic() < deadline, job.communicate()
        time.sleep(0.1)
    server = sims.procs[-1]
    server.send_signal(signal.SIGKILL)
    server.wait()
    time.sleep(8)  # the fleet is out: every try is refused
    sims.start(*slow, port=port, decode="400")
    stdout, stderr = job.communicate(timeout=180)
    assert job.returncode == 0, stderr[-3000:]
    events = [json.loads(line) for line in stdout.splitlines()]
    kinds = [e["event"] for e in events]
    paused = next(e for e in events if e["event"] == "paused")
    # a new connection, refused, or (the killed server's children still hold its socket for a
    # moment) closed unanswered
    assert re.search(r"GET /health_generate: (ConnectError|RemoteProtocolError|ReadError)",
                     paused["cause"]), paused
    resumed = next(e for e in events if e["event"] == "resumed")
    assert kinds.index("paused") < kinds.index("resumed") and resumed["paused_s"] >= 5
    assert events[-1]["event"] == "done" and events[-1]["failures"] == 0
    ids = [r["id"] for r in records(out)]
    assert len(ids) == N and set(ids) == {f"r{i}" for i in range(N)}


@pytest.mark.parametrize("status, body, trouble", [
    (503, b'{"error":"No available workers"}', True), (502, b"", True), (504, b"", True),
    (429, b"", True),
    (500, b'{"error":{"type":"server_error","code":"call_upstream_connection_failed"}}', True),
    (500, b'{"error":{"type":"Internal Server Error","code":"call_upstream_request_error"}}',
     True),
    (404, b'{"error":{"type":"invalid_request_error","code":"model_not_found"}}', True),
    (500, b'{"object":"error","message":"internal"}', False), (400, b"", False),
    (404, b"", False)])
def test_what_is_the_fleets_trouble_and_what_is_the_requests(status: int, body: bytes,
                                                             trouble: bool) -> None:
    assert is_trouble(status, body) is trouble


def test_retry_after_reads_seconds_and_http_dates() -> None:
    assert retry_after("7") == 7.0 and retry_after(" 0 ") == 0.0
    assert retry_after("86400") == 600.0  # capped: a job does not sleep for a day
    assert retry_after("Wed, 21 Oct 2015 07:28:10 GMT", now=1445412480.0) == 10.0
    assert retry_after("Wed, 21 Oct 2015 07:28:00 GMT", now=1445412490.0) == 0.0
    assert retry_after(None) is None and retry_after("soon") is None and retry_after("") is None


def test_a_try_counts_only_when_the_health_probe_after_it_passes() -> None:
    """Answers to requests already in flight (servers draining) prove nothing: the probe
    decides; a failed probe pauses, and the next passing probe resumes."""
    health: list[str | None] = ["GET /health_generate: ConnectError"]
    said: list[str] = []

    async def probe() -> str | None:
        return health[0]

    async def scenario() -> list[bool]:
        breaker = Breaker(probe, lambda cause: said.append(f"paused: {cause}"),
                          lambda s, cause: said.append("resumed"))
        breaker.answered()  # a draining server answers what it held
        first = await breaker.counts("HTTP 500: Request failed: connect error")
        second = await breaker.counts("HTTP 503: No available workers")  # paused: no probe
        health[0] = None
        await asyncio.wait_for(breaker.admit(), timeout=10)  # the prober resumes it
        third = await breaker.counts("HTTP 503: alone")  # the fleet serves: it counts
        return [first, second, third, breaker.paused]

    assert asyncio.run(scenario()) == [False, False, True, False]
    assert said == ["paused: HTTP 500: Request failed: connect error; GET /health_generate: "
                    "ConnectError", "resumed"]
