"""sglang-fleet generate against real simulator processes on loopback (and moto's S3 server):
resume after kill -9, null vs "" content, retries on 503 and dropped connections, the failures
file and exit status, S3 input and output."""

from __future__ import annotations

import asyncio
import hashlib
import json
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from sglang_fleet_generate.job import run_job
from sglang_fleet_generate.job_state import Options
from sglang_fleet_generate.progress import Stats
from tests.conftest import Sims, free_port, sims, wait_http, write_input

__all__ = ["sims"]  # the fixture, used by name


def records(out: Path) -> list[dict[str, Any]]:
    rows = []
    for shard in sorted(out.glob("shard-*.jsonl")):
        rows += [json.loads(line) for line in shard.read_text().splitlines()]
    return rows


def check_manifest(out: Path, n: int) -> dict[str, Any]:
    manifest: dict[str, Any] = json.loads((out / "manifest.json").read_text())
    assert manifest["complete"] is True
    assert manifest["records"] == n
    for entry in manifest["shards"]:
        data = (out / entry["name"]).read_bytes()
        assert hashlib.sha256(data).hexdigest() == entry["sha256"]
        assert data.count(b"\n") == entry["records"]
    assert {e["name"] for e in manifest["shards"]} == {p.name for p in out.glob("shard-*")}
    return manifest


def generate(inp: str, out: str, url: str, **kw: Any) -> tuple[dict[str, Any], Stats]:
    return asyncio.run(run_job(Options(inp, out, url, json_status=True, **kw)))


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "sglang_fleet.cli", "generate", *args]


def test_content_null_and_empty_string_are_kept(sims: Sims, tmp_path: Path) -> None:
    """An all-reasoning answer: null up to 0.5.12, "" from 0.5.13; both written as answered."""
    inp = write_input(tmp_path / "in.jsonl", 20, max_tokens=4)
    for release, expected in (("0.5.12", None), ("0.5.23", "")):
        url = sims.start("--max-running-requests", "8", release=release)
        out = tmp_path / f"out-{release}"
        summary, stats = generate(str(inp), str(out), url, shard_size=7)
        rows = records(out)
        assert len(rows) == 20 and summary["failures"] == 0
        assert all(r["content"] is expected and r["reasoning_content"] for r in rows), rows[0]
        assert all(r["finish_reason"] == "length" and r["usage"]["completion_tokens"] == 4
                   for r in rows)
        assert set(rows[0]) == {"id", "request_sha256", "reasoning_content", "content",
                                "finish_reason", "usage", "latency_s", "server", "fingerprint"}
        assert rows[0]["server"] == url
        assert stats.concurrency == 8  # sized from the server's own /server_info
        fingerprints = check_manifest(out, 20)["fingerprints"]
        assert list(fingerprints) == [rows[0]["fingerprint"]] and \
            {r["fingerprint"] for r in rows} == {rows[0]["fingerprint"]}
        assert fingerprints[rows[0]["fingerprint"]]["version"] == release
    raw = (tmp_path / "out-0.5.12" / "shard-000000.jsonl").read_text()
    assert '"content":null' in raw and '"content":""' in \
        (tmp_path / "out-0.5.23" / "shard-000000.jsonl").read_text()


def test_resume_after_kill_9_writes_every_id_once(sims: Sims, tmp_path: Path) -> None:
    n = 3000
    url = sims.start("--max-running-requests", "16", decode="60")
    inp = write_input(tmp_path / "in.jsonl", n)
    out = tmp_path / "out"
    argv = cli(str(inp), str(out), "--url", url, "--shard-size", "100", "--json")
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while len(list(out.glob("shard-*.jsonl"))) < 4:
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        assert time.monotonic() < deadline, "no shard written in 120 s"
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    before = {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in out.glob("shard-*")}
    assert 4 <= len(before) < n // 100, "the kill must land mid-job"
    assert list((out / ".spool").glob("*.part")), "a killed run leaves partial shards spooled"
    rerun = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr
    done = json.loads(rerun.stdout.splitlines()[-1])
    assert done["skipped"] >= 100 * len(before) and done["done"] + done["skipped"] == n
    ids = [r["id"] for r in records(out)]
    assert len(ids) == n and set(ids) == {f"r{i}" for i in range(n)}
    check_manifest(out, n)
    after = {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in out.glob("shard-*")}
    assert all(after[name] == stat for name, stat in before.items()), "a shard was redone"


