"""The simulator as the benchmarks start it: on loopback, with an nvidia-smi that answers like one
B200, no loading time and near-zero decode time, so what is measured is the client and HTTP;
and what the benchmarks measure of it and of their clients (CPU, peak RSS, wall time).

    proc = start_sim(free_port(BENCHES), workdir, "--max-running-requests", "256")
    before = cpu_seconds(tree(proc.pid))
    with chat_sim(64) as sim:  # or: started in a scratch directory, stopped after the block
        run = run_client([..., "--url", sim.url], loopback_env())
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
from sglang_sim.ports import BENCHES, free_port

REPO = Path(__file__).resolve().parent.parent


def _command(port: int, workdir: Path, flags: tuple[str, ...]) -> tuple[list[str],
                                                                           dict[str, str]]:
    smi = workdir / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho '0, NVIDIA B200, 183359'\n")
    smi.chmod(0o755)
    env = {**os.environ, "PATH": f"{workdir}:{os.environ['PATH']}",
           "SGLANG_SIM_LOAD_SECONDS": "0", "SGLANG_SIM_DECODE_STEPS_PER_SECOND": "1000000",
           "SGLANG_SIM_PREFILL_TOKENS_PER_SECOND": "1000000000"}
    argv = [sys.executable, "-m", "sglang_sim.launch_server",
            "--model-path", str(REPO / "lab" / "models" / "qwen3.6-27b"),
            "--host", "127.0.0.1", "--port", str(port), *flags]
    return argv, env


def start_sim(port: int, workdir: Path, *flags: str) -> subprocess.Popen[bytes]:
    """Start it with ``flags`` and wait until it has bound ``port`` (its log,
    ``workdir/sim-PORT.log``, says so: an answer there could be another process's) and
    ``/health`` answers 200 (60 s at most)."""
    argv, env = _command(port, workdir, flags)
    log = workdir / f"sim-{port}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while b"Uvicorn running on" not in log.read_bytes():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise SystemExit(f"the simulator did not listen on {port}:\n"
                             f"{log.read_text()[-2000:]}")
        time.sleep(0.05)
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1,
                         trust_env=False).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.1)
    proc.kill()
    raise SystemExit("the simulator did not become healthy")


def grpc_free_port() -> int:
    """A free port for a gRPC-mode server: SGLang range-checks port + 10000 (its derived gRPC
    port), and the HTTP sidecar takes port + 1."""
    while True:
        port = free_port(BENCHES)
        with socket.socket() as sidecar:
            if port <= 55535 and sidecar.connect_ex(("127.0.0.1", port + 1)) != 0:
                return port


def start_grpc_sim(port: int, workdir: Path, *flags: str) -> subprocess.Popen[bytes]:
    """Start it in gRPC mode (``--smg-grpc-mode``, no planned warm-up) and wait for its ready
    line (60 s at most): no HTTP answers on its port."""
    argv, env = _command(port, workdir, ("--smg-grpc-mode", *flags))
    log = workdir / f"sim-{port}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, env={**env, "SMG_SGLANG_SERVICER_WARMUP": "off"},
                                stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        if b"The server is fired up and ready to roll!" in log.read_bytes():
            return proc
        time.sleep(0.1)
    proc.kill()
    raise SystemExit(f"the simulator did not start in gRPC mode:\n{log.read_text()[-2000:]}")


@dataclass(frozen=True)
class Sim:
    """A simulator running for a bench: its scratch directory, URL and processes."""

    work: Path
    url: str
    pids: list[int]  # for cpu_seconds


@contextmanager
def chat_sim(max_running: int) -> Iterator[Sim]:
    """A simulator of ``max_running`` request slots with the qwen3 reasoning parser, in a
    scratch directory, stopped on leaving the block."""
    with tempfile.TemporaryDirectory() as tmp:
        port = free_port(BENCHES)
        proc = start_sim(port, Path(tmp), "--max-running-requests", str(max_running),
                         "--reasoning-parser", "qwen3")
        try:
            yield Sim(Path(tmp), f"http://127.0.0.1:{port}", tree(proc.pid))
        finally:
            proc.terminate()
            proc.wait(30)


def loopback_env() -> dict[str, str]:
    """This environment without proxy settings, so that a client's HTTP library (httpx honours
    ``HTTP_PROXY``) talks to the loopback simulator itself, and without the ``OPENAI_*``
    settings that would point the openai package elsewhere."""
    return {k: v for k, v in os.environ.items()
            if not k.lower().endswith("_proxy") and not k.startswith("OPENAI_")}


def write_input(path: Path, lines: int) -> Path:
    """``lines`` short chat requests (ids ``q0``...), 8 tokens each, as JSONL."""
    with path.open("w") as f:
        for i in range(lines):
            f.write(json.dumps({"id": f"q{i}", "max_tokens": 8, "messages": [
                {"role": "user", "content": f"question {i}: what is {i} + {i}?"}]}) + "\n")
    return path


def tree(pid: int) -> list[int]:
    """``pid`` and its descendants (the simulator forks SGLang's scheduler and detokenizer)."""
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    kids = [int(p) for p in out.split()]
    return [pid, *(q for k in kids for q in tree(k))]


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds live processes have used (from /proc)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / tick


@dataclass(frozen=True)
class Run:
    """One client process, run to its end: its standard output and what it cost."""

    out: str
    wall_s: float
    rss_mb: float  # the process's own peak RSS
    cpu_s: float  # user + system, its own and its children's


@dataclass(frozen=True)
class Client:
    """A client process started, not yet waited for (several may run at once)."""

    argv: list[str]
    proc: subprocess.Popen[bytes]
    start: float


def launch(argv: list[str], env: dict[str, str]) -> Client:
    """Start ``argv`` with its standard output piped to the bench."""
    start = time.monotonic()
    return Client(argv, subprocess.Popen(argv, stdout=subprocess.PIPE, env=env), start)


def finish(client: Client) -> Run:
    """Read ``client``'s output to its end and reap it, measured from os.wait4 (the child's
    usage, not the bench's); a non-zero exit is the bench's error."""
    proc = client.proc
    assert proc.stdout is not None
    out = proc.stdout.read()
    proc.stdout.close()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = code = os.waitstatus_to_exitcode(status)
    wall = time.monotonic() - client.start
    if code:
        raise SystemExit(f"{' '.join(client.argv)} exited {code}")
    return Run(out.decode(), wall, usage.ru_maxrss / 1024, usage.ru_utime + usage.ru_stime)


def run_client(argv: list[str], env: dict[str, str]) -> Run:
    """Run ``argv`` to its end (launch, then finish)."""
    return finish(launch(argv, env))


def alternate(a: str, b: str, repeats: int) -> list[str]:
    """a, b, b, a, a, b, ...: each first as often as the other, give or take one, so neither
    always runs on a warmer server. Example: alternate("x", "y", 2) == ["x", "y", "y", "x"]."""
    return [c for r in range(repeats) for c in ((a, b) if r % 2 == 0 else (b, a))]
