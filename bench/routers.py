"""smg (the default gateway) beside sglang-router 0.3.2, in front of the same simulators on
loopback, each started as its unit starts it (``sglang_fleet_lab.gateways.LoopbackRouter``):

1. added latency: 1 worker, ``--concurrency`` requests at a time for ``--seconds``, through
   each router and straight to the worker (wrk, ``--latency``): requests/s, p50 and p99;
2. throughput: every worker behind the router, ``--concurrency`` x 8 at a time;
3. a roll: each worker in turn taken out of the router (``Router.remove``), drained, restarted,
   put back (``Router.add``) and waited for until the router sees it healthy, with the
   product's cutover calls, under a light load through the router: the seconds each was out,
   and the load's failed requests.

    uv run python bench/routers.py [--workers 3] [--seconds 10] [--concurrency 4] [--repeats 2]

It prints a table; every figure is this machine's (2 cores shared by the simulators, the
router and wrk: the routers' own ceilings are far higher). A request counts as failed when it
got a non-2xx answer, a connection or socket error, or no answer in ``WRK_TIMEOUT`` seconds;
when the roll's load saw any, wrk's error line and the router's warnings go to stderr.
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from sglang_sim.ports import BENCHES, free_port
from simserver import start_sim

from sglang_fleet.fleet.inventory import ROUTER_PACKAGES
from sglang_fleet.fleet.router_api import drained
from sglang_fleet_lab.gateways import LoopbackRouter, loopback_config

# wrk's own default (2 s) would count a request slowed by a busy machine as failed; a roll's
# failure is an error answer or a request that never ends, so the bound is generous.
WRK_TIMEOUT = 30
KEY, ADMIN = "bench-client-key-0123", "bench-admin-key-01234"
MODEL = str(Path(__file__).resolve().parent.parent / "lab" / "models" / "qwen3.6-27b")
BODY = json.dumps({"model": MODEL, "max_tokens": 8,
                   "messages": [{"role": "user", "content": "hi"}]})
LUA = f"""wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer {KEY}"
wrk.body = '{BODY}'
"""


@dataclass
class Load:
    """What wrk measured."""

    rps: float
    p50_ms: float
    p99_ms: float
    failed: int  # non-2xx answers, socket errors and requests unanswered in WRK_TIMEOUT
    errors: str  # wrk's lines about them ("" when none failed)


def _ms(text: str) -> float:
    value, unit = re.fullmatch(r"([0-9.]+)(us|ms|s|m)", text).groups()  # type: ignore[union-attr]
    return float(value) * {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 6e4}[unit]


def wrk(url: str, concurrency: int, seconds: float, script: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(["wrk", "-t", "1", "-c", str(concurrency), "-d", f"{seconds:.0f}s",
                             "--timeout", f"{WRK_TIMEOUT}s", "--latency", "-s", str(script),
                             f"{url}/v1/chat/completions"],
                            stdout=subprocess.PIPE, text=True)


def read(proc: subprocess.Popen[str]) -> Load:
    out, _ = proc.communicate()
    if proc.returncode:
        raise SystemExit(f"wrk failed: {out}")
    p50 = re.search(r"^\s+50%\s+(\S+)", out, re.M)
    p99 = re.search(r"^\s+99%\s+(\S+)", out, re.M)
    rps = re.search(r"^Requests/sec:\s+([0-9.]+)", out, re.M)
    if not (p50 and p99 and rps):
        raise SystemExit(f"wrk printed no latency distribution:\n{out}")
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    errors = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)",
                       out)
    failed = int(non2xx.group(1)) if non2xx else 0
    failed += sum(int(g) for g in errors.groups()) if errors else 0
    said = "\n".join(m.group(0) for m in (non2xx, errors) if m)
    return Load(float(rps.group(1)), _ms(p50.group(1)), _ms(p99.group(1)), failed, said)


def measure(url: str, concurrency: int, seconds: float, script: Path) -> Load:
    return read(wrk(url, concurrency, seconds, script))


class Workers:
    """Simulators with the client key, on fixed ports (a roll restarts one on its port)."""

    def __init__(self, n: int, work: Path) -> None:
        self.work = work
        self.ports = [free_port(BENCHES) for _ in range(n)]
        self.procs = [self._start(port) for port in self.ports]

    def _start(self, port: int) -> subprocess.Popen[bytes]:
        return start_sim(port, self.work, "--api-key", KEY, "--max-running-requests", "64")

    @property
    def urls(self) -> list[str]:
        return [f"http://127.0.0.1:{port}" for port in self.ports]

    def restart(self, i: int) -> None:
        self.procs[i].terminate()
        self.procs[i].wait(60)
        self.procs[i] = self._start(self.ports[i])

    def stop(self) -> None:
        for proc in self.procs:
            proc.terminate()
            proc.wait(60)


def roll(gateway: LoopbackRouter, workers: Workers) -> list[float]:
    """Each worker out, drained, restarted, back and healthy: its seconds out."""
    out = []
    for i, url in enumerate(workers.urls):
        tic = time.monotonic()
        gateway.api.remove(url)
        drained(url, 60)
        workers.restart(i)
        gateway.api.add(url)
        gateway.api.wait_healthy(url, 120)
        out.append(time.monotonic() - tic)
    return out


@dataclass
class Result:
    """One router's run: 1 worker, every worker, and a roll of them."""

    one: Load
    many: Load
    out_s: list[float]  # each worker's seconds out of the router in the roll
    roll_failed: int  # the light load's failed requests during the roll