class FaultyProxy:
    """An HTTP/1.1 proxy in front of a simulator that answers 503 to every ``every_503``-th
    request, drops the connection on every ``every_drop``-th, and always 503s a request whose
    body holds ``always``."""

    def __init__(self, upstream: str, every_503: int, every_drop: int, always: str) -> None:
        self.upstream, self.every_503, self.every_drop = upstream, every_503, every_drop
        self.always = always.encode()
        self.count = 0
        self.faults = {"503": 0, "drop": 0}
        self.workers: dict[str, bool] | None = None  # set: answer GET /workers as a router
        self.own_info = False  # True: answer /get_server_info itself, as sglang-router 0.3.2
        self.port = free_port()
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()
        self.ready.wait(10)

    def _serve(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.http = httpx.AsyncClient(base_url=self.upstream, timeout=30)
        server = self.loop.run_until_complete(
            asyncio.start_server(self._client, "127.0.0.1", self.port))
        self.ready.set()
        self.loop.run_forever()
        server.close()

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode().split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                length = next((int(h.split(":", 1)[1]) for h in lines[1:]
                               if h.lower().startswith("content-length:")), 0)
                body = await reader.readexactly(length)
                if not await self._answer(method, path, body, writer):
                    return
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def _answer(self, method: str, path: str, body: bytes,
                      writer: asyncio.StreamWriter) -> bool:
        status, data = 200, b""
        if path in ("/server_info", "/get_server_info") and self.own_info:
            status, data = ((404, b'{"error":"unknown_url"}') if path == "/server_info" else
                            (200, b'{"router_manager":true,"routers_count":1,"workers_count":1}'))
        elif path == "/workers" and self.workers is not None:  # sglang-router 0.3.2's listing
            listing = [{"id": str(i), "url": u, "is_healthy": ok}
                       for i, (u, ok) in enumerate(self.workers.items())]
            data = json.dumps({"workers": listing, "total": len(listing)}).encode()
        elif path == "/v1/chat/completions":
            self.count += 1
            if self.count % self.every_drop == 0:
                self.faults["drop"] += 1
                return False
            if self.always in body or self.count % self.every_503 == 0:
                self.faults["503"] += 1
                status, data = 503, b'{"error":"no healthy worker"}'
        if status == 200 and not data:
            response = await self.http.request(method, path, content=body or None,
                                               headers={"Content-Type": "application/json"})
            status, data = response.status_code, response.content
        writer.write(f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
        await writer.drain()
        return True

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        """Stop serving: every connection's task ended (cancelled) and the upstream client
        closed while the loop still runs, so none is left for the garbage collector to finish
        on a stopped loop."""
        asyncio.run_coroutine_threadsafe(self._shutdown(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)

    async def _shutdown(self) -> None:
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.http.aclose()


def test_retries_503_and_dropped_connections_lose_nothing(sims: Sims, tmp_path: Path) -> None:
    url = sims.start("--max-running-requests", "8")
    proxy = FaultyProxy(url, every_503=3, every_drop=7, always="never")
    try:
        inp = write_input(tmp_path / "in.jsonl", 300)
        summary, stats = generate(str(inp), str(tmp_path / "out"), proxy.url, shard_size=64,
                                  retries=10, concurrency=8)
    finally:
        proxy.close()
    assert proxy.faults["503"] > 50 and proxy.faults["drop"] > 20
    assert summary["failures"] == 0 and stats.retries >= 70
    assert sorted(r["id"] for r in records(tmp_path / "out")) == sorted(f"r{i}"
                                                                        for i in range(300))
    check_manifest(tmp_path / "out", 300)


def test_concurrency_follows_the_routers_healthy_workers(
        sims: Sims, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Healthy workers times one worker's max_running_requests (the router's own
    /get_server_info), resized as workers come and go."""
    small = sims.start("--max-running-requests", "8", decode="60")
    big = sims.start("--max-running-requests", "16", decode="60")
    router = FaultyProxy(small, every_503=10**9, every_drop=10**9, always="never")
    router.workers = {small: True, big: True, "http://127.0.0.1:9": False}
    inp = write_input(tmp_path / "in.jsonl", 300)
    timer = threading.Timer(2.0, lambda: router.workers and router.workers.pop(big))
    timer.start()
    try:
        summary, stats = generate(str(inp), str(tmp_path / "out"), router.url, refresh_s=0.3)
    finally:
        timer.cancel()
        router.close()
    events = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    limits = [e["limit"] for e in events if e["event"] == "concurrency"]
    assert limits[0] == 16 and limits[-1] == 8, limits
    assert summary["records"] == 300 and stats.concurrency == 8


def test_a_fingerprint_read_where_none_was_is_learned_not_a_change(
        sims: Sims, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Through a router that gives no fingerprint (sglang-router 0.3.2 answers
    /get_server_info itself), then one that does (smg passes it to a worker): the job goes on,
    the records after it name the fingerprint, and the manifest holds both."""
    url = sims.start("--max-running-requests", "8", decode="300")
    router = FaultyProxy(url, every_503=10**9, every_drop=10**9, always="never")
    router.own_info = True
    timer = threading.Timer(1.5, lambda: setattr(router, "own_info", False))
    timer.start()
    try:
        summary, _ = generate(str(write_input(tmp_path / "in.jsonl", 300, max_tokens=16)),
                              str(tmp_path / "out"), router.url, refresh_s=0.3, shard_size=50)
    finally:
        timer.cancel()
        router.close()
    assert summary["records"] == 300 and summary["failures"] == 0
    fingerprints = check_manifest(tmp_path / "out", 300)["fingerprints"]
    known = [d for d in fingerprints if d != "unknown"]
    assert next(iter(fingerprints)) == "unknown" and len(known) == 1, fingerprints
    assert {r["fingerprint"] for r in records(tmp_path / "out")} == {"unknown", *known}
    events = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [e.get("changed") for e in events if e["event"] == "fingerprint"] == [None, False]


ANSWER = json.dumps({"choices": [{"message": {"content": "x"}, "finish_reason": "stop"}],
                     "usage": {"completion_tokens": 1}}).encode()


def test_the_key_goes_to_no_worker_the_router_lists(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A router (or whoever answers at --url) lists workers at other origins: they are never
    asked, so the key never reaches them; the fleet is sized through the router itself."""
    from tests.conftest import Origin

    elsewhere = Origin({"/server_info": (200, {}, b'{"max_running_requests": 100}')})
    listing = {"workers": [{"url": elsewhere.url, "is_healthy": True},
                           {"url": elsewhere.url.replace("http:", "https:"), "is_healthy": True}]}
    router = Origin({"/workers": (200, {}, json.dumps(listing).encode()),
                     "/get_server_info": (200, {}, b'{"max_running_requests": 4}'),
                     "/v1/models": (200, {}, b'{"data": [{"id": "m"}]}'),
                     "/v1/chat/completions": (200, {}, ANSWER)})
    try:
        summary, stats = generate(str(write_input(tmp_path / "in.jsonl", 5)),
                                  str(tmp_path / "out"), router.url, api_key="k" * 20)
    finally:
        router.close()
        elsewhere.close()
    assert summary["records"] == 5 and stats.concurrency == 8
    assert elsewhere.seen == [] and set(router.keys()) == {"Bearer " + "k" * 20}
    assert "2 healthy workers x 4" in capsys.readouterr().out


def test_the_pool_sends_nothing_to_another_origin() -> None:
    from sglang_fleet_generate.http_pool import Pool
    from tests.conftest import Origin

    mine, other = Origin({}), Origin({})

    async def scenario() -> None:
        pool = Pool({"Authorization": "Bearer " + "k" * 20}, timeout=5, only=mine.url)
        assert (await pool.get(f"{mine.url}/health", 5)).status_code == 404
        for url in (other.url, mine.url.replace("http:", "https:")):
            with pytest.raises(httpx.UnsupportedProtocol, match="not the origin of --url"):
                await pool.get(f"{url}/server_info", 5)
        await pool.aclose()

    try:
        asyncio.run(scenario())
    finally:
        mine.close()
        other.close()
    assert other.seen == [] and len(mine.seen) == 1


def test_failures_file_and_exit_status(sims: Sims, tmp_path: Path) -> None:
    url = sims.start("--max-running-requests", "8")
    proxy = FaultyProxy(url, every_503=10**9, every_drop=10**9, always="always-503")
    bad = ['{"id": "r3", "messages": [{"role": "user", "content": "again"}]}',  # repeated id
           'not json', '{"id": "no-messages", "temperature": 0.5}',
           '{"id": "stuck", "messages": [{"role": "user", "content": "always-503"}]}',
           '"a bare prompt"']
    inp = write_input(tmp_path / "in.jsonl", 10, extra=bad)
    out = tmp_path / "out"
    try:
        result = subprocess.run(cli(str(inp), str(out), "--url", proxy.url, "--retries", "2",
                                    "--shard-size", "4"), capture_output=True, text=True,
                                timeout=120)
    finally:
        proxy.close()
    assert result.returncode == 104, result.stderr  # 100 + 4 failed lines
    assert "failures file" in result.stdout and "completions/s" in result.stdout
    fails = {f["id"]: f for f in map(json.loads, (out / "failures.jsonl").read_text()
                                     .splitlines())}
    assert set(fails) == {"r3", "line-12", "no-messages", "stuck"}
    assert "appears earlier in the input" in fails["r3"]["error"]
    assert "line 12: not JSON" in fails["line-12"]["error"]
    assert "no 'messages' list and no 'prompt'" in fails["no-messages"]["error"]
    assert fails["stuck"]["tries"] == 3 and "HTTP 503" in fails["stuck"]["error"]
    ids = [r["id"] for r in records(out)]
    assert sorted(ids) == sorted([f"r{i}" for i in range(10)] + ["line-15"])
    assert json.loads((out / "manifest.json").read_text())["failures"] == 4


@pytest.fixture
def s3_server(tmp_path: Path) -> Iterator[str]:
    """moto's S3 server on loopback, as the lab runs it."""
    port = free_port()
    moto = Path(sys.executable).with_name("moto_server")
    proc = subprocess.Popen([str(moto), "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(url)
        yield url
    finally:
        proc.kill()
        proc.wait()


@pytest.fixture
def s3(s3_server: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A client of the moto server, with bucket ``jobs``."""
    import boto3

    for key, value in (("AWS_ACCESS_KEY_ID", "test"), ("AWS_SECRET_ACCESS_KEY", "test"),
                       ("AWS_DEFAULT_REGION", "us-east-1")):
        monkeypatch.setenv(key, value)
    client = boto3.client("s3", endpoint_url=s3_server)
    client.create_bucket(Bucket="jobs")
    return client


def test_s3_input_and_output(sims: Sims, tmp_path: Path, s3_server: str, s3: Any) -> None:
    inp = write_input(tmp_path / "in.jsonl", 500)
    s3.upload_file(str(inp), "jobs", "in/prompts.jsonl")
    url = sims.start("--max-running-requests", "16")
    args = ("s3://jobs/in/prompts.jsonl", "s3://jobs/run-1/", url)
    summary, _ = generate(*args, shard_size=120, s3_endpoint=s3_server)
    assert summary["records"] == 500 and summary["failures"] == 0
    keys = {o["Key"] for o in s3.list_objects_v2(Bucket="jobs", Prefix="run-1/")["Contents"]}
    assert keys == {"run-1/manifest.json"} | {f"run-1/shard-{i:06d}.jsonl" for i in range(5)}
    manifest = json.loads(s3.get_object(Bucket="jobs", Key="run-1/manifest.json")["Body"].read())
    ids = []
    for entry in manifest["shards"]:
        data = s3.get_object(Bucket="jobs", Key=f"run-1/{entry['name']}")["Body"].read()
        assert hashlib.sha256(data).hexdigest() == entry["sha256"]
        ids += [json.loads(line)["id"] for line in data.splitlines()]
    assert sorted(ids) == sorted(f"r{i}" for i in range(500))
    # a run killed mid-multipart leaves an upload that never became an object
    for key in ("run-1/shard-000009.jsonl", "run-1/deeper/other-job.jsonl"):
        upload = s3.create_multipart_upload(Bucket="jobs", Key=key)
        s3.upload_part(Bucket="jobs", Key=key, UploadId=upload["UploadId"], PartNumber=1,
                       Body=b"partial")
    again, stats = generate(*args, shard_size=120, s3_endpoint=s3_server)
    assert stats.shards_written == 0 and again["skipped"] == 500 and again["done"] == 0
    left = s3.list_multipart_uploads(Bucket="jobs", Prefix="run-1/").get("Uploads", [])
    assert [u["Key"] for u in left] == ["run-1/deeper/other-job.jsonl"]


def test_large_shard_goes_up_as_one_multipart_object(
        sims: Sims, tmp_path: Path, s3_server: str, s3: Any,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A shard over the multipart size is uploaded in parts and appears once, whole."""
    from sglang_fleet_generate import store

    monkeypatch.setattr(store, "MULTIPART_BYTES", 5 * 1024 * 1024)  # S3's smallest part
    url = sims.start("--max-running-requests", "32",
                     env={"SGLANG_SIM_REASONING_TOKENS": "2500"})
    inp = write_input(tmp_path / "in.jsonl", 420, max_tokens=3000)
    summary, _ = generate(str(inp), "s3://jobs/big", url, shard_size=420,
                          s3_endpoint=s3_server)
    head = s3.head_object(Bucket="jobs", Key="big/shard-000000.jsonl")
    assert head["ContentLength"] > 5 * 1024 * 1024 and head["ETag"].strip('"').endswith("-2")
    data = s3.get_object(Bucket="jobs", Key="big/shard-000000.jsonl")["Body"].read()
    manifest = json.loads(s3.get_object(Bucket="jobs", Key="big/manifest.json")["Body"].read())
    assert hashlib.sha256(data).hexdigest() == manifest["shards"][0]["sha256"]
    assert sorted(json.loads(line)["id"] for line in data.splitlines()) == \
        sorted(f"r{i}" for i in range(420)) and summary["records"] == 420


def test_bad_options_are_a_message_not_a_traceback(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    from sglang_fleet.cli import main

    inp = write_input(tmp_path / "in.jsonl", 1)
    # wrong as written: a usage error (exit 2), before anything is read or sent
    for flags, message in ((["--url", "http://127.0.0.1:9", "--shard-size", "0"],
                            "argument --shard-size: must be at least 1, got 0"),
                           (["--url", "127.0.0.1:9"], "argument --url: '127.0.0.1:9' is not an "
                            "http(s) URL"),
                           (["--url", "http://u:pw@127.0.0.1:9"], "holds credentials"),
                           (["--url", "http://127.0.0.1:9", "--timeout", "nan"],
                            "argument --timeout: must be seconds of at least 1")):
        assert main(["generate", str(inp), str(tmp_path / "out"), *flags]) == 2
        err = capsys.readouterr().err
        assert err.startswith("usage: sglang-fleet generate") and message in err, err
        assert "pw" not in err  # a URL's password is never said
    for flags, message in ((["--url", "http://127.0.0.1:9", "--api-key-file", "/nonexistent"],
                            "/nonexistent: cannot read the API key file"),
                           (["--url", "http://127.0.0.1:9"], "ConnectError")):
        assert main(["generate", str(inp), str(tmp_path / "out"), *flags]) == 1
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err, err


def test_a_second_run_on_the_same_output_is_refused(sims: Sims, tmp_path: Path) -> None:
    url = sims.start("--max-running-requests", "4", decode="60")
    inp = write_input(tmp_path / "in.jsonl", 400)
    argv = cli(str(inp), str(tmp_path / "out"), "--url", url, "--json")
    first = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while not (tmp_path / "out" / ".spool").exists():
            time.sleep(0.05)
        second = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    finally:
        first.kill()
        first.wait()
    assert second.returncode == 1
    assert "another sglang-fleet generate is writing here" in second.stderr


# ---- the HTTP pool against a raw loopback server (answers written byte for byte) ------------
async def raw_server(answers: list[bytes]) -> tuple[asyncio.Server, str, list[int]]:
    """A server that reads one request per answer and writes that answer verbatim; the
    answer b"" closes the connection without a word, b"hang" never answers. Returns the
    server, its URL, and the number of connections it accepted (in a list, updated live)."""
    accepted = [0]
    pending = list(answers)

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted[0] += 1
        while pending:
            head = await reader.readuntil(b"\r\n\r\n")
            length = [int(line.split(b":")[1]) for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length:")]
            await reader.readexactly(length[0] if length else 0)
            answer = pending.pop(0)
            if answer == b"hang":
                await asyncio.sleep(30)
            if not answer:
                break
            writer.write(answer)
            await writer.drain()
            if b"Connection: close" in answer:
                break
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, f"http://127.0.0.1:{port}", accepted


OK_JSON = b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 8\r\n\r\n{"a": 1}'
CHUNKED = (b"HTTP/1.1 503 Service Unavailable\r\nTransfer-Encoding: chunked\r\n\r\n"
           b"4\r\nbusy\r\n0\r\n\r\n")
CLOSING = b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nto the end"


def test_pool_keeps_connections_alive_and_reads_every_framing() -> None:
    """Content-Length and chunked answers reuse one connection; an answer that runs to the
    close is read whole and its connection is not reused."""
    from sglang_fleet_generate.http_pool import Pool

    async def scenario() -> tuple[list[tuple[int, bytes]], int]:
        server, url, accepted = await raw_server([OK_JSON, CHUNKED, CLOSING, OK_JSON])
        pool = Pool({"Content-Type": "application/json"}, timeout=5)
        got = []
        for method in ("POST", "GET", "GET", "GET"):
            response = await pool.request(method, f"{url}/v1/x?y=1",
                                          b"{}" if method == "POST" else None)
            got.append((response.status_code, response.content))
        await pool.aclose()
        server.close()
        return got, accepted[0]

    got, connections = asyncio.run(scenario())
    assert got == [(200, b'{"a": 1}'), (503, b"busy"), (200, b"to the end"), (200, b'{"a": 1}')]
    assert connections == 2


def test_pool_turns_network_faults_into_httpx_errors() -> None:
    """What the retry loop catches: a refused connection, a connection dropped before the
    answer, and an answer that never comes are httpx errors, and the pool recovers."""
    from sglang_fleet_generate.http_pool import Pool

    async def scenario() -> list[str]:
        server, url, _ = await raw_server([b"", b"hang", OK_JSON])
        pool = Pool({}, timeout=0.5)
        seen = []
        for target in (f"http://127.0.0.1:{free_port()}", url, url, url):
            try:
                response = await pool.request("POST", f"{target}/v1/x", b"{}")
                seen.append(str(response.status_code))
            except httpx.HTTPError as exc:
                seen.append(type(exc).__name__)
        await pool.aclose()
        server.close()
        return seen

    assert asyncio.run(scenario()) == ["ConnectError", "RemoteProtocolError", "ReadTimeout",
                                       "200"]


def test_retry_failures_sends_only_failed_lines_each_id_once(sims: Sims, tmp_path: Path) -> None:
    """--retry-failures on a finished job: the line that failed on 503s gets its record in
    retry-001.jsonl; a repeated id and bad lines fail again (never a second record); a round
    committed just before a kill is found again; a second round sends what is still failed."""
    url = sims.start("--max-running-requests", "8")
    proxy = FaultyProxy(url, every_503=10**9, every_drop=10**9, always="always-503")
    bad = ['{"id": "r1", "messages": [{"role": "user", "content": "again"}]}',  # repeated id
           'not json', '{"id": "stuck", "messages": [{"role": "user", "content": "always-503"}]}']
    inp = write_input(tmp_path / "in.jsonl", 6, extra=bad)
    out = tmp_path / "out"
    args = (str(inp), str(out), "--retries", "1", "--shard-size", "4")
    refused = subprocess.run(cli(*args, "--url", url, "--retry-failures"), capture_output=True,
                             text=True, timeout=60)
    assert refused.returncode == 1 and "no finished job to retry" in refused.stderr
    try:
        first = subprocess.run(cli(*args, "--url", proxy.url), capture_output=True, text=True,
                               timeout=120)
    finally:
        proxy.close()
    assert first.returncode == 103, first.stderr
    again = subprocess.run(cli(*args, "--url", url, "--retry-failures"), capture_output=True,
                           text=True, timeout=120)
    assert again.returncode == 102, again.stderr
    assert [r["id"] for r in map(json.loads, (out / "retry-001.jsonl").read_text()
                                 .splitlines())] == ["stuck"]
    fails = [json.loads(line) for line in (out / "failures.jsonl").read_text().splitlines()]
    assert sorted((f["id"], f["line"]) for f in fails) == [("line-8", 8), ("r1", 7)]
    ids = [r["id"] for r in records(out)] + ["stuck"]
    assert sorted(ids) == sorted([f"r{i}" for i in range(6)] + ["stuck"])
    manifest = check_manifest(out, 7)
    assert manifest["failures"] == 2
    assert [(e["name"], e["records"], e["failures"]) for e in manifest["retries"]] == [
        ("retry-001.jsonl", 1, 2)]
    # killed after committing round 2, before its manifest: the round is read back
    third = subprocess.run(cli(*args, "--url", url, "--retry-failures"), capture_output=True,
                           text=True, timeout=120)
    assert third.returncode == 102, third.stderr
    assert (out / "retry-002.jsonl").read_bytes() == b""
    (out / "manifest.json").write_text(json.dumps(manifest))  # as before round 2's entry
    fourth = subprocess.run(cli(*args, "--url", url, "--retry-failures"), capture_output=True,
                            text=True, timeout=120)
    assert fourth.returncode == 102, fourth.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert [(e["name"], e["records"], e["failures"]) for e in manifest["retries"]] == [
        ("retry-001.jsonl", 1, 2), ("retry-002.jsonl", 0, 2), ("retry-003.jsonl", 0, 2)]
    assert manifest["records"] == 7 and manifest["complete"] is True


def test_credentials_in_the_url_are_refused_and_never_written(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--url http://user:pass@host``: refused before anything runs (it would have gone into
    manifest.json and every record's ``server``), and the error shows no password."""
    from sglang_fleet import cli
    from tests.conftest import Origin

    router = Origin({"/v1/models": (200, {}, b'{"data": [{"id": "m"}]}'),
                     "/v1/chat/completions": (200, {}, ANSWER)})
    url = router.url.replace("http://", "http://user:hunter2-pw@")
    try:
        code = cli.main(["generate", str(write_input(tmp_path / "in.jsonl", 2)),
                         str(tmp_path / "out"), "--url", url, "--json"])
    finally:
        router.close()
    captured = capsys.readouterr()
    assert code == 2 and router.seen == []  # a URL wrong as written: a usage error
    assert captured.err.startswith("usage: sglang-fleet generate")
    assert f"error: argument --url: '{router.url}' holds credentials" in captured.err
    assert "hunter2" not in captured.err + captured.out
    assert not any("hunter2" in p.read_text() for p in tmp_path.rglob("*") if p.is_file())


def test_a_key_file_with_a_stray_cr_is_refused_without_showing_the_key(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """As the smoke test checks its key file: a CR inside the key would have made every request
    fail with the HTTP library's error about the header, the key in it, in failures.jsonl."""
    from sglang_fleet import cli
    from tests.conftest import Origin

    router = Origin({"/v1/models": (200, {}, b'{"data": [{"id": "m"}]}'),
                     "/v1/chat/completions": (200, {}, ANSWER)})
    key = tmp_path / "key"
    key.write_bytes(b"secret-key-0123\rtail\n")
    try:
        code = cli.main(["generate", str(write_input(tmp_path / "in.jsonl", 2)),
                         str(tmp_path / "out"), "--url", router.url, "--api-key-file", str(key),
                         "--retries", "0", "--json"])
    finally:
        router.close()
    captured = capsys.readouterr()
    assert code == 1 and router.seen == []
    assert f"{key}: contains a control character (U+000D, a carriage return)" in captured.err
    assert "secret-key" not in captured.err + captured.out and not (tmp_path / "out").exists()


# ---- job identity: the input's content, one digest per shard (issue 24, item 5) -------------
def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    from sglang_fleet.cli import main

    code = main(["generate", *args])
    return code, capsys.readouterr().err


def test_an_input_changed_under_a_finished_job_is_refused_or_redone(
        sims: Sims, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """One line inserted at the top shifts every shard: the rerun is refused naming shard 0
    and writes nothing (before: the new line never sent, r39 written twice, exit 0, complete);
    --redo-changed redoes every shard, each id once."""
    url = sims.start("--max-running-requests", "8")
    inp = write_input(tmp_path / "in.jsonl", 40)
    out = tmp_path / "out"
    args = (str(inp), str(out), "--url", url, "--shard-size", "10", "--json")
    assert run_cli(capsys, *args)[0] == 0
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    inp.write_text('{"id": "new", "messages": [{"role": "user", "content": "first"}]}\n'
                   + inp.read_text())
    code, err = run_cli(capsys, *args)
    assert code == 1, err
    assert f"error: {inp}: lines 1-10 (shard 0): shard-000000.jsonl was made from other " \
           "lines" in err and "\n    fix: rerun with --redo-changed" in err, err
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before
    code, err = run_cli(capsys, *args, "--redo-changed")
    assert code == 0, err
    ids = [r["id"] for r in records(out)]
    assert sorted(ids) == sorted(["new"] + [f"r{i}" for i in range(40)])
    manifest = check_manifest(out, 41)
    assert len(manifest["shards"]) == 5 and all(e["input_blake2b"] for e in manifest["shards"])
    assert run_cli(capsys, *args)[0] == 0  # the job is now the new input's


def test_the_same_input_under_another_path_is_the_same_job(
        sims: Sims, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A relative path, or a copy elsewhere: the job resumes (before: refused as another job)."""
    url = sims.start("--max-running-requests", "8")
    inp = write_input(tmp_path / "in.jsonl", 30)
    out = tmp_path / "out"
    assert run_cli(capsys, str(inp), str(out), "--url", url, "--shard-size", "10")[0] == 0
    shards = {p.name: p.stat().st_mtime_ns for p in out.glob("shard-*")}
    monkeypatch.chdir(tmp_path)
    copy = tmp_path / "elsewhere" / "prompts.jsonl"
    copy.parent.mkdir()
    copy.write_bytes(inp.read_bytes())
    for path in ("in.jsonl", str(copy)):
        code, err = run_cli(capsys, path, str(out), "--url", url, "--shard-size", "10")
        assert code == 0, err
    assert {p.name: p.stat().st_mtime_ns for p in out.glob("shard-*")} == shards
    check_manifest(out, 30)


def test_an_id_moved_into_an_unfinished_shard_is_not_written_twice(
        sims: Sims, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A run killed with shard 1 unfinished (shard 3 committed), then shard 1's first line
    edited to take r35's id: sending it would give r35 a second record, so the rerun is refused
    before committing anything; --redo-changed redoes shard 3, where r35 is now a repeat."""
    url = sims.start("--max-running-requests", "8")
    inp = write_input(tmp_path / "in.jsonl", 40)
    out = tmp_path / "out"
    args = (str(inp), str(out), "--url", url, "--shard-size", "10")
    assert run_cli(capsys, *args)[0] == 0
    (out / "shard-000001.jsonl").unlink()  # as if killed before shard 1's commit
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["shards"] = [e for e in manifest["shards"] if e["name"] != "shard-000001.jsonl"]
    manifest["complete"] = False
    (out / "manifest.json").write_text(json.dumps(manifest))
    lines = inp.read_text().splitlines(keepends=True)
    lines[10] = lines[10].replace('"r10"', '"r35"')
    inp.write_text("".join(lines))
    code, err = run_cli(capsys, *args)
    assert code == 1, err
    assert "lines 31-40 (shard 3): line 36 has id 'r35', which a line earlier in the input " \
           "now also has, yet shard-000003.jsonl holds this line's record" in err, err
    assert not (out / "shard-000001.jsonl").exists()
    code, err = run_cli(capsys, *args, "--redo-changed")
    assert code == 101, err  # r35's second line: a repeated id, a failure
    ids = [r["id"] for r in records(out)]
    assert sorted(ids) == sorted(f"r{i}" for i in range(40) if i != 10)
    fails = [json.loads(line) for line in (out / "failures.jsonl").read_text().splitlines()]
    assert [(f["id"], f["line"]) for f in fails] == [("r35", 36)]
    check_manifest(out, 39)


# ---- one writer per S3 output: a lease object, conditional PUTs (issue 24, item 6) ----------
def lease_body(s3: Any, key: str) -> dict[str, Any] | None:
    try:
        return dict(json.loads(s3.get_object(Bucket="jobs", Key=key)["Body"].read()))
    except s3.exceptions.NoSuchKey:
        return None


def test_a_second_run_on_the_same_s3_output_is_refused(
        sims: Sims, tmp_path: Path, s3_server: str, s3: Any) -> None:
    """While a run writes s3://jobs/run/, a second one is refused before it touches the prefix
    (before: it ran beside the first and aborted the multipart uploads in flight there)."""
    url = sims.start("--max-running-requests", "4", decode="60")
    inp = write_input(tmp_path / "in.jsonl", 300)
    argv = cli(str(inp), "s3://jobs/run/", "--url", url, "--s3-endpoint", s3_server,
               "--shard-size", "50", "--json")
    first = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while s3.list_objects_v2(Bucket="jobs", Prefix="run/shard-")["KeyCount"] == 0:
            assert first.poll() is None and time.monotonic() < deadline, first.stderr
            time.sleep(0.05)
        # stands for the first run's upload in flight (it started its run's aborts long ago)
        in_flight = s3.create_multipart_upload(Bucket="jobs", Key="run/shard-000099.jsonl")
        second = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        assert first.wait(120) == 0
    finally:
        first.kill()
        first.wait()
    assert second.returncode == 1, second.stderr
    assert "error: s3://jobs/run/: .lease: another sglang-fleet generate is writing here " \
           f"(host {socket.gethostname()}, pid {first.pid};" in second.stderr, second.stderr
    assert "\n    fix: wait for it or stop it" in second.stderr
    uploads = s3.list_multipart_uploads(Bucket="jobs", Prefix="run/").get("Uploads", [])
    assert [u["UploadId"] for u in uploads] == [in_flight["UploadId"]]
    assert lease_body(s3, "run/.lease") is None  # given back at the end
    manifest = json.loads(s3.get_object(Bucket="jobs", Key="run/manifest.json")["Body"].read())
    assert manifest["complete"] and manifest["records"] == 300


def test_an_s3_lease_is_renewed_and_taken_over_only_once_expired(
        s3_server: str, s3: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Live (renewed past its time to live): refused; no longer renewed and expired: taken
    over, and the old holder stops writing and leaves the new lease alone."""
    from sglang_fleet_generate import lease
    from sglang_fleet_generate.errors import GenerateError
    from sglang_fleet_generate.store import S3Store

    monkeypatch.setattr(lease, "LEASE_TTL_S", 3.0)
    first = S3Store("s3://jobs/run/", s3)
    etag = s3.head_object(Bucket="jobs", Key="run/.lease")["ETag"]
    time.sleep(4.5)
    assert s3.head_object(Bucket="jobs", Key="run/.lease")["ETag"] != etag  # renewed
    with pytest.raises(GenerateError, match="another sglang-fleet generate is writing here"):
        S3Store("s3://jobs/run/", s3)
    first.lease.stop.set()  # as a stalled process: no renewal from now on
    assert first.lease.thread is not None
    first.lease.thread.join()
    time.sleep(4.5)
    second = S3Store("s3://jobs/run/", s3)
    owner = lease_body(s3, "run/.lease")
    assert owner is not None and owner["owner"] == second.lease.owner["owner"]
    with pytest.raises(GenerateError, match="this run lost the output's lease"):
        first.put_bytes(b"{}", "manifest.json")
    assert s3.list_objects_v2(Bucket="jobs", Prefix="run/manifest")["KeyCount"] == 0
    first.close()
    assert lease_body(s3, "run/.lease") == owner  # not the old holder's to give back
    second.close()
    assert lease_body(s3, "run/.lease") is None


def test_an_s3_lease_of_another_host_waits_one_of_a_dead_local_process_does_not(
        s3_server: str, s3: Any, tmp_path: Path) -> None:
    """A run killed on this host (kill -9) is run again at once; another host's lease holds
    until it expires. Workers' shares each have their own lease."""
    from sglang_fleet_generate.errors import GenerateError
    from sglang_fleet_generate.store import S3Store

    s3.put_object(Bucket="jobs", Key="other/.lease", IfNoneMatch="*", Body=json.dumps(
        {"owner": "x", "host": "gpu-client-7", "pid": 4242, "ttl_s": 600}).encode())
    with pytest.raises(GenerateError, match=r"\(host gpu-client-7, pid 4242; its lease"):
        S3Store("s3://jobs/other/", s3)
    script = ("import boto3, os, sys\nfrom sglang_fleet_generate.store import S3Store\n"
              f"S3Store('s3://jobs/dead/', boto3.client('s3', endpoint_url={s3_server!r}))\n"
              "os._exit(0)\n")  # no release: as a run killed with SIGKILL
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60)
    assert lease_body(s3, "dead/.lease") is not None
    S3Store("s3://jobs/dead/", s3).close()
    shares = [S3Store("s3://jobs/split/", s3, share=(k, 2)) for k in (1, 2)]
    keys = {o["Key"] for o in s3.list_objects_v2(Bucket="jobs", Prefix="split/")["Contents"]}
    assert keys == {"split/.lease-1-of-2", "split/.lease-2-of-2"}
    with pytest.raises(GenerateError, match=r"split/: \.lease-2-of-2: another"):
        S3Store("s3://jobs/split/", s3, share=(2, 2))
    for store in shares:
        store.close()


# ---- https:// behind a private CA: --ca-bundle and SSL_CERT_FILE ----------------------------
def private_ca(tmp: Path) -> tuple[Path, Path, Path]:
    """A CA of the test's own and a certificate it signed for 127.0.0.1: (ca.pem, cert, key)."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)

    def cert(subject: str, key: Any, issuer: str, signer: Any, ca: bool) -> Any:
        builder = (x509.CertificateBuilder()
                   .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
                   .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)]))
                   .public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(minutes=5))
                   .not_valid_after(now + datetime.timedelta(days=1))
                   .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
        if ca:
            builder = builder.add_extension(x509.KeyUsage(
                digital_signature=True, content_commitment=False, key_encipherment=False,
                data_encipherment=False, key_agreement=False, key_cert_sign=True, crl_sign=True,
                encipher_only=False, decipher_only=False), critical=True)
        else:
            import ipaddress
            builder = builder.add_extension(x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        return builder.sign(signer, hashes.SHA256())

    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca = cert("sglang-fleet test CA", ca_key, "sglang-fleet test CA", ca_key, True)
    leaf = cert("127.0.0.1", key, "sglang-fleet test CA", ca_key, False)
    paths = tmp / "ca.pem", tmp / "router.pem", tmp / "router.key"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(leaf.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return paths


@pytest.fixture
def tls_router(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A router answering over TLS with a certificate of a private CA: (its URL, ca.pem)."""
    from tests.conftest import Origin

    ca, cert, key = private_ca(tmp_path)
    json_type = {"Content-Type": "application/json"}
    router = Origin({
        "/v1/models": (200, json_type, json.dumps({"data": [{"id": "m"}]}).encode()),
        "/v1/chat/completions": (200, json_type, json.dumps(
            {"choices": [{"message": {"content": "4"}, "finish_reason": "stop"}],
             "usage": {}}).encode())}, tls=(cert, key))
    yield router.url, ca
    router.close()


def test_a_router_behind_a_private_ca_is_reached_with_ca_bundle(
        tls_router: tuple[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    from sglang_fleet.cli import main

    url, ca = tls_router
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    inp = write_input(tmp_path / "in.jsonl", 3)
    # certifi's CAs alone do not know the site's CA: the first request fails on the certificate.
    assert main(["generate", str(inp), str(tmp_path / "untrusted"), "--url", url,
                 "--retries", "0", "--json"]) == 1
    assert "CERTIFICATE_VERIFY_FAILED" in capsys.readouterr().err
    assert main(["generate", str(inp), str(tmp_path / "out"), "--url", url, "--json",
                 "--ca-bundle", str(ca)]) == 0, capsys.readouterr().err
    assert sorted(r["id"] for r in records(tmp_path / "out")) == ["r0", "r1", "r2"]


def test_a_router_behind_a_private_ca_is_reached_with_ssl_cert_file(
        tls_router: tuple[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    from sglang_fleet.cli import main

    url, ca = tls_router
    monkeypatch.setenv("SSL_CERT_FILE", str(ca))
    inp = write_input(tmp_path / "in.jsonl", 2)
    assert main(["generate", str(inp), str(tmp_path / "out"), "--url", url, "--json",
                 "--retries", "0"]) == 0, capsys.readouterr().err
    assert len(records(tmp_path / "out")) == 2


@pytest.mark.parametrize("what", ["missing", "directory", "not PEM"])
@pytest.mark.parametrize("where", ["--ca-bundle", "SSL_CERT_FILE"])
def test_a_bad_ca_bundle_is_one_error_and_a_fix(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        what: str, where: str) -> None:
    from sglang_fleet.cli import main

    bad = {"missing": tmp_path / "none.pem", "directory": tmp_path,
           "not PEM": write_input(tmp_path / "in.jsonl", 1)}[what]
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    flags = ["--ca-bundle", str(bad)] if where == "--ca-bundle" else []
    if where == "SSL_CERT_FILE":
        monkeypatch.setenv("SSL_CERT_FILE", str(bad))
    inp = write_input(tmp_path / "in.jsonl", 1)
    out = tmp_path / "out"
    assert main(["generate", str(inp), str(out), "--url", "https://127.0.0.1:9", *flags]) == 1
    err = capsys.readouterr().err
    first, fix = err.rstrip("\n").split("\n")
    assert first.startswith(f"error: {where}: {bad}: "), err
    assert fix.startswith("    fix: ") and "Traceback" not in err
    assert not out.exists()  # said before the output is touched
