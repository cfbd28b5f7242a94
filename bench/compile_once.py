"""Compile once per fleet: three lab hosts with every GPU serving (8 servers each, so no spare
GPU to warm on) roll to a release whose cold DeepGEMM compile costs 120 s. The first host
compiles; the hosts after it receive its kernels before they restart. One table per server
start. Too slow for CI (about 10 minutes); needs root and the lab.

    flock /tmp/sglang-lab.lock uv run python bench/compile_once.py [--jit-seconds 120]

The deploy before the roll serves the pinned release without DeepGEMM kernels (no
``SGLANG_SIM_JIT_SECONDS``); the roll goes to the other release of the lab's wheelhouse with
them, so every host's cache is cold for it. Goal (issue 25): the compile is paid once for the
fleet, and every other server start is ready within its own load + capture + 10 s. A server
"paid" the compile when its start spent at least half the cold compile between its graphs and
ready (where SGLang runs DeepGEMM's precompile), compiling or waiting for another server's.
"""

from __future__ import annotations

import argparse
import math
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from warmup import ANSI, ROOT, sh

from sglang_fleet.config import releases

HOSTS = 3
SLACK = 10.0  # seconds a warm start may take beyond its load and capture
# a host's servers are gated at once, each one's lines named (one server alone: not named)
_READY = re.compile(r"^\[(\w+)\] (?:sglang-(\d+)\.service: )?ready in ([\d.]+) s: (.*)$", re.M)
_PART = re.compile(r"→([\w+ ]+?) ([\d.]+) s")
_KERNELS = re.compile(r"^\[(\w+)\] (kernels: .*|shared the kernels .*)$", re.M)


@dataclass(frozen=True)
class Start:
    """One server start the gate timed: its host, its place among the host's servers, its
    time to ready and its parts."""

    host: str
    server: int
    ready: float
    parts: dict[str, float]

    @property
    def load_capture(self) -> float:
        """Weights, KV and mamba pools, graphs: what a warm start cannot skip."""
        pool = self.parts.get("KV+mamba", self.parts.get("KV", math.nan))
        return self.parts.get("weights", math.nan) + pool + self.parts.get("graphs", math.nan)

    def paid(self, jit: float) -> bool:
        """The start spent the compile (or waited for one) between its graphs and ready."""
        return self.parts.get("ready", 0.0) >= jit / 2

    def within(self) -> bool:
        return self.ready <= self.load_capture + SLACK


def starts(out: str) -> list[Start]:
    """Every "ready in" line of the roll's output, each with its host and its server's number
    (sglang-K; 0 for a host's only server)."""
    found: list[Start] = []
    for host, server, ready, rest in _READY.findall(ANSI.sub("", out)):
        parts = {name.strip(): float(s) for name, s in _PART.findall(rest)}
        found.append(Start(host, int(server or 0), float(ready), parts))
    return found


def kernels(out: str) -> dict[str, list[str]]:
    """What each host said it did with its kernels (compiled, shared, received)."""
    said: dict[str, list[str]] = {}
    for host, line in _KERNELS.findall(ANSI.sub("", out)):
        said.setdefault(host, []).append(line)
    return said


def table(found: list[Start], jit: float, said: dict[str, list[str]], seconds: float) -> str:
    head = (f"{'host':<6}{'server':>7}{'ready s':>9}{'load+capture s':>16}{'goal s':>8}"
            f"{'paid the compile':>18}{'within goal':>13}")
    rows = [head, "-" * len(head)]
    for s in found:
        rows.append(f"{s.host:<6}{s.server:>7}{s.ready:>9.1f}{s.load_capture:>16.1f}"
                    f"{s.load_capture + SLACK:>8.1f}{'yes' if s.paid(jit) else 'no':>18}"
                    f"{'yes' if s.within() else 'NO':>13}")
    paid = [s for s in found if s.paid(jit)]
    later = [s for s in found if not s.paid(jit)]
    rows += ["", f"servers started: {len(found)}; paid the {jit:g} s compile: {len(paid)} "
             "(goal 1)", f"the other starts within load + capture + {SLACK:g} s: "
             f"{sum(s.within() for s in later)} of {len(later)}; the slowest "
             f"{max((s.ready - s.load_capture for s in later), default=0.0):.1f} s beyond "
             "its load + capture", f"whole roll: {seconds:.0f} s", ""]
    for host in sorted(said):
        rows += [f"{host}: {line}" for line in said[host]]
    return "\n".join(rows)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--jit-seconds", type=float, default=120)
    p.add_argument("--instances", type=int, default=8, help="servers per host (8: every GPU)")
    args = p.parse_args()
    other = releases.supported()[-2]
    every_gpu = f"sglang.parallel.instances={args.instances}"
    jit = f"sglang.env.SGLANG_SIM_JIT_SECONDS=\"{args.jit_seconds:g}\""
    sh("uv", "run", "sglang-fleet", "lab", "up", "--hosts", str(HOSTS), timeout=1800)
    try:
        sh("uv", "run", "pyinfra", "-y", "inventories/lab.py", "deploys/sglang.py",
           "--data", every_gpu, timeout=3600)
        sh("uv", "run", "pyinfra", "-y", "inventories/lab.py", "deploys/router.py", "--data",
           "router_health_check_interval_secs=1", timeout=1800)
        tic = time.monotonic()
        out = sh("uv", "run", "sglang-fleet", "roll", "inventories/lab.py",
                 "--data", every_gpu, "--data", jit, "--data",
                 f"sglang.engine.version={other}", timeout=7200)
        seconds = time.monotonic() - tic
    finally:
        subprocess.run(["uv", "run", "sglang-fleet", "lab", "down"], cwd=ROOT,
                       capture_output=True)
    print(f"\nroll to {other}: cold DeepGEMM compile {args.jit_seconds:g} s; {HOSTS} hosts x "
          f"{args.instances} servers, batch 1\n")
    print(table(starts(out), args.jit_seconds, kernels(out), seconds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