def bench(package: str, workers: Workers, args: argparse.Namespace, script: Path,
          work: Path) -> Result:
    first = workers.urls[:1]
    # The deploy's health checks (every 5 s, 3 failures, 2 successes), round robin.
    config = loopback_config(package, KEY, ADMIN, policy="round_robin", health_interval=5,
                             health_failures=3, health_successes=2)
    with LoopbackRouter(config, first, work) as gateway:
        gateway.api.wait_healthy(first[0], 60)
        one = measure(config.url, args.concurrency, args.seconds, script)
    config = loopback_config(package, KEY, ADMIN, policy="round_robin", health_interval=5,
                             health_failures=3, health_successes=2)
    with LoopbackRouter(config, workers.urls, work) as gateway:
        for url in workers.urls:
            gateway.api.wait_healthy(url, 60)
        many = measure(config.url, args.concurrency * 8, args.seconds, script)
        load = wrk(config.url, 2, 3600, script)
        try:
            out = roll(gateway, workers)
        finally:
            load.send_signal(signal.SIGINT)  # wrk stops and prints what it measured
        during = read(load)
    if during.failed:
        print(f"{package}: {during.failed} failed in the roll\n{during.errors}\n"
              f"{warnings(gateway.log)}", file=sys.stderr)
    return Result(one, many, out, during.failed)


def warnings(log: Path) -> str:
    """The router's WARN and ERROR lines, without colour codes."""
    plain = re.sub(r"\x1b\[[0-9;]*m", "", log.read_text(errors="replace"))
    return "\n".join(line for line in plain.splitlines() if " WARN " in line or " ERROR " in line)


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    if args.workers < 2:
        ap.error("--workers: at least 2 (a roll takes one out while the others serve)")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        script = work / "chat.lua"
        script.write_text(LUA)
        workers = Workers(args.workers, work)
        try:
            direct = [measure(workers.urls[0], args.concurrency, args.seconds, script)
                      for _ in range(args.repeats)]
            runs: dict[str, list[Result]] = {p: [] for p in ROUTER_PACKAGES}
            for r in range(args.repeats):  # alternating, so neither always runs first
                order = list(ROUTER_PACKAGES) if r % 2 == 0 else list(ROUTER_PACKAGES)[::-1]
                for package in order:
                    runs[package].append(bench(package, workers, args, script, work))
        finally:
            workers.stop()
    print(table(direct, runs, args))


def table(direct: list[Load], runs: dict[str, list[Result]], args: argparse.Namespace) -> str:
    med = statistics.median
    base99 = med(d.p99_ms for d in direct)
    rows = [f"1 worker at {args.concurrency} requests at a time, {args.workers} workers at "
            f"{args.concurrency * 8}, {args.seconds:.0f} s each; medians of {args.repeats} runs; "
            "a roll of the workers under 2 requests at a time",
            f"{'':<22}{'req/s':>7}{'p50 ms':>8}{'p99 ms':>8}{'+p99 ms':>9}"
            f"{'req/s N':>9}{'p99 N':>7}{'out s/worker':>14}{'max':>6}{'failed':>8}",
            f"{'direct to the worker':<22}{med(d.rps for d in direct):>7.0f}"
            f"{med(d.p50_ms for d in direct):>8.1f}{base99:>8.1f}"]
    for package, results in runs.items():
        out = [s for r in results for s in r.out_s]
        p99 = med(r.one.p99_ms for r in results)
        rows.append(f"{package + ' ' + ROUTER_PACKAGES[package]:<22}"
                    f"{med(r.one.rps for r in results):>7.0f}"
                    f"{med(r.one.p50_ms for r in results):>8.1f}{p99:>8.1f}{p99 - base99:>+9.1f}"
                    f"{med(r.many.rps for r in results):>9.0f}"
                    f"{med(r.many.p99_ms for r in results):>7.1f}{med(out):>14.1f}"
                    f"{max(out):>6.1f}{sum(r.roll_failed for r in results):>8}")
    return "\n".join(rows)


if __name__ == "__main__":
    main()
