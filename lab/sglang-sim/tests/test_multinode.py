"""Two nodes of one TP group (``--tp-size 2 --nnodes 2``) on loopback, as SGLang runs them
(sources in sglang_sim/multinode.py and follower.py): they meet at rank 0's init address, rank 0
serves, rank 1 answers only health; a rank that never comes, a rank killed idle or busy, and the
release's SIGTERM."""

from __future__ import annotations

import contextlib
import re
import signal
import subprocess
import threading
import time

import httpx
import pytest
from conftest import Launcher, Sim, free_port

CHAT = {"messages": [{"role": "user", "content": "What is 2+2?"}], "max_tokens": 8}
LOST = "Connection closed by peer"
LAUNCH_HANDLER = "Received sigquit from a child process. It usually means the child failed."
RUNNING_HANDLER = "SIGQUIT received. signum=None, frame=None. It usually means one child failed."


def version(release: str) -> dict[str, str]:
    return {"SGLANG_SIM_VERSION": release}


def group(timeout: int, init_port: int) -> tuple[str, ...]:
    return ("--tp-size", "2", "--nnodes", "2", "--dist-init-addr", f"127.0.0.2:{init_port}",
            "--dist-timeout", str(timeout))


def pair(sims: Launcher, release: str, timeout: int = 20, env: dict[str, str] | None = None,
         extra: tuple[str, ...] = ()) -> tuple[Sim, Sim]:
    """Rank 1 first (its store client retries), then rank 0; both ready."""
    flags = (*group(timeout, free_port()), *extra)
    env = {**version(release), **(env or {})}
    one = sims.start(*flags, "--node-rank", "1", host="127.0.0.3", env=env, wait=False)
    zero = sims.start(*flags, "--node-rank", "0", host="127.0.0.2", env=env)
    Launcher.wait_healthy(one)
    return zero, one


def ended(sim: Sim, timeout: float = 20) -> int:
    try:
        return sim.proc.wait(timeout)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"still running:\n{sim.output()[-3000:]}") from None


def in_order(output: str, *lines: str) -> None:
    at = 0
    for line in lines:
        found = output.find(line, at)
        assert found >= 0, (line, output[-3000:])
        at = found + len(line)


@pytest.mark.parametrize("release", ["0.5.12", "0.5.23"])
def test_ranks_meet_rank_0_serves_rank_1_answers_health(sims: Launcher, release: str) -> None:
    zero, one = pair(sims, release)
    reply = zero.client().post("/v1/chat/completions", json=CHAT)
    assert reply.status_code == 200 and reply.json()["choices"][0]["message"]["content"]
    for path in ("/health", "/health_generate", "/ping"):
        r = httpx.get(one.url + path)
        assert (r.status_code, r.content, r.headers["content-length"]) == (200, b"", "0")
        assert "content-type" not in r.headers
    models = httpx.get(one.url + "/v1/models")
    assert (models.status_code, models.json()) == (404, {"detail": "Not Found"})
    assert httpx.head(one.url + "/health").status_code == 405
    if release == "0.5.23":  # bootstrap.py:115, :190, :219-222
        begin, end = "Init parallel begin.", r"Init parallel ends\. elapsed=\d+\.\d\d s\n"
        end += r".*Memory baseline taken\. mem usage=\d+\.\d\d GB"
    else:  # model_runner.py:1188, :1320-1323
        begin = "Init torch distributed begin."
        end = r"Init torch distributed ends\. elapsed=\d+\.\d\d s, mem usage=\d+\.\d\d GB"
    for sim, rank in ((zero, 0), (one, 1)):
        out = sim.output()
        assert f" TP{rank}] {begin}" in out and re.search(end, out), out[-3000:]
        assert "Init parallel" not in out if release == "0.5.12" else "Init torch" not in out
    assert "fired up" in zero.output() and "max_total_num_tokens=" in zero.output()
    out = one.output()
    assert "fired up" not in out and "max_total_num_tokens=" not in out
    assert f"Dummy health check server started in background thread at 127.0.0.3:" \
           f"{one.url.rsplit(':', 1)[1]}" in out
    assert "Uvicorn running" not in out  # log_config=None, log_level warning


@pytest.mark.parametrize("release", ["0.5.12", "0.5.23"])
def test_rank_never_comes_rank_0_times_out(sims: Launcher, release: str) -> None:
    """TCPStore waitForWorkers: more than the timeout in whole seconds, counting rank 0."""
    zero = sims.start(*group(2, free_port()), "--node-rank", "0", host="127.0.0.2",
                      env=version(release), wait=False)
    tic = time.monotonic()
    assert ended(zero) == -signal.SIGKILL
    assert time.monotonic() - tic >= 3
    in_order(zero.output(), "TP0] Init", "TP0] Scheduler hit an exception: Traceback",
             "torch.distributed.DistStoreError: Timed out after 3 seconds waiting for clients. "
             "1/2 clients joined.", LAUNCH_HANDLER)
    assert "Load weight begin" not in zero.output()
    # kill_process_tree's own line arrived in 0.5.13
    assert ("kill_process_tree called:" in zero.output()) == (release == "0.5.23")


def test_rank_0_never_comes_rank_1_times_out(sims: Launcher) -> None:
    one = sims.start(*group(2, free_port()), "--node-rank", "1", host="127.0.0.3", wait=False)
    assert ended(one) == -signal.SIGKILL
    assert re.search(r"torch\.distributed\.DistNetworkError: The client socket has timed out "
                     r"after 2000ms while trying to connect to \(127\.0\.0\.2, \d+\)\.",
                     one.output()), one.output()[-3000:]
    in_order(one.output(), "TP1] Scheduler hit an exception", LAUNCH_HANDLER)


