"""The simulator as the benchmarks start it: on loopback, with an nvidia-smi that answers like one
B200, no loading time and near-zero decode time, so what is measured is the client and HTTP.

    proc = start_sim(free_port(), workdir, "--max-running-requests", "256")
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_sim(port: int, workdir: Path, *flags: str) -> subprocess.Popen[bytes]:
    """Start it with ``flags`` and wait until /health answers 200 (60 s at most)."""
    smi = workdir / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho '0, NVIDIA B200, 183359'\n")
    smi.chmod(0o755)
    env = {**os.environ, "PATH": f"{workdir}:{os.environ['PATH']}",
           "SGLANG_SIM_LOAD_SECONDS": "0", "SGLANG_SIM_DECODE_STEPS_PER_SECOND": "1000000",
           "SGLANG_SIM_PREFILL_TOKENS_PER_SECOND": "1000000000"}
    argv = [sys.executable, "-m", "sglang_sim.launch_server",
            "--model-path", str(REPO / "lab" / "models" / "qwen3.6-27b"),
            "--host", "127.0.0.1", "--port", str(port), *flags]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.1)
    proc.kill()
    raise SystemExit("the simulator did not become healthy")
