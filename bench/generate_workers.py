#!/usr/bin/env python3
"""How ``sglang-fleet generate`` scales with workers (``--worker K/N``) on one job.

    uv run python bench/generate_workers.py [--lines 30000] [--workers 3] [--repeats 3]

Starts one simulator on loopback with decoding made near-instant (bench/simserver.py), so the
client is the limit, and sends it the same input through one run (no ``--worker``), then through
N processes ``--worker k/N`` started at once on one output, alternating the two (a, b, b, a,
...). Each run of each configuration gets a new output. For each run: completions/s from the
job's start to its last worker's exit, each worker's client CPU per completion it wrote
(os.wait4: the child's own, start-up included), all workers' CPU per completion of the job, the
simulator's CPU per completion (/proc) and the 1-minute load average before the run; then the
medians. Every worker reads the whole input (it skips the others' shards' lines), so a worker
of N pays more per completion than a lone run. The clients and the simulator share the cores,
so the table also gives the rate that their CPU per completion allows on this machine's cores.

Then a check, not a timing: N workers again, worker 1 killed with SIGKILL once it has
committed a shard and run again; ``sglang-fleet results`` must say the job unfinished before the
rerun and print each input id exactly once after it. Anything else exits non-zero.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from simserver import (
    Client,
    alternate,
    chat_sim,
    cpu_seconds,
    finish,
    launch,
    loopback_env,
    run_client,
    write_input,
)

HOST_RATE = 52  # completions/s of one B200 host: ~95k output tok/s / ~1,818 tokens a completion
KILLED = 1  # the worker the check kills


@dataclass(frozen=True)
class Job:
    """One job's input and what it runs against."""

    inp: Path
    lines: int
    url: str
    shard_size: int


@dataclass(frozen=True)
class Row:
    config: str
    rate: float  # completions/s, the job's start to its last worker's exit
    wall_s: float
    worker_ms: tuple[float, ...]  # each worker's CPU per completion it wrote
    clients_ms: float  # all workers' CPU per completion of the job
    sim_ms: float  # the simulator's CPU per completion
    load: float


def config(n: int) -> str:
    return "1 worker" if n == 1 else f"{n} workers"


def argv(job: Job, out: Path, share: tuple[int, int] | None) -> list[str]:
    worker = [] if share is None else ["--worker", f"{share[0]}/{share[1]}"]
    return [sys.executable, "-m", "sglang_fleet.cli", "generate", str(job.inp), str(out),
            "--url", job.url, "--shard-size", str(job.shard_size), "--json", *worker]


def start(job: Job, out: Path, n: int) -> list[Client]:
    """One run without --worker (n == 1), else n processes --worker k/n, started at once."""
    shares: list[tuple[int, int] | None] = [None] if n == 1 else [(k, n) for k in range(n)]
    env = loopback_env()
    return [launch(argv(job, out, share), env) for share in shares]


def measure(job: Job, out: Path, n: int, sim: list[int]) -> Row:
    """One run of ``n`` workers, checked to have written a record for every line."""
    load = os.getloadavg()[0]
    sim_cpu = cpu_seconds(sim)
    begin = time.monotonic()
    runs = [finish(c) for c in start(job, out, n)]  # the last returns at the last exit
    wall = time.monotonic() - begin
    sim_cpu = cpu_seconds(sim) - sim_cpu
    done = [json.loads(r.out.splitlines()[-1]) for r in runs]
    records = [int(d["records"]) for d in done]
    if sum(records) != job.lines or any(d["failures"] for d in done):
        raise SystemExit(f"{config(n)}: {records} records, failures "
                         f"{[d['failures'] for d in done]}, for {job.lines} lines")
    cpu = [r.cpu_s for r in runs]
    return Row(config(n), job.lines / wall, wall,
               tuple(1000 * c / k for c, k in zip(cpu, records, strict=True)),
               1000 * sum(cpu) / job.lines, 1000 * sim_cpu / job.lines, load)


def median(name: str, rows: list[Row]) -> Row:
    mine = [r for r in rows if r.config == name]

    def mid(field: str) -> float:
        return float(statistics.median(getattr(r, field) for r in mine))

    each = tuple(statistics.median(ms) for ms in zip(*(r.worker_ms for r in mine), strict=True))
    return Row(f"{name} (median)", mid("rate"), mid("wall_s"), each, mid("clients_ms"),
               mid("sim_ms"), mid("load"))


def startup_cpu() -> float:
    """CPU seconds of a process that starts generate and does nothing (``--help``): what each
    worker pays once, before its first request."""
    return run_client([sys.executable, "-m", "sglang_fleet.cli", "generate", "--help"],
                      loopback_env()).cpu_s


