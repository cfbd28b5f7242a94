#!/usr/bin/env python3
"""``sglang-fleet generate`` beside the loop a user would write with the official ``openai``
package (bench/openai_client.py: ``AsyncOpenAI`` and an ``asyncio.Semaphore``), on one
simulator server, the same prompts and the same concurrency.

    uv run python bench/generate_vs_openai.py [--prompts 20000] [--concurrency 64] [--repeats 3]

Starts the simulator on loopback with decoding made near-instant (bench/simserver.py, so the
figures are the clients'), its ``--max-running-requests`` the concurrency (which generate
reads from ``/server_info``, and the openai loop is given). Each client runs in its own
process, as a user would run it, alternating generate, openai, openai, generate, ... so neither
always runs on a warmer server. For each run: completions/s over the process's whole life
(start-up included), its CPU seconds per completion and peak RSS (os.wait4: the child's own),
the simulator's CPU per completion (from /proc, over its processes) and the 1-minute load
average before the run; then the median of the repeats. On a shared machine the CPU per
completion says more than the rate: the clients and the simulator share the cores.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from simserver import (
    alternate,
    chat_sim,
    cpu_seconds,
    loopback_env,
    run_client,
    write_input,
)

BENCH = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Row:
    client: str
    rate: float  # completions/s
    cpu_ms: float  # the client's CPU per completion
    rss_mb: float
    sim_ms: float  # the simulator's CPU per completion
    load: float


def fleet_argv(inp: Path, out: Path, url: str, concurrency: int) -> list[str]:
    return [sys.executable, "-m", "sglang_fleet.cli", "generate", str(inp), str(out),
            "--url", url, "--json"]


def openai_argv(inp: Path, out: Path, url: str, concurrency: int) -> list[str]:
    return [sys.executable, str(BENCH / "openai_client.py"), str(inp), str(out),
            "--url", url, "--concurrency", str(concurrency)]


def fleet_answers(out: Path, stdout: str, concurrency: int) -> int:
    """Records generate wrote, after checking it ran at the concurrency the other client has."""
    done = json.loads(stdout.splitlines()[-1])
    if done["concurrency"] != concurrency:
        raise SystemExit(f"generate ran at concurrency {done['concurrency']}, not {concurrency}")
    return sum(len(p.read_bytes().splitlines()) for p in out.glob("shard-*.jsonl"))


def openai_answers(out: Path, stdout: str, concurrency: int) -> int:
    return len(out.read_bytes().splitlines())


Argv = Callable[[Path, Path, str, int], list[str]]
Count = Callable[[Path, str, int], int]
CLIENTS: dict[str, tuple[Argv, Count]] = {
    "sglang-fleet generate": (fleet_argv, fleet_answers),
    "openai AsyncOpenAI": (openai_argv, openai_answers),
}


def measure(client: str, inp: Path, out: Path, n: int, url: str, concurrency: int,
            sim: list[int]) -> Row:
    """One run of ``client`` over ``n`` prompts, checked to have answered every one."""
    argv, count = CLIENTS[client]
    load = os.getloadavg()[0]
    sim_cpu = cpu_seconds(sim)
    run = run_client(argv(inp, out, url, concurrency), loopback_env())
    sim_cpu = cpu_seconds(sim) - sim_cpu
    answers = count(out, run.out, concurrency)
    if answers != n:
        raise SystemExit(f"{client} wrote {answers} answers for {n} prompts")
    return Row(client, n / run.wall_s, 1000 * run.cpu_s / n, run.rss_mb, 1000 * sim_cpu / n,
               load)


def order(repeats: int) -> list[str]:
    a, b = CLIENTS
    return alternate(a, b, repeats)


def median(client: str, rows: list[Row]) -> Row:
    mine = [r for r in rows if r.client == client]
    return Row(f"{client} (median)", *(statistics.median(getattr(r, f) for r in mine)
                                        for f in ("rate", "cpu_ms", "rss_mb", "sim_ms", "load")))


def table(rows: list[Row], n: int, concurrency: int) -> str:
    lines = [f"{'run':<32}{'compl/s':>9}{'CPU ms/compl':>14}{'RSS MB':>8}{'sim ms/compl':>14}"
             f"{'load':>6}   ({n:,} prompts, concurrency {concurrency}, cores: {os.cpu_count()})"]
    medians = [median(c, rows) for c in CLIENTS]
    for r in [*rows, *medians]:
        lines.append(f"{r.client:<32}{r.rate:>9.0f}{r.cpu_ms:>14.2f}{r.rss_mb:>8.0f}"
                     f"{r.sim_ms:>14.2f}{r.load:>6.1f}")
    fleet, plain = medians
    lines.append(f"generate: {fleet.rate / plain.rate:.2f}x the completions/s, "
                 f"{fleet.cpu_ms / plain.cpu_ms:.2f}x the client CPU per completion, "
                 f"{fleet.rss_mb / plain.rss_mb:.2f}x the peak RSS of the openai loop")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=20000)
    ap.add_argument("--concurrency", type=int, default=64,
                    help="the simulator's --max-running-requests and the openai semaphore")
    ap.add_argument("--repeats", type=int, default=3, help="runs of each client")
    args = ap.parse_args()
    rows = []
    with chat_sim(args.concurrency) as sim:
        inp = write_input(sim.work / "prompts.jsonl", args.prompts)
        for i, client in enumerate(order(args.repeats)):
            out = sim.work / f"out-{i}"  # a new output each run: generate would resume one
            rows.append(measure(client, inp, out, args.prompts, sim.url, args.concurrency,
                                sim.pids))
            print(f"{client}: {rows[-1].rate:.0f} completions/s", file=sys.stderr)
    print(table(rows, args.prompts, args.concurrency))
    return 0


if __name__ == "__main__":
    sys.exit(main())
