"""bench/routers.py on loopback at a tiny size, so the bench cannot rot unseen: both gateways
measured in front of the same simulator, straight-to-the-worker beside them, and a roll of the
worker under load with no failed request."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import ROOT

BENCH = ROOT / "bench" / "routers.py"


def test_the_bench_measures_both_gateways_and_a_roll() -> None:
    done = subprocess.run([sys.executable, str(BENCH), "--workers", "2", "--seconds", "2",
                           "--repeats", "1"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[0].startswith("1 worker at 4 requests at a time, 2 workers at 32, 2 s each")
    assert lines[1].split() == ["req/s", "p50", "ms", "p99", "ms", "+p99", "ms", "req/s", "N",
                                "p99", "N", "out", "s/worker", "max", "failed"]
    direct = lines[2].split()
    assert direct[:4] == ["direct", "to", "the", "worker"] and float(direct[4]) > 0
    rows = {" ".join(line.split()[:2]): line.split()[2:] for line in lines[3:]}
    assert set(rows) == {"smg 1.13.0", "sglang-router 0.3.2"}, lines
    for name, cells in rows.items():
        rps, p50, p99, _added, rps_n, _p99_n, out, longest, failed = cells
        assert float(rps) > 0 and 0 < float(p50) <= float(p99) and float(rps_n) > 0, name
        assert 0 < float(out) <= float(longest), name
        assert int(failed) == 0, f"{name}: {done.stderr[-3000:]}"  # wrk's and the router's words


def test_a_roll_needs_two_workers() -> None:
    done = subprocess.run([sys.executable, str(BENCH), "--workers", "1"], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2 and "--workers: at least 2" in done.stderr, done.stderr
