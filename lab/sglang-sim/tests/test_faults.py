"""Faults on demand behave like the failures they stand for."""

from __future__ import annotations

import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
from conftest import MTP, Launcher


def test_fail_at_startup(sims: Launcher) -> None:
    result = sims.run(env={"SGLANG_SIM_FAIL_STARTUP": "CUDA out of memory. Tried to allocate"})
    assert result.returncode == 1
    assert "RuntimeError: CUDA out of memory. Tried to allocate" in result.stderr
    assert "Load weight begin." in result.stderr and "fired up" not in result.stderr


def test_crash_after_requests(sims: Launcher) -> None:
    sim = sims.start(env={"SGLANG_SIM_CRASH_AFTER": "2"})
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    for _ in range(2):
        assert sim.client().post("/v1/chat/completions", json=chat).status_code == 200
    assert sim.proc.wait(10) == 1
    assert "Scheduler hit an exception" in sim.output()


def test_crash_takes_the_running_batch_with_it(sims: Launcher) -> None:
    """The step after the Nth request finished kills the process, however fast the batch is."""
    sim = sims.start("--max-running-requests", "4", env={"SGLANG_SIM_CRASH_AFTER": "2"})
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}

    def ask(_: int) -> int:
        try:
            return sim.client().post("/v1/chat/completions", json=chat).status_code
        except httpx.HTTPError:
            return 0

    with ThreadPoolExecutor(16) as pool:
        codes = list(pool.map(ask, range(16)))
    assert 0 < codes.count(200) < 16 and codes.count(200) + codes.count(0) == 16, codes
    assert sim.proc.wait(10) == 1
    assert "TP0] Scheduler hit an exception: RuntimeError: simulated crash after" in sim.output()


def test_hang_while_loading(sims: Launcher) -> None:
    sim = sims.start(env={"SGLANG_SIM_HANG_LOADING": "1"}, wait=False)
    time.sleep(2)
    assert sim.proc.poll() is None
    assert "Load weight begin." in sim.output() and "Load weight end." not in sim.output()
    try:
        httpx.get(sim.url + "/health", timeout=1)
        listening = True
    except httpx.HTTPError:
        listening = False
    assert not listening


def test_health_check_timeout(sims: Launcher) -> None:
    sim = sims.start(env={"SGLANG_SIM_HEALTH_TIMEOUT": "1", "SGLANG_HEALTH_CHECK_TIMEOUT": "1"},
                     wait=False)
    deadline = time.monotonic() + 20
    while "fired up" not in sim.output() and time.monotonic() < deadline:
        time.sleep(0.1)
    tic = time.monotonic()
    assert httpx.get(sim.url + "/health", timeout=10).status_code == 503
    assert time.monotonic() - tic >= 1
    assert httpx.get(sim.url + "/ready", timeout=10).status_code == 503
    assert "Health check failed." in sim.output()


def test_state_cache_too_small_fault(sims: Launcher) -> None:
    result = sims.run(*MTP, "--mamba-radix-cache-strategy", "extra_buffer",
                      env={"SGLANG_SIM_STATE_CACHE_TOO_SMALL": "1"})
    assert result.returncode == 1
    assert "RuntimeError: Hybrid (mamba/linear-attention) state cache is too small" in \
        result.stderr


def test_a_killed_server_takes_its_scheduler_with_it(sims: Launcher) -> None:
    """As SGLang's scheduler (kill_itself_when_parent_died): no orphan outlives kill -9."""
    sim = sims.start()
    found = subprocess.run(["pgrep", "-P", str(sim.proc.pid), "-f", "sglang::scheduler_TP0"],
                           capture_output=True, text=True).stdout.split()
    assert len(found) == 1, found
    sim.proc.kill()
    sim.proc.wait(10)
    deadline = time.monotonic() + 5
    while Path(f"/proc/{found[0]}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not Path(f"/proc/{found[0]}").exists() or \
        "Z" in Path(f"/proc/{found[0]}/stat").read_text().split()[2]
