#!/usr/bin/env python3
"""How many short requests per second the SGLang simulator sustains on this machine.

    uv run python bench/sim_throughput.py [--seconds 10] [--connections 32]

Starts the simulator on loopback with decoding made near-instant (so the figure is the
simulator's own overhead, not its simulated GPU), drives it with ``wrk`` (Debian package
``wrk``) and prints a table. The lab needs at least 2,000 requests/s so that the simulator is
never what limits a load test.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from sglang_sim.ports import BENCHES, free_port
from simserver import start_sim

TARGET_RPS = 2000
LUA = """wrk.method = "POST"
wrk.body = '{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":%d}'
wrk.headers["Content-Type"] = "application/json"
"""




def wrk(url: str, seconds: int, connections: int, script: Path | None) -> tuple[float, str, str]:
    cmd = ["wrk", "-t1", f"-c{connections}", f"-d{seconds}s", "--latency"]
    cmd += ["-s", str(script)] if script else []
    out = subprocess.run([*cmd, url], capture_output=True, text=True, check=True).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    p50 = re.search(r"50%\s+(\S+)", out).group(1)  # type: ignore[union-attr]
    p99 = re.search(r"99%\s+(\S+)", out).group(1)  # type: ignore[union-attr]
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    if errors:
        raise SystemExit(f"{errors.group(1)} failed requests against {url}")
    return rps, p50, p99


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=int, default=10)
    ap.add_argument("--connections", type=int, default=32)
    args = ap.parse_args()
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is needed: apt-get install wrk")
    port = free_port(BENCHES)
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        proc = start_sim(port, workdir, "--max-running-requests", "256",
                         "--speculative-algorithm", "NEXTN",
                         "--mamba-radix-cache-strategy", "extra_buffer",
                         "--reasoning-parser", "qwen3", "--enable-metrics")
        try:
            rows = []
            for name, path, tokens in (("chat, 4 tokens", "/v1/chat/completions", 4),
                                       ("chat, 64 tokens", "/v1/chat/completions", 64),
                                       ("health", "/health", 0)):
                script = None
                if tokens:
                    script = workdir / f"post{tokens}.lua"
                    script.write_text(LUA % tokens)
                rows.append((name, *wrk(f"http://127.0.0.1:{port}{path}", args.seconds,
                                        args.connections, script)))
        finally:
            proc.terminate()
            proc.wait(30)
    print(f"{'request':<18}{'req/s':>10}{'p50':>10}{'p99':>10}   (cores: {os.cpu_count()}, "
          f"connections: {args.connections})")
    for name, rps, p50, p99 in rows:
        print(f"{name:<18}{rps:>10.0f}{p50:>10}{p99:>10}")
    short = rows[0][1]
    verdict = "meets" if short >= TARGET_RPS else "BELOW"
    print(f"short chat requests: {short:.0f}/s {verdict} the {TARGET_RPS}/s the lab needs")
    return 0 if short >= TARGET_RPS else 1


if __name__ == "__main__":
    sys.exit(main())