@pytest.mark.parametrize("release", ["0.5.12", "0.5.23"])
def test_rank_killed_while_idle_rank_0_dies_at_once(sims: Launcher, release: str) -> None:
    zero, one = pair(sims, release)
    one.proc.kill()
    tic = time.monotonic()
    assert ended(zero, 10) == -signal.SIGKILL
    assert time.monotonic() - tic < 3
    in_order(zero.output(), "TP0] Scheduler hit an exception: Traceback", "RuntimeError: [",
             LOST, RUNNING_HANDLER)


@pytest.mark.parametrize("release", ["0.5.10", "0.5.23"])
def test_rank_killed_while_busy_rank_0_hangs_then_dies(sims: Launcher, release: str) -> None:
    """A forward's collective waits for the lost rank: 0.5.11+ for --dist-timeout (3 s), then
    torch's NCCL watchdog aborts the scheduler; 0.5.10's TP group keeps torch's 600 s, so the
    scheduler watchdog (--watchdog-timeout 4) ends it. /health meanwhile: no answer within
    SGLANG_HEALTH_CHECK_TIMEOUT, 503."""
    zero, one = pair(sims, release, timeout=3, extra=("--watchdog-timeout", "4"),
                     env={"SGLANG_SIM_DECODE_STEPS_PER_SECOND": "2",
                          "SGLANG_HEALTH_CHECK_TIMEOUT": "1"})
    long = {**CHAT, "max_tokens": 200}
    threading.Thread(target=lambda: _post(zero, long), daemon=True).start()
    deadline = time.monotonic() + 10
    while "#new-token: 7" not in zero.output() and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(0.3)  # rank 1 has heard that a batch runs
    one.proc.kill()
    tic = time.monotonic()
    assert httpx.get(zero.url + "/health", timeout=10).status_code == 503
    assert zero.proc.poll() is None
    assert ended(zero, 30) == -signal.SIGKILL
    took = time.monotonic() - tic
    out = zero.output()
    assert "Health check failed." in out and "Scheduler hit an exception" not in out
    if release == "0.5.23":
        assert 2.5 < took < 8, took
        in_order(out, "Watchdog caught collective operation timeout", "Timeout(ms)=3000",
                 "Subprocess scheduler_0 (pid=", "crashed with exit code -6.", RUNNING_HANDLER)
    else:
        assert took > 4, took
        in_order(out, "Scheduler watchdog timeout (self.watchdog_timeout=4.0, self.soft=False)",
                 RUNNING_HANDLER)


def _post(sim: Sim, body: dict[str, object]) -> None:
    with contextlib.suppress(httpx.HTTPError):  # the request dies with the server
        sim.client(timeout=60).post("/v1/chat/completions", json=body)


def test_sigterm_of_rank_0_stops_rank_1_from_0_5_14(sims: Launcher) -> None:
    """ShutdownReq to every TP rank (0.5.23 tokenizer_manager.py:3547); node 1's schedulers exit
    0, it returns and exits 0 (engine.py:1021-1026, http_server.py:3163, launch_server.py:86)."""
    zero, one = pair(sims, "0.5.23")
    zero.proc.send_signal(signal.SIGTERM)
    assert ended(zero) == 0
    assert ended(one) == 0
    in_order(one.output(), "Scheduler or DataParallelController", "terminated with 0",
             "kill_process_tree called:", "include_parent=False")
    assert LOST not in one.output()


def test_sigterm_of_rank_0_before_0_5_14_crashes_rank_1(sims: Launcher) -> None:
    """Rank 0 kills its own tree (itself included) only; rank 1's next broadcast fails."""
    zero, one = pair(sims, "0.5.12")
    zero.proc.send_signal(signal.SIGTERM)
    assert ended(zero) == -signal.SIGKILL
    assert ended(one) == -signal.SIGKILL
    in_order(one.output(), "TP1] Scheduler hit an exception", LOST, LAUNCH_HANDLER)


@pytest.mark.parametrize("release", ["0.5.12", "0.5.23"])
def test_sigterm_of_rank_1(sims: Launcher, release: str) -> None:
    """0.5.21+ only log it and wait for rank 0 (engine.py:1258-1273); before, the default
    action ends node 1 and rank 0 fails at its next broadcast."""
    zero, one = pair(sims, release)
    one.proc.send_signal(signal.SIGTERM)
    if release == "0.5.23":
        time.sleep(1)
        assert one.proc.poll() is None and zero.proc.poll() is None
        assert "SIGTERM received on node_rank 1; waiting for the rank-0 ShutdownReq broadcast " \
               "to stop the schedulers." in one.output()
        assert httpx.get(one.url + "/health").status_code == 200
    else:
        assert ended(one) == -signal.SIGTERM
        assert ended(zero) == -signal.SIGKILL
        in_order(zero.output(), LOST, RUNNING_HANDLER)


DP2 = ("--tp-size", "2", "--dp-size", "2")


@pytest.mark.parametrize(("release", "flags", "message"), [
    ("0.5.23", ("--tp-size", "3"), "tp_size must be divisible by number of nodes"),
    ("0.5.12", DP2, "multi-node data parallel is not supported unless dp attention!"),
    ("0.5.23", DP2, "multi-node data-parallel replicas are not supported; use attention DP "
                    "(--attn-dp-size) across nodes"),
])
def test_multi_node_rules(sims: Launcher, release: str, flags: tuple[str, ...],
                          message: str) -> None:
    result = sims.run("--nnodes", "2", "--dist-init-addr", "127.0.0.2:1", *flags,
                      env=version(release))
    assert result.returncode == 1 and f"AssertionError: {message}" in result.stderr, \
        result.stderr[-2000:]
