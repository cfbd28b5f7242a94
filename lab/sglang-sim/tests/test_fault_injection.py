"""Faults on demand behave like the failures they stand for."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
from conftest import MTP, Launcher, Sim, died_of_a_child


def test_fail_at_startup(sims: Launcher) -> None:
    """Loading runs in the scheduler: its exception SIGQUITs the server while it still waits
    for the scheduler, whose launch-phase handler kills the tree (0.5.23 entrypoints/engine.py:
    1976-1982, managers/scheduler.py:6370-6373)."""
    result = sims.run(env={"SGLANG_SIM_FAIL_STARTUP": "CUDA out of memory. Tried to allocate"})
    died_of_a_child(result.stderr, result.returncode, "] Scheduler hit an exception: "
                    "Traceback (most recent call last):", running=False)
    assert "\nRuntimeError: CUDA out of memory. Tried to allocate" in result.stderr
    assert "Load weight begin." in result.stderr and "fired up" not in result.stderr


def test_crash_after_requests(sims: Launcher) -> None:
    """A scheduler exception once serving: the running-phase handler (0.5.23
    managers/tokenizer_manager.py:4072-4083), kill_process_tree (utils/common.py:2507-2555)."""
    sim = sims.start(env={"SGLANG_SIM_CRASH_AFTER": "2"})
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    for _ in range(2):
        assert sim.client().post("/v1/chat/completions", json=chat).status_code == 200
    with contextlib.suppress(httpx.HTTPError):
        sim.client(timeout=5).post("/v1/chat/completions", json=chat)
    died_of_a_child(sim.output(), sim.proc.wait(10), "] Scheduler hit an exception: "
                    "Traceback (most recent call last):")
    assert "\nRuntimeError: simulated crash after 2 requests\n" in sim.output()


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
    died_of_a_child(sim.output(), sim.proc.wait(10), "] Scheduler hit an exception: ")
    assert "RuntimeError: simulated crash after" in sim.output()


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
    died_of_a_child(result.stderr, result.returncode, "Scheduler hit an exception", running=False)
    assert "RuntimeError: Hybrid (mamba/linear-attention) state cache is too small" in \
        result.stderr


def test_a_killed_server_takes_its_scheduler_with_it(sims: Launcher) -> None:
    """As SGLang's scheduler (kill_itself_when_parent_died): no orphan outlives kill -9."""
    sim = sims.start()
    found = subprocess.run(["pgrep", "-P", str(sim.proc.pid), "-f", "sglang::scheduler"],
                           capture_output=True, text=True).stdout.split()
    assert len(found) == 1, found
    sim.proc.kill()
    sim.proc.wait(10)
    deadline = time.monotonic() + 5
    while Path(f"/proc/{found[0]}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not Path(f"/proc/{found[0]}").exists() or \
        "Z" in Path(f"/proc/{found[0]}/stat").read_text().split()[2]


def children(sim_pid: int) -> dict[str, int]:
    """The server's children by process title (``sglang::scheduler``, ...)."""
    out = subprocess.run(["pgrep", "-a", "-P", str(sim_pid)], capture_output=True,
                         text=True).stdout.split("\n")
    return {line.split()[1]: int(line.split()[0]) for line in out if line.strip()}


def gone(pid: int, seconds: float = 5) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not Path(f"/proc/{pid}").exists() or \
                "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]:
            return True
        time.sleep(0.05)
    return False


def test_a_child_that_dies_outright_brings_the_server_down(sims: Launcher) -> None:
    """A detokenizer killed by SIGKILL: the SubprocessWatchdog (0.5.10 - 0.5.23
    utils/watchdog.py SubprocessWatchdog._check_processes, every 1 s) logs it and SIGQUITs the
    server, which kills the rest of its tree and itself."""
    sim = sims.start()
    kids = children(sim.proc.pid)
    assert set(kids) == {"sglang::scheduler", "sglang::detokenizer"}, kids
    os.kill(kids["sglang::detokenizer"], signal.SIGKILL)
    died_of_a_child(*ended(sim, 10),
                    f"Subprocess detokenizer (pid={kids['sglang::detokenizer']}) crashed with "
                    "exit code -9. Triggering SIGQUIT for cleanup...")
    assert gone(kids["sglang::scheduler"])


def test_a_scheduler_exception_on_demand(sims: Launcher) -> None:
    """SIGUSR1 to the scheduler stand-in (the simulator's fault hook): the same end as any
    scheduler exception."""
    sim = sims.start()
    os.kill(children(sim.proc.pid)["sglang::scheduler"], signal.SIGUSR1)
    died_of_a_child(*ended(sim, 10),
                    "] Scheduler hit an exception: Traceback (most recent call last):")
    assert "RuntimeError: simulated scheduler exception (SIGUSR1 to the scheduler)" in \
        sim.output()


def test_a_hung_batch_ends_at_the_schedulers_watchdog(sims: Launcher) -> None:
    """--watchdog-timeout: the batch that does not move for that long is logged, 5 s pass for
    the server to print, then SIGQUIT (0.5.23 utils/watchdog.py:150-163)."""
    sim = sims.start("--watchdog-timeout", "1", env={"SGLANG_SIM_HANG_AFTER": "1"})
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    assert sim.client().post("/v1/chat/completions", json=chat).status_code == 200
    with contextlib.suppress(httpx.HTTPError):
        sim.client(timeout=20).post("/v1/chat/completions", json=chat)
    died_of_a_child(*ended(sim, 20),
                    "] Scheduler watchdog timeout (self.watchdog_timeout=1.0, "
                    "self.soft=False)")


def test_kill_process_tree_logs_itself_from_0_5_13(sims: Launcher) -> None:
    """utils/common.py: 0.5.12 kills silently, 0.5.13 logs ``kill_process_tree called``."""
    for release, logged in (("0.5.12", False), ("0.5.13", True)):
        sim = sims.start(env={"SGLANG_SIM_VERSION": release})
        os.kill(children(sim.proc.pid)["sglang::scheduler"], signal.SIGUSR1)
        assert sim.proc.wait(10) == -9, release
        assert ("kill_process_tree called" in sim.output()) == logged, release


def test_sigterm_to_every_process_fails_the_requests_in_flight(sims: Launcher) -> None:
    """Why the unit stops with KillMode=mixed: the children take SIGTERM's default (no handler
    in run_scheduler_process or run_detokenizer_process), so a SIGTERM to the whole group ends
    them under the server's drain; the watchdog then brings the server down, SIGKILLed. The
    server alone drains and every request in flight is answered."""
    slow = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 24}
    env = {"SGLANG_SIM_DECODE_STEPS_PER_SECOND": "8", "SGLANG_SIM_VERSION": "0.5.23"}
    results = {}
    for whole_group in (True, False):
        sim = sims.start(env=env, session=True)
        with ThreadPoolExecutor(4) as pool:
            futures = [pool.submit(_status, sim, slow) for _ in range(4)]
            time.sleep(1)
            if whole_group:
                os.killpg(sim.proc.pid, signal.SIGTERM)
            else:
                sim.proc.send_signal(signal.SIGTERM)
            codes = [f.result() for f in futures]
        results[whole_group] = (codes, sim.proc.wait(20))
    assert results[True][0] == [0, 0, 0, 0] and results[True][1] == -9, results
    assert results[False] == ([200, 200, 200, 200], 0), results


def _status(sim: Sim, body: dict[str, object]) -> int:
    try:
        return int(sim.client().post("/v1/chat/completions", json=body).status_code)
    except httpx.HTTPError:
        return 0


def ended(sim: Sim, seconds: float) -> tuple[str, int]:
    code = sim.proc.wait(seconds)
    return sim.output(), code
