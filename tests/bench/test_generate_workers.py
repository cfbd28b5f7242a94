"""bench/generate_workers.py against a real simulator on loopback, at a tiny size, so the bench
cannot rot unseen: it times one worker and three, prints its table and the hosts one worker
feeds, and passes its kill -9 check; it refuses a worker count its check cannot run with."""

from __future__ import annotations

import re
import subprocess
import sys

from tests.conftest import ROOT

BENCH = ROOT / "bench" / "generate_workers.py"


def test_the_bench_times_one_and_three_workers_and_passes_its_kill_check() -> None:
    done = subprocess.run([sys.executable, str(BENCH), "--lines", "600", "--workers", "3",
                           "--repeats", "1", "--max-running", "16"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "600 lines, shards of 20, concurrency 16 each" in lines[0], lines[0]
    names = []
    for line, workers in zip(lines[1:5], (1, 3, 1, 3), strict=True):
        words = line.split()
        names.append(" ".join(words[:-(5 + workers)]))
        rate, wall, *each, clients, sim, load = (float(x) for x in words[-(5 + workers):])
        assert len(each) == workers and all(ms > 0 for ms in each) and clients > 0
        assert sim > 0 and load >= 0
        assert abs(rate * wall - 600) <= 30  # the job's lines over its wall time (rounded)
    assert names == ["1 worker", "3 workers", "1 worker (median)", "3 workers (median)"]
    assert lines[5].startswith("3 workers: ") and "x one worker's completions/s" in lines[5]
    assert lines[6].startswith("start-up (generate --help): ")
    assert lines[7].startswith("a worker alone on a core of its own: ")
    assert lines[7].endswith("for the 3 on 3 cores")
    rate = float(lines[3].split()[3])  # the median worker's, as the table shows it
    fed = re.fullmatch(r"one worker at (\d+) completions/s feeds about (\d+) / 52 = (\d+) hosts "
                       r"\(52 completions/s per B200 host at ~95k output tok/s and ~1,818 "
                       r"tokens a completion\)", lines[8])
    assert fed, lines[8]
    shown, divided, hosts = (int(x) for x in fed.groups())
    assert shown == divided == rate and hosts == round(shown / 52)
    assert lines[9].startswith("check: worker 1/3 killed -9 after committing ")
    assert lines[9].endswith("run again: results printed each of the 600 ids once")


def test_one_worker_is_refused_before_anything_starts() -> None:
    done = subprocess.run([sys.executable, str(BENCH), "--workers", "1"], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2
    assert "--workers must be at least 2 (the check kills worker 1), not 1" in done.stderr
