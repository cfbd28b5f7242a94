"""The site around the lab hosts, on loopback: one HTTP server for the apt repository and the
wheelhouse, and an S3 endpoint (moto's server mode) holding the lab model."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

from sglang_fleet.config import releases
from sglang_fleet_lab import aptrepo, gateways, simwheels
from sglang_fleet_lab.hosts import alive
from sglang_fleet_lab.state import HTTP_PORT, S3_BUCKET, S3_PORT, SITE_ADDRESS, STATE_DIR, Lab

# The lab runs from a checkout (a workspace member, installed editable): its model, stubs and
# the simulator it builds sit beside it there.
REPO_ROOT = Path(__file__).resolve().parents[4]
MODEL_DIR = REPO_ROOT / "lab" / "models" / "qwen3.6-27b"
MODEL_PREFIX = "qwen3.6-27b"
SHARDS, SHARD_MB = 4, 64  # staging moves real bytes: 256 MB of generated weights
S3_CREDENTIALS = {"aws_access_key_id": "lab-access-key",
                  "aws_secret_access_key": "lab-secret-key"}
WWW = STATE_DIR / "www"
# Simulator wheels the wheelhouse offers: the pinned release and the one before it (to roll),
# and the field's 0.5.12 (tests/lab/test_target_running_requests.py).
WHEEL_RELEASES = [releases.pinned(), releases.supported()[-2], "0.5.12"]


def _pidfile(name: str) -> Path:
    return STATE_DIR / f"{name}.pid"


def _start(name: str, argv: list[str]) -> None:
    log = (STATE_DIR / f"{name}.log").open("ab")
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            start_new_session=True)
    _pidfile(name).write_text(str(proc.pid))


def _wait_port(port: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex((SITE_ADDRESS, port)) == 0:
                return
        time.sleep(0.1)
    raise RuntimeError(f"nothing listens on {SITE_ADDRESS}:{port} after {timeout} s")


def _signal_group(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, sig)


def stop(timeout: float = 10) -> None:
    """Stop the site's servers: SIGTERM, then SIGKILL whatever is left after ``timeout``."""
    for name in ("http", "s3"):
        pidfile = _pidfile(name)
        if not pidfile.exists():
            continue
        pid = int(pidfile.read_text())
        _signal_group(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and alive(pid):
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
            time.sleep(0.1)
        _signal_group(pid, signal.SIGKILL)
        pidfile.unlink(missing_ok=True)  # a concurrent down may have taken it


def _shard(index: int) -> bytes:
    """A valid safetensors file of SHARD_MB with deterministic contents."""
    size = SHARD_MB << 20
    elements = (size - 4096) // 2
    header = json.dumps({f"model.layers.{index}.mlp.weight": {
        "dtype": "BF16", "shape": [elements], "data_offsets": [0, elements * 2]}}).encode()
    header += b" " * (-len(header) % 8)
    block = bytes(range(256)) * 4096
    body = (block * (elements * 2 // len(block) + 1))[:elements * 2]
    return struct.pack("<Q", len(header)) + header + body


def seed_s3(lab: Lab) -> None:
    import boto3

    s3 = boto3.client("s3", endpoint_url=lab.s3_url, region_name="us-east-1", **S3_CREDENTIALS)
    s3.create_bucket(Bucket=S3_BUCKET)
    names = [f"model-{i + 1:05d}-of-{SHARDS:05d}.safetensors" for i in range(SHARDS)]
    index = {"metadata": {"total_size": SHARDS * ((SHARD_MB << 20) - 4096)},
             "weight_map": {f"model.layers.{i}.mlp.weight": n for i, n in enumerate(names)}}
    # The tokenizer too, as a model repository has it: a gRPC-mode server's gate tokenizes
    # its smoke with it, and smg fetches it from the server (GetTokenizer).
    files = {name: (MODEL_DIR / name).read_bytes()
             for name in ("config.json", "tokenizer.json", "tokenizer_config.json")}
    files["model.safetensors.index.json"] = json.dumps(index, indent=2).encode()
    for key, body in files.items():
        s3.put_object(Bucket=S3_BUCKET, Key=f"{MODEL_PREFIX}/{key}", Body=body)
    for i, name in enumerate(names):
        s3.put_object(Bucket=S3_BUCKET, Key=f"{MODEL_PREFIX}/{name}", Body=_shard(i))


def build_wheelhouse(releases: list[str]) -> None:
    """A simulator wheel per SGLang release, each versioned as the release it imitates, and the
    real gateways (smg, sglang-router) the product pins, as a site's wheelhouse holds them."""
    wheels = WWW / "wheels"
    shutil.rmtree(wheels, ignore_errors=True)
    wheels.mkdir(parents=True)
    source = simwheels.source_id()
    for release in releases:
        simwheels.offer(release, source, wheels)
    gateways.wheels(wheels)


def start(lab: Lab) -> None:
    """Build the repository and wheelhouse, start the servers, seed S3 (idempotent)."""
    stop()
    WWW.mkdir(parents=True, exist_ok=True)
    aptrepo.build(WWW, lab.repo_url, os.uname().release)
    build_wheelhouse(WHEEL_RELEASES)
    _start("http", [sys.executable, "-m", "http.server", "--bind", SITE_ADDRESS,
                    "--directory", str(WWW), str(HTTP_PORT)])
    moto = Path(sys.executable).with_name("moto_server")
    _start("s3", [str(moto), "-H", SITE_ADDRESS, "-p", str(S3_PORT)])
    _wait_port(HTTP_PORT)
    _wait_port(S3_PORT)
    seed_s3(lab)


def s3_down() -> None:
    """The S3 endpoint goes away, as in an outage: its server is killed, connections cut."""
    pidfile = _pidfile("s3")
    if pidfile.exists():
        _signal_group(int(pidfile.read_text()), signal.SIGKILL)
        pidfile.unlink()


def s3_up(lab: Lab) -> None:
    """The S3 endpoint back, with the lab model (as after ``s3_down``)."""
    moto = Path(sys.executable).with_name("moto_server")
    _start("s3", [str(moto), "-H", SITE_ADDRESS, "-p", str(S3_PORT)])
    _wait_port(S3_PORT)
    seed_s3(lab)
