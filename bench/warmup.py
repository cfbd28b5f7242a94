"""Time out of the router in a roll to a release whose cold compile is expensive, with and
without the warm-up: three lab hosts behind the router, two rolls, one table. Too slow for CI
(about 15 minutes with the default 120 s compile); needs root.

    flock /tmp/sglang-lab.lock uv run python bench/warmup.py [--jit-seconds 120]

Roll 1 goes to the other release of the lab's wheelhouse with ``warmup: off``: each host out of
the router pays the compile. Roll 2 goes back to the pinned release (also cold: nothing has
compiled its kernels yet) with the default ``warmup: compile``: every host compiles on a spare
GPU while serving (the roll's preparation), then restarts warm. The simulator's compile cost is
``SGLANG_SIM_JIT_SECONDS``; loading and graph capture are its defaults (2 s, 3 x 0.5 s).
Goal (issue 16): with warm-up, out of the router <= load + capture + 10 s per host, and the
roll's cutover <= 1.1 x the sum of the hosts' seconds out of the router.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from sglang_fleet.config import releases

ROOT = Path(__file__).resolve().parents[1]
ANSI = re.compile(r"\x1b\[[0-9;]*m")
HOSTS = 3


@dataclass
class Result:
    label: str
    seconds: float  # the whole roll
    prepared: float  # its preparation (every host at once, in the router)
    out: dict[str, float]  # per host, out of the router
    ready: dict[str, float]  # per host, the gate's time to ready of the new start
    load_capture: dict[str, float]  # per host, start→weights + →KV+mamba + →graphs


def sh(*argv: str, timeout: float = 3600) -> str:
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    out = ANSI.sub("", proc.stdout + proc.stderr)
    if proc.returncode != 0:
        sys.exit(f"{' '.join(argv[:4])} failed:\n{out[-3000:]}")
    return out


def roll(label: str, *data: str) -> Result:
    """One roll, its output read as it comes: the preparation ends at the roll's "prepared in"
    line (the others prepared, the first batch waiting for its turn), the cutover is the rest."""
    argv = ["uv", "run", "sglang-fleet", "roll", "inventories/lab.py",
            *(a for d in data for a in ("--data", d))]
    tic = time.monotonic()
    prepared = None
    lines = []
    with subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(ANSI.sub("", line))
            if prepared is None and "prepared in" in line:
                prepared = time.monotonic() - tic
    seconds = time.monotonic() - tic
    out = "".join(lines)
    if proc.returncode != 0:
        sys.exit(f"{label}: the roll failed:\n{out[-3000:]}")
    table = re.findall(r"^(lab\d)\s+converged\s+\d+\s+([\d.]+)$", out, re.M)
    named = r"\[(lab\d)\] (?:sglang-\d+\.service: )?"  # a host's servers' lines are named
    ready = {h: float(s) for h, s in re.findall(named + r"ready in ([\d.]+) s", out)}
    parts = re.findall(named + r"ready in [\d.]+ s: start→weights ([\d.]+) s, "
                       r"→KV(?:\+mamba)? ([\d.]+) s, →graphs ([\d.]+) s", out)
    if len(table) != HOSTS:
        sys.exit(f"{label}: the roll's table lacks hosts:\n{out[-3000:]}")
    return Result(label, seconds, prepared or 0.0,
                  {h: float(s) for h, s in table}, ready,
                  {h: float(a) + float(b) + float(c) for h, a, b, c in parts})


def table(results: list[Result]) -> str:
    head = (f"{'roll':<24}{'host':<6}{'out of router s':>16}{'ready s':>9}"
            f"{'load+capture s':>16}{'goal s':>8}")
    rows = [head, "-" * len(head)]
    for r in results:
        for host in sorted(r.out):
            lc = r.load_capture.get(host, float("nan"))
            rows.append(f"{r.label:<24}{host:<6}{r.out[host]:>16.1f}"
                        f"{r.ready.get(host, float('nan')):>9.1f}{lc:>16.1f}{lc + 10:>8.1f}")
    rows.append("")
    head = (f"{'roll':<24}{'whole s':>9}{'prepare s':>11}{'cutover s':>11}{'sum out s':>11}"
            f"{'cutover/sum':>13}")
    rows += [head, "-" * len(head)]
    for r in results:
        total = sum(r.out.values())
        cutover = r.seconds - r.prepared
        rows.append(f"{r.label:<24}{r.seconds:>9.0f}{r.prepared:>11.0f}{cutover:>11.1f}"
                    f"{total:>11.1f}{cutover / total:>13.2f}")
    return "\n".join(rows)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--jit-seconds", type=float, default=120)
    p.add_argument("--router-health-interval", type=int, default=1,
                   help="the router's health-check interval (host data "
                        "router_health_check_interval_secs; 5 by default): how soon it routes "
                        "to a host that is back")
    args = p.parse_args()
    other = releases.supported()[-2]
    jit = f"sglang.env.SGLANG_SIM_JIT_SECONDS=\"{args.jit_seconds:g}\""
    sh("uv", "run", "sglang-fleet", "lab", "up", "--hosts", str(HOSTS), timeout=1800)
    try:
        sh("uv", "run", "pyinfra", "-y", "inventories/lab.py", "deploys/sglang.py", timeout=1800)
        sh("uv", "run", "pyinfra", "-y", "inventories/lab.py", "deploys/router.py", "--data",
           f"router_health_check_interval_secs={args.router_health_interval}", timeout=1800)
        results = [roll(f"to {other}, warmup off", jit, f"sglang.engine.version={other}",
                        "sglang.warmup=off"),
                   roll(f"to {releases.pinned()}, compile", jit)]
    finally:
        subprocess.run(["uv", "run", "sglang-fleet", "lab", "down"], cwd=ROOT,
                       capture_output=True)
    print(f"\ncold DeepGEMM compile: {args.jit_seconds:g} s; {HOSTS} hosts, batch 1; router "
          f"health checks every {args.router_health_interval} s\n")
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
