"""Eight servers (one per GPU) against one server with ``--dp-size 8``, as the simulator runs
them on this machine: processes, memory (PSS, so shared pages count once), CPU while idle and
per request under load, and the time to ready. The simulator stands in for the GPU process only:
its figures are its own Python processes', not a real SGLang's (see the README's comparison).

    uv run python bench/dp_layout.py [--requests 800]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
from sglang_sim.ports import BENCHES, free_port
from simserver import REPO, cpu_seconds, tree

MODEL = REPO / "lab" / "models" / "qwen3.6-27b"
CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 16}


def pss_mib(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                total += int(line.split()[1])
    return total / 1024


def start(workdir: Path, flags: list[str], env: dict[str, str]) -> tuple[subprocess.Popen[bytes],
                                                                         str]:
    port = free_port(BENCHES)
    proc = subprocess.Popen([sys.executable, "-m", "sglang_sim.launch_server", "--model-path",
                             str(MODEL), "--host", "127.0.0.1", "--port", str(port), *flags],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            cwd=workdir)
    return proc, f"http://127.0.0.1:{port}"


def wait(urls: list[str]) -> None:
    deadline = time.monotonic() + 120
    for url in urls:
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.1)


def layout(name: str, servers: list[list[str]], requests: int) -> list[str]:
    with tempfile.TemporaryDirectory() as tmp:
        smi = Path(tmp) / "nvidia-smi"
        smi.write_text("#!/bin/sh\nfor i in 0 1 2 3 4 5 6 7; do "
                       "echo \"$i, NVIDIA B200, 183359\"; done\n")
        smi.chmod(0o755)
        base = {**os.environ, "PATH": f"{tmp}:{os.environ['PATH']}",
                "SGLANG_SIM_LOAD_SECONDS": "0", "SGLANG_SIM_CAPTURE_SECONDS": "0",
                "SGLANG_SIM_DECODE_STEPS_PER_SECOND": "200"}
        tic = time.monotonic()
        started = [start(Path(tmp), flags, {**base, **({"CUDA_VISIBLE_DEVICES": str(i)}
                                                         if len(servers) > 1 else {})})
                   for i, flags in enumerate(servers)]
        urls = [url for _, url in started]
        wait(urls)
        ready = time.monotonic() - tic
        try:
            time.sleep(2)
            pids = [p for proc, _ in started for p in tree(proc.pid)]
            idle0 = cpu_seconds(pids)
            time.sleep(10)
            idle = (cpu_seconds(pids) - idle0) / 10
            memory = pss_mib(pids)
            busy0, t0 = cpu_seconds(pids), time.monotonic()
            with ThreadPoolExecutor(64) as pool, httpx.Client(timeout=60) as client:
                codes = list(pool.map(lambda i: client.post(
                    f"{urls[i % len(urls)]}/v1/chat/completions", json=CHAT).status_code,
                    range(requests)))
            wall = time.monotonic() - t0
            per_request = (cpu_seconds(pids) - busy0) / requests * 1000
        finally:
            for proc, _ in started:
                proc.terminate()
            for proc, _ in started:
                proc.wait(30)
    assert codes.count(200) == requests, codes
    return [name, str(len(pids)), f"{memory:.0f}", f"{idle * 100:.1f}", f"{per_request:.2f}",
            f"{requests / wall:.0f}", f"{ready:.1f}"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=800)
    args = ap.parse_args()
    rows = [layout("8 servers, 1 GPU each", [[] for _ in range(8)], args.requests),
            layout("1 server, --dp-size 8", [["--dp-size", "8"]], args.requests)]
    head = ["layout", "processes", "PSS MiB", "idle CPU %", "CPU ms/request", "requests/s",
            "ready s"]
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    for row in [head, *rows]:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)))


if __name__ == "__main__":
    main()
