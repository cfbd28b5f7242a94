"""The host program download_model against a real S3 implementation (moto's server): one line per
failure (what, which object, the endpoint), exit 1, no traceback; a cut download resumes."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest

from tests.conftest import free_port

DOWNLOADER = "sglang_fleet.remote.download_model"
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "lab", "AWS_SECRET_ACCESS_KEY": "lab-secret",
               "AWS_DEFAULT_REGION": "us-east-1"}
SHARDS = 6
SHARD_BYTES = 24 << 20



def moto_server(port: int) -> subprocess.Popen[bytes]:
    """moto's S3 server in its own process (killing it cuts connections like an outage),
    seeded with a model: a config.json and SHARDS shards."""
    proc = subprocess.Popen([str(Path(sys.executable).with_name("moto_server")), "-H",
                             "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        _seed(port)
    except BaseException:  # a server that could not be seeded must not outlive the test
        proc.kill()
        proc.wait()
        raise
    return proc


def _seed(port: int) -> None:
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                break
        time.sleep(0.1)
    client = boto3.client("s3", endpoint_url=url, region_name="us-east-1",
                          aws_access_key_id="lab", aws_secret_access_key="lab-secret")
    client.create_bucket(Bucket="models")
    client.put_object(Bucket="models", Key="m/config.json", Body=b'{"model_type": "x"}')
    for i in range(SHARDS):
        client.put_object(Bucket="models", Key=f"m/shard-{i}.bin", Body=bytes([i]) * SHARD_BYTES)


@pytest.fixture
def s3() -> Iterator[tuple[subprocess.Popen[bytes], str, int]]:
    port = free_port()
    server = moto_server(port)
    yield server, f"http://127.0.0.1:{port}", port
    server.kill()
    server.wait()


def stage(url: str, dest: Path) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", DOWNLOADER, "s3://models/m", str(dest),
                             "--endpoint-url", url, "--workers", "4"],
                            env={**os.environ, **CREDENTIALS}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def test_unreachable_endpoint_is_one_line(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    proc = stage(url, tmp_path / "m")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1
    assert err.strip().splitlines() == [err.strip()]
    assert err.startswith(f"error: listing of s3://models/m from {url} failed: "
                          "EndpointConnectionError")
    assert "Traceback" not in out + err


def test_cut_download_says_which_object_and_resumes(
        s3: tuple[subprocess.Popen[bytes], str, int], tmp_path: Path) -> None:
    server, url, port = s3
    dest = tmp_path / "m"
    proc = stage(url, dest)
    progress = dest.with_name("m.partial") / ".sglang-fleet-manifest.json"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        if progress.is_file() and len(json.loads(progress.read_text() or "{}")
                                      .get("files", {})) >= 2:
            break
        time.sleep(0.02)
    server.kill()  # S3 goes away in the middle of the shards
    server.wait()
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, out + err
    lines = err.strip().splitlines()
    assert lines and all(line.startswith("error: download of s3://models/m/shard-") and
                         f" from {url} failed: " in line for line in lines), err
    assert "Traceback" not in err
    finished = json.loads(progress.read_text())["files"]
    kept = {name: (dest.with_name("m.partial") / name).stat().st_mtime_ns for name in finished}

    again = moto_server(port)  # the same objects at the same address
    try:
        proc = stage(url, dest)
        out, err = proc.communicate(timeout=300)
    finally:
        again.kill()
        again.wait()
    assert proc.returncode == 0, err
    assert f"{dest}: staged {SHARDS + 1} files" in out
    for name, mtime in kept.items():  # finished files were not fetched again
        assert (dest / name).stat().st_mtime_ns == mtime
    assert (dest / "shard-5.bin").stat().st_size == SHARD_BYTES
