"""smg in front of one simulator over HTTP and in front of one over gRPC (``--smg-grpc-mode``,
``grpc://`` worker, the tokenizer fetched from the worker and the reasoning parsed at the
gateway), on loopback: ``--concurrency`` chat requests at a time for ``--seconds`` (wrk,
``--latency``), straight to the HTTP worker and through smg to each: requests/s, p50, p99 and
what smg adds at p99 over the direct run.

    uv run python bench/grpc_gateway.py [--seconds 10] [--concurrency 4] [--repeats 2]

What it measures is the gateway and the transport: neither simulator pays what SGLang's own
tokenizer costs a worker (the HTTP one does not tokenize; the gRPC one reads the ids back to
text to compose its answer), so the worker-side tokenization gRPC moves to the gateway, its
main gain, is not in these figures. Every figure is this machine's (2 cores shared by the
simulators, smg and wrk).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import httpx
from routers import BODY, MODEL, Load, measure
from sglang_sim.ports import BENCHES, free_port
from simserver import grpc_free_port, start_grpc_sim, start_sim

from sglang_fleet.fleet.inventory import ROUTER_PACKAGES
from sglang_fleet_lab.gateways import smg_in_front_of

LUA = f"""wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '{BODY}'
"""
FLAGS = ("--max-running-requests", "64", "--reasoning-parser", "qwen3")


class Gateway:
    """smg launched in front of one worker URL (http:// or grpc://), until stopped."""

    def __init__(self, worker: str, work: Path) -> None:
        self.port = free_port(BENCHES)
        self.url = f"http://127.0.0.1:{self.port}"
        log = (work / f"smg-{self.port}.log").open("w")
        self.proc = subprocess.Popen(smg_in_front_of(worker, self.port, "--policy",
                                                     "round_robin"),
                                     stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 90
        while not self._answers():
            if time.monotonic() > deadline or self.proc.poll() is not None:
                self.stop()
                raise SystemExit(f"smg in front of {worker} did not answer a chat request")
            time.sleep(0.5)

    def _answers(self) -> bool:
        try:
            return httpx.post(f"{self.url}/v1/chat/completions", content=BODY, timeout=10,
                              headers={"content-type": "application/json"},
                              trust_env=False).status_code == 200
        except httpx.HTTPError:
            return False

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(60)


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    runs: dict[str, list[Load]] = {"direct to the worker": [], "smg, HTTP worker": [],
                                   "smg, gRPC worker": []}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        script = work / "chat.lua"
        script.write_text(LUA)
        http_port, grpc_port = free_port(BENCHES), grpc_free_port()
        sims = [start_sim(http_port, work, *FLAGS), start_grpc_sim(grpc_port, work, *FLAGS)]
        try:
            direct = f"http://127.0.0.1:{http_port}"
            workers = {"smg, HTTP worker": direct,
                       "smg, gRPC worker": f"grpc://127.0.0.1:{grpc_port}"}
            for r in range(args.repeats):
                runs["direct to the worker"].append(
                    measure(direct, args.concurrency, args.seconds, script))
                order = list(workers) if r % 2 == 0 else list(workers)[::-1]
                for name in order:  # alternating, so neither always runs first
                    gateway = Gateway(workers[name], work)
                    try:
                        runs[name].append(measure(gateway.url, args.concurrency, args.seconds,
                                                  script))
                    finally:
                        gateway.stop()
        finally:
            for sim in sims:
                sim.terminate()
                sim.wait(60)
    print(table(runs, args))


def table(runs: dict[str, list[Load]], args: argparse.Namespace) -> str:
    med = statistics.median
    base99 = med(x.p99_ms for x in runs["direct to the worker"])
    rows = [f"smg {ROUTER_PACKAGES['smg']}, 1 worker, {args.concurrency} chat requests at a time "
            f"(8 tokens each), {args.seconds:.0f} s; medians of {args.repeats} runs; model "
            f"{Path(MODEL).name}",
            f"{'':<22}{'req/s':>7}{'p50 ms':>8}{'p99 ms':>8}{'+p99 ms':>9}{'failed':>8}"]
    for name, loads in runs.items():
        p99 = med(x.p99_ms for x in loads)
        added = f"{p99 - base99:>+9.1f}" if name != "direct to the worker" else f"{'':>9}"
        rows.append(f"{name:<22}{med(x.rps for x in loads):>7.0f}"
                    f"{med(x.p50_ms for x in loads):>8.1f}{p99:>8.1f}{added}"
                    f"{sum(x.failed for x in loads):>8}")
    return "\n".join(rows)


if __name__ == "__main__":
    main()
