#!/usr/bin/env python3
"""How fast ``sglang-fleet generate`` runs against the SGLang simulator, and in how much memory.

    uv run python bench/generate.py [--lines 20000] [--rss-lines 1000000] [--max-running 64]

Starts the simulator on loopback with decoding made near-instant (so the figure is the
client's, not a simulated GPU's) and moto's S3 server on loopback, then runs the command as a
user would (a subprocess) three times: local output, S3 input and output, and a long streamed
input whose peak RSS is the memory figure. Prints a table. The goal (issue 17): at least 1,000
completions/s with and without S3, and under 300 MB RSS for a 1,000,000-line input. The
client's CPU time per completion is printed too, and the simulator's: on a shared machine they
say more than the rate (the two share the cores, so their sum bounds the rate: 2 cores / 2 ms
per completion = 1,000/s), and the load average before each run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from sglang_sim.ports import BENCHES, free_port
from simserver import cpu_seconds, run_client, start_sim, tree, write_input

GOAL_RATE = 1000
GOAL_RSS_MB = 300


def wait(url: str) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            httpx.get(url, timeout=1)
            return
        except httpx.HTTPError:
            time.sleep(0.1)
    raise SystemExit(f"{url} did not answer")


def start_s3(port: int) -> subprocess.Popen[bytes]:
    moto = Path(sys.executable).with_name("moto_server")
    proc = subprocess.Popen([str(moto), "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait(f"http://127.0.0.1:{port}")
    return proc


def run(argv: list[str], env: dict[str, str]) -> tuple[dict[str, object], float, float, float]:
    """(final JSON line, wall seconds, peak RSS in MB, CPU seconds) of one generate run."""
    done = run_client([sys.executable, "-m", "sglang_fleet.cli", "generate", *argv, "--json"],
                      env)
    return json.loads(done.out.splitlines()[-1]), done.wall_s, done.rss_mb, done.cpu_s


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lines", type=int, default=20000,
                    help="lines for the rate runs (0: none)")
    ap.add_argument("--rss-lines", type=int, default=1_000_000,
                    help="lines for the RSS run (0: none)")
    ap.add_argument("--max-running", type=int, default=64,
                    help="the simulator's --max-running-requests (the client's concurrency)")
    args = ap.parse_args()
    sim_port, s3_port = free_port(BENCHES), free_port(BENCHES)
    s3_url = f"http://127.0.0.1:{s3_port}"
    env = {**os.environ, "AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench",
           "AWS_DEFAULT_REGION": "us-east-1"}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        procs = [start_sim(sim_port, work, "--max-running-requests", str(args.max_running),
                           "--reasoning-parser", "qwen3"), start_s3(s3_port)]
        try:
            import boto3

            s3 = boto3.client("s3", endpoint_url=s3_url, region_name="us-east-1",
                              aws_access_key_id="bench", aws_secret_access_key="bench")
            s3.create_bucket(Bucket="bench")
            small = write_input(work / "in.jsonl", args.lines)
            s3.upload_file(str(small), "bench", "in.jsonl")
            url = ["--url", f"http://127.0.0.1:{sim_port}"]
            cases = [("local in, local out", args.lines, [str(small), str(work / "out1"), *url]),
                     ("S3 in, S3 out", args.lines, ["s3://bench/in.jsonl", "s3://bench/out/",
                                                    *url, "--s3-endpoint", s3_url])]
            cases = cases if args.lines else []
            if args.rss_lines:
                big = write_input(work / "big.jsonl", args.rss_lines)
                cases.append((f"{args.rss_lines:,}-line input", args.rss_lines,
                              [str(big), str(work / "out3"), *url]))
            for name, lines, argv in cases:
                load = os.getloadavg()[0]
                sim = tree(procs[0].pid)
                sim_cpu = cpu_seconds(sim)
                summary, wall, rss, cpu = run(argv, env)
                sim_cpu = cpu_seconds(sim) - sim_cpu
                assert summary["records"] == lines, summary
                rows.append((name, lines, summary["completions_per_s"], wall, rss,
                             1000 * cpu / lines, 1000 * sim_cpu / lines, load))
        finally:
            for proc in procs:
                proc.terminate()
                proc.wait(30)
    print(f"{'case':<26}{'lines':>10}{'compl/s':>10}{'wall s':>9}{'RSS MB':>9}"
          f"{'CPU ms/compl':>14}{'sim ms/compl':>14}{'load':>6}   (cores: {os.cpu_count()}, "
          f"concurrency {args.max_running})")
    for name, lines, rate, wall, rss, cpu_ms, sim_ms, load in rows:
        print(f"{name:<26}{lines:>10,}{rate:>10.0f}{wall:>9.1f}{rss:>9.0f}{cpu_ms:>14.2f}"
              f"{sim_ms:>14.2f}{load:>6.1f}")
    slow = min(float(str(r[2])) for r in rows)
    peak = max(float(r[4]) for r in rows)
    print(f"slowest {slow:.0f} completions/s ({'meets' if slow >= GOAL_RATE else 'BELOW'} "
          f"{GOAL_RATE}); peak RSS {peak:.0f} MB ({'meets' if peak < GOAL_RSS_MB else 'ABOVE'} "
          f"{GOAL_RSS_MB})")
    return 0 if slow >= GOAL_RATE and peak < GOAL_RSS_MB else 1


if __name__ == "__main__":
    sys.exit(main())