def table(rows: list[Row], job: Job, n: int, concurrency: int, startup: float) -> str:
    cores = os.cpu_count() or 1
    width = max(22, 6 * n + 2)
    lines = [f"{'run':<22}{'compl/s':>9}{'wall s':>8}{'worker CPU ms/compl':>{width}}"
             f"{'clients ms/compl':>18}{'sim ms/compl':>14}{'load':>6}   ({job.lines:,} lines, "
             f"shards of {job.shard_size}, concurrency {concurrency} each, cores: {cores})"]
    one, many = medians = [median(config(k), rows) for k in (1, n)]
    for r in [*rows, *medians]:
        each = " ".join(f"{ms:.2f}" for ms in r.worker_ms)
        lines.append(f"{r.config:<22}{r.rate:>9.0f}{r.wall_s:>8.1f}{each:>{width}}"
                     f"{r.clients_ms:>18.2f}{r.sim_ms:>14.2f}{r.load:>6.1f}")
    bound = [cores * 1000 / (r.clients_ms + r.sim_ms) for r in medians]
    lines.append(f"{config(n)}: {many.rate / one.rate:.2f}x one worker's completions/s; the "
                 f"{cores} shared cores allow {bound[0]:.0f}/s and {bound[1]:.0f}/s (cores / "
                 f"clients' + simulator's CPU per completion)")
    lines.append(f"start-up (generate --help): {startup:.2f} s of CPU, in those figures: "
                 f"{1000 * startup / job.lines:.2f} ms a completion as 1 worker, "
                 f"{1000 * startup * n / job.lines:.2f} as each of {n}")
    alone = 1000 / max(many.worker_ms)
    lines.append(f"a worker alone on a core of its own: {1000 / one.clients_ms:.0f} "
                 f"completions/s as 1 worker; {alone:.0f} as each of {n}, {n * alone:.0f} for the "
                 f"{n} on {n} cores")
    shown = round(one.rate)  # the division as printed: its figures agree with each other
    lines.append(f"one worker at {shown} completions/s feeds about {shown} / "
                 f"{HOST_RATE} = {shown / HOST_RATE:.0f} hosts ({HOST_RATE} completions/s per "
                 "B200 host at ~95k output tok/s and ~1,818 tokens a completion)")
    return "\n".join(lines)


def results(out: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sglang_fleet.cli", "results", str(out)],
                          capture_output=True, text=True, env=loopback_env(), timeout=600)


def committed(out: Path, n: int) -> int:
    """How many of worker KILLED's shards are in ``out`` (a shard appears whole: a rename)."""
    names = (p.name.removeprefix("shard-").removesuffix(".jsonl") for p in out.glob("shard-*"))
    return sum(1 for name in names if name.isdigit() and int(name) % n == KILLED)


def kill_after_a_shard(client: Client, out: Path, n: int) -> int:
    """SIGKILL ``client`` once it has committed a shard; how many it had."""
    deadline = time.monotonic() + 300
    while not (count := committed(out, n)):
        if client.proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"worker {KILLED}/{n} committed no shard (exit {client.proc.poll()})")
        time.sleep(0.01)
    client.proc.kill()
    client.proc.wait()
    assert client.proc.stdout is not None
    client.proc.stdout.close()
    return count


def check(job: Job, out: Path, n: int) -> str:
    """Worker KILLED of n killed -9 and run again: the job's view holds each input id once."""
    clients = start(job, out, n)
    try:
        count = kill_after_a_shard(clients[KILLED], out, n)
        for client in clients[:KILLED] + clients[KILLED + 1:]:
            finish(client)
    finally:  # a failed check leaves no worker behind
        for client in clients:
            if client.proc.poll() is None:
                client.proc.kill()
                client.proc.wait()
    killed = json.loads((out / f"manifest-{KILLED}-of-{n}.json").read_text())
    unfinished = results(out)
    if killed["complete"] or unfinished.returncode != 1:
        raise SystemExit(f"worker {KILLED}/{n} was killed but the job reads as finished "
                         f"(manifest complete: {killed['complete']}, results exit "
                         f"{unfinished.returncode})")
    finish(launch(argv(job, out, (KILLED, n)), loopback_env()))
    view = results(out)
    ids = [json.loads(line)["id"] for line in view.stdout.splitlines()]
    want = {f"q{i}" for i in range(job.lines)}
    if view.returncode or len(ids) != job.lines or set(ids) != want:
        raise SystemExit(f"after the rerun, results exited {view.returncode} with {len(ids)} "
                         f"lines, {len(set(ids))} ids, {len(want - set(ids))} of the input's "
                         f"missing:\n{view.stderr}")
    return (f"check: worker {KILLED}/{n} killed -9 after committing {count} shard(s), run "
            f"again: results printed each of the {job.lines:,} ids once")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lines", type=int, default=30000)
    ap.add_argument("--workers", type=int, default=3, help="N of the --worker K/N runs")
    ap.add_argument("--repeats", type=int, default=3, help="runs of each configuration")
    ap.add_argument("--max-running", type=int, default=64,
                    help="the simulator's --max-running-requests (each worker's concurrency)")
    args = ap.parse_args()
    n = args.workers
    if n < 2:
        ap.error(f"--workers must be at least 2 (the check kills worker {KILLED}), not {n}")
    if args.lines < 10 * n:
        ap.error(f"--lines must be at least 10 x --workers ({10 * n}), not {args.lines}")
    rows = []
    with chat_sim(args.max_running) as sim:
        # at most generate's default, and at least 10 shards for each worker
        job = Job(write_input(sim.work / "in.jsonl", args.lines), args.lines, sim.url,
                  min(1000, args.lines // (10 * n)))
        for i, name in enumerate(alternate("1", str(n), args.repeats)):
            rows.append(measure(job, sim.work / f"out-{i}", int(name), sim.pids))
            print(f"{rows[-1].config}: {rows[-1].rate:.0f} completions/s", file=sys.stderr)
        print(table(rows, job, n, args.max_running, startup_cpu()), flush=True)
        print(check(job, sim.work / "out-check", n))
    return 0


if __name__ == "__main__":
    sys.exit(main())
