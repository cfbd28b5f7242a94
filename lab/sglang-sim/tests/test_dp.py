"""``--dp-size 8`` without DP attention, as SGLang runs it (sources in sglang_sim/dp.py,
child.py and processes.py): a DP controller forking one scheduler per DP rank, each rank's own
startup lines and capacity, requests dealt round robin, and one rank's failure the server's."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
from conftest import Launcher, Sim, died_of_a_child

DP8 = ("--dp-size", "8")
CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


def children(pid: int) -> dict[str, int]:
    """A process's children by process title."""
    out = subprocess.run(["pgrep", "-a", "-P", str(pid)], capture_output=True,
                         text=True).stdout.splitlines()
    return {line.split()[1]: int(line.split()[0]) for line in out if line.strip()}


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def prefill_ranks(sim: Sim) -> list[str]:
    """The DP rank of each "Prefill batch" line, in log order (one per request here)."""
    return re.findall(r"\d (DP\d)\] Prefill batch", sim.output())


def post(sim: Sim, body: dict[str, Any], timeout: float = 30) -> int:
    try:
        return int(sim.client(timeout=timeout).post("/v1/chat/completions", json=body)
                   .status_code)
    except httpx.HTTPError:
        return 0


def test_the_process_tree_is_a_controller_with_a_scheduler_per_dp_rank(sims: Launcher) -> None:
    """run_data_parallel_controller_process's title (0.5.12 data_parallel_controller.py:630,
    0.5.23 :955); the schedulers its children, titled by their ranks, DP only with tp 1
    (0.5.12 scheduler.py:3951-3966, 0.5.23 :6278-6294)."""
    sim = sims.start(*DP8)
    top = children(sim.proc.pid)
    assert set(top) == {"sglang::data_parallel_controller", "sglang::detokenizer"}, top
    below = children(top["sglang::data_parallel_controller"])
    assert set(below) == {f"sglang::scheduler_DP{d}" for d in range(8)}, below
    sim.proc.kill()
    sim.proc.wait(10)
    deadline = time.monotonic() + 5
    while any(alive(p) for p in below.values()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(alive(p) for p in below.values())  # their parent died with the server


def test_tp2_dp2_names_both_ranks(sims: Launcher) -> None:
    sim = sims.start("--tp-size", "2", "--dp-size", "2")
    ctl = children(sim.proc.pid)["sglang::data_parallel_controller"]
    assert set(children(ctl)) == {"sglang::scheduler_DP0_TP0", "sglang::scheduler_DP0_TP1",
                                  "sglang::scheduler_DP1_TP0", "sglang::scheduler_DP1_TP1"}
    assert "Launch DP1 starting at GPU #2." in sim.output()
    assert "DP1 TP0] max_total_num_tokens=" in sim.output()


def test_each_dp_rank_logs_its_own_startup(sims: Launcher) -> None:
    """"Launch DP{d} starting at GPU #{base}." from the controller (0.5.12 :456, 0.5.23 :687),
    then every rank's pools and its scheduler's summary under its own prefix."""
    sim = sims.start(*DP8, "--max-running-requests", "4")
    out = sim.output()
    for d in range(8):
        assert f"] Launch DP{d} starting at GPU #{d}.\n" in out
        assert len(re.findall(rf" DP{d}\] Load weight end\.", out)) == 1
        assert len(re.findall(rf" DP{d}\] max_total_num_tokens=\d+, chunked_prefill_size=\d+, "
                              r"max_prefill_tokens=\d+, max_running_requests=4, ", out)) == 1
    assert "TP0]" not in out  # tp 1: no TP in the prefix


def test_requests_go_round_robin(sims: Launcher) -> None:
    """auto → round_robin (0.5.12 server_args.py:1019-1029): the warm-up takes DP0's turn, the
    next requests DP1, DP2, ... in order, whatever each rank's load."""
    sim = sims.start(*DP8)
    for _ in range(9):
        assert post(sim, CHAT) == 200
    assert prefill_ranks(sim) == [*(f"DP{d}" for d in range(8)), "DP0", "DP1"]
    info = sim.client().get("/server_info").json()
    assert info["load_balance_method"] == "round_robin"


def test_total_requests_picks_the_least_loaded_rank(sims: Launcher) -> None:
    sim = sims.start("--dp-size", "2", "--load-balance-method", "total_requests",
                     env={"SGLANG_SIM_DECODE_STEPS_PER_SECOND": "4"})
    slow = {**CHAT, "max_tokens": 12}
    with ThreadPoolExecutor(1) as pool:
        busy = pool.submit(post, sim, slow)  # DP0 (the least loaded: both idle)
        time.sleep(0.5)
        assert post(sim, CHAT) == 200 and post(sim, CHAT) == 200  # DP1 twice: DP0 is busy
        assert busy.result() == 200
    assert prefill_ranks(sim)[-3:] == ["DP0", "DP1", "DP1"]


def test_capacity_is_per_dp_rank(sims: Launcher) -> None:
    """max_running_requests is each replica's (divided by dp_size only with DP attention):
    8 ranks of 2 run 16 at once; /server_info reports the argument as given and each rank's
    effective limit in internal_states; /metrics has a series per DP rank."""
    sim = sims.start(*DP8, "--max-running-requests", "2", "--enable-metrics",
                     env={"SGLANG_SIM_DECODE_STEPS_PER_SECOND": "4"})
    info = sim.client().get("/server_info").json()
    assert info["max_running_requests"] == 2 and info["dp_size"] == 8
    assert [s["effective_max_running_requests_per_dp"] for s in info["internal_states"]] == \
        [2] * 8
    with ThreadPoolExecutor(20) as pool:
        futures = [pool.submit(post, sim, {**CHAT, "max_tokens": 16}) for _ in range(20)]
        time.sleep(1.5)
        text = sim.client().get("/metrics").text
        assert [f.result() for f in futures] == [200] * 20
    running = re.findall(r'sglang:num_running_reqs\{[^}]*dp_rank="(\d)"\} (\d+)', text)
    queued = re.findall(r'sglang:num_queue_reqs\{[^}]*dp_rank="\d"\} (\d+)', text)
    assert sorted(int(r) for r, _ in running) == list(range(8))
    assert sum(int(n) for _, n in running) == 16 and sum(int(n) for n in queued) == 4, text
    assert text.count("# HELP sglang:num_running_reqs ") == 1


def test_a_dp_rank_exception_ends_the_whole_server(sims: Launcher) -> None:
    """DP3's scheduler SIGQUITs its parent, the controller, which has no handler and dies of
    it (-3); the schedulers die with it; the server's SubprocessWatchdog sees ``scheduler_0``
    (the controller) crash and the server kills itself: all 8 ranks are gone."""
    sim = sims.start(*DP8)
    ctl = children(sim.proc.pid)["sglang::data_parallel_controller"]
    schedulers = children(ctl)
    os.kill(schedulers["sglang::scheduler_DP3"], signal.SIGUSR1)
    code = sim.proc.wait(10)
    died_of_a_child(sim.output(), code, f"Subprocess scheduler_0 (pid={ctl}) crashed with "
                    "exit code -3. Triggering SIGQUIT for cleanup...")
    assert " DP3] Scheduler hit an exception: Traceback" in sim.output()
    assert not any(alive(p) for p in schedulers.values())


def test_a_dp_rank_killed_outright_is_noticed_by_nothing(sims: Launcher) -> None:
    """SIGKILL to DP2's scheduler: no watchdog watches it, the controller keeps dealing it its
    turn; what it gets never moves, /server_info waits for its answer, the other ranks serve."""
    sim = sims.start(*DP8)
    ctl = children(sim.proc.pid)["sglang::data_parallel_controller"]
    os.kill(children(ctl)["sglang::scheduler_DP2"], signal.SIGKILL)
    time.sleep(1.5)  # the simulator's own check that the rank is gone (every 0.5 s)
    codes = [post(sim, CHAT, timeout=3) for _ in range(8)]  # DP1 .. DP7, DP0
    assert codes == [200, 0, 200, 200, 200, 200, 200, 200], codes
    assert sim.proc.poll() is None
    with contextlib.suppress(httpx.HTTPError):
        status = sim.client(timeout=3).get("/server_info").status_code
        raise AssertionError(f"/server_info answered {status} with a rank gone")


def test_a_dp_rank_failing_at_startup_fails_the_launch(sims: Launcher) -> None:
    """While loading, the failing rank's SIGQUIT ends the controller; the server, waiting for
    its ready message, raises _scheduler_died_error and exits 1 (0.5.12 entrypoints/engine.py:
    1315-1355) after launch_server's kill_process_tree of the rest."""
    result = sims.run(*DP8, env={"SGLANG_SIM_FAIL_STARTUP": "CUDA out of memory."})
    assert result.returncode == 1, result.stderr[-2000:]
    assert " DP0] Scheduler hit an exception: Traceback" in result.stderr
    assert result.stderr.rstrip().endswith(
        "RuntimeError: Rank 0 scheduler died during initialization (exit code: -3). If exit "
        "code is -9 (SIGKILL), a common cause is the OS OOM killer. Run `dmesg -T | grep -i "
        "oom` to check."), result.stderr[-2000:]
    assert "fired up" not in result.stderr


def test_more_dp_ranks_than_gpus_fail_on_the_first_missing_gpu(sims: Launcher) -> None:
    result = sims.run("--dp-size", "9")
    assert result.returncode == 1
    assert " DP8] Scheduler hit an exception" in result.stderr
    assert "RuntimeError: CUDA error: invalid device ordinal" in result.stderr
