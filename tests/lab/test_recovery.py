"""Faults a deploy must recover from, on lab hosts: a unit whose start limit was spent by
restarts, a server that dies under its first real batch, a clean stop that must not count as a
failure, and a guest whose nspawn process was killed. (Every fault, timed, is in
``bench/faults.py``.)"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from sglang_fleet_lab import hosts, state
from tests.lab.conftest import address, booted_lab, mounted_here, pyinfra, run, ssh, url

pytestmark = pytest.mark.lab


@pytest.fixture(scope="module")
def lab() -> Iterator[None]:
    yield from booted_lab("--hosts", "2", "--gpus", "1")


def deploy(*data: str) -> tuple[int, str]:
    args = [a for d in data for a in ("--data", d)]
    result = pyinfra("deploys/sglang.py", "--limit", "lab1", *args)
    return result.returncode, result.stdout + result.stderr


def unit(prop: str) -> str:
    return ssh("lab1", f"systemctl show -p {prop} --value sglang.service").stdout.strip()


SERVER = url("lab1", 30000)


def health() -> str:
    return ssh("lab1", f"curl -s -o /dev/null -w '%{{http_code}}' {SERVER}/health").stdout


def test_deploy_soaks_the_server_with_a_full_batch(lab: None) -> None:
    code, out = deploy()
    assert code == 0, out[-4000:]
    found = re.search(r"\[lab1\] soak: (\d+) concurrent requests, all answered in [\d.]+ s; "
                      r"sglang\.service still serving", out)
    capacity = re.search(r"\[lab1\] capacity: .*max running requests (\d+)", out)
    assert found and capacity, out[-3000:]
    assert int(found.group(1)) == 2 * int(capacity.group(1))


def test_restarts_in_a_row_spend_the_start_limit_and_the_next_deploy_recovers(
        lab: None) -> None:
    refused = None
    for attempt in range(12):  # by hand, as an operator would; systemd counts each one
        if ssh("lab1", "systemctl restart sglang.service").returncode != 0:
            refused = attempt
            break
    assert refused is not None and unit("Result") == "start-limit-hit"
    assert health() != "200"
    code, out = deploy()
    assert code == 0, out[-4000:]
    assert "[lab1] sglang.service was found failed (start-limit-hit" in out
    assert health() == "200" and unit("ActiveState") == "active"


def test_a_server_that_dies_under_its_first_batch_fails_the_gate(lab: None) -> None:
    before = unit("MainPID")
    # The warmup, the health check and the smoke's two requests come first (about 4): crashing
    # after 8 lands in the soak's batch of 32, whatever the machine's speed; after 3 it could land
    # in the smoke, which fails the gate too but for another reason.
    code, out = deploy("sglang.memory.max_running_requests=16",
                       "sglang.env.SGLANG_SIM_CRASH_AFTER=\"8\"")
    assert code != 0
    assert re.search(r"\[lab1\] error: soak: \d+ of 32 concurrent requests failed .*"
                     r"sglang\.service died under the soak: .*simulated crash after", out), \
        out[-4000:]
    assert "the last good release serves again" in out
    assert health() == "200" and unit("MainPID") != before
    assert "SGLANG_SIM_CRASH_AFTER" not in ssh("lab1", "cat /etc/sglang/sglang.env").stdout


# A clean stop leaves sglang.service inactive, not failed, whichever way the release ends: 0.5.19+
# exit 0 after draining, 0.5.10 - 0.5.18 SIGKILL their own process tree (the unit's
# SuccessExitStatus=SIGKILL). The simulator imitates the older ending with SGLANG_SIM_VERSION,
# set here by a drop-in on the host.
DROP_IN = "/etc/systemd/system/sglang.service.d/zz-sim-release.conf"


def wait_serving(timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        code = health().strip()
        if code == "200":
            return
        time.sleep(2)
    raise AssertionError("sglang.service did not turn healthy:\n"
                         + ssh("lab1", "journalctl -u sglang -n 30 -o cat").stdout)


def stop_and_check() -> None:
    restarts = unit("NRestarts")
    ssh("lab1", "systemctl stop sglang.service")
    assert unit("ActiveState") == "inactive", ssh("lab1", "systemctl status sglang").stdout
    assert unit("Result") == "success"
    # a stop that was asked for is never restarted, whatever the release's end (systemd decides
    # at once: a restart would show as SubState auto-restart)
    assert unit("SubState") == "dead" and unit("NRestarts") == restarts
    log = ssh("lab1", "journalctl -u sglang -o cat -n 200").stdout
    assert "Draining requests and shutting down..." in log
    assert "Gracefully exiting... Remaining number of requests 0." in log


def with_drop_in(*lines: str) -> None:
    """Extra [Service] lines for sglang.service on lab1, then a (re)start."""
    body = "\\n".join(["[Service]", *lines])
    ssh("lab1", f"mkdir -p {DROP_IN.rsplit('/', 1)[0]} && printf '{body}\\n' > {DROP_IN} "
                "&& systemctl daemon-reload && systemctl restart sglang.service")


def without_drop_in() -> None:
    ssh("lab1", f"rm -f {DROP_IN} && systemctl daemon-reload")


def test_stop_after_exit_0(lab: None) -> None:
    result = pyinfra("deploys/sglang.py", "--limit", "lab1")
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    wait_serving()
    stop_and_check()
    assert unit("ExecMainStatus") == "0"


def test_stop_after_sigkill_of_its_own_tree(lab: None) -> None:
    with_drop_in("Environment=SGLANG_SIM_VERSION=0.5.18")
    try:
        wait_serving()
        stop_and_check()
        assert unit("ExecMainCode") == "2" and unit("ExecMainStatus") == "9"  # killed, SIGKILL
    finally:
        without_drop_in()


def api_key() -> str:
    env = ssh("lab1", "sed -n 's/^SGLANG_API_KEY=//p' /etc/sglang/sglang.env").stdout
    return env.strip().strip("'\"")


def ask(key: str) -> int:
    """One chat request to lab1's server from this machine: its status, 0 if it broke."""
    try:
        return httpx.post(f"{SERVER}/v1/chat/completions", timeout=60,
                          headers={"Authorization": f"Bearer {key}"},
                          json={"max_tokens": 64, "messages": [{"role": "user",
                                                                "content": "hi"}]}).status_code
    except httpx.HTTPError:
        return 0


@pytest.mark.parametrize("release", ["0.5.23", "0.5.18"])
def test_a_stop_under_load_drains_every_request(lab: None, release: str) -> None:
    """systemctl stop while 8 requests of ~5 s each run: every one is answered (KillMode=mixed:
    SIGTERM reaches the server alone, which drains, then ends its children; 0.5.18 ends in
    SIGKILL of itself, 0.5.23 in exit 0)."""
    with_drop_in(f"Environment=SGLANG_SIM_VERSION={release}",
                 "Environment=SGLANG_SIM_DECODE_STEPS_PER_SECOND=4")
    try:
        wait_serving()
        key = api_key()
        with ThreadPoolExecutor(8) as pool:
            answers = [pool.submit(ask, key) for _ in range(8)]
            time.sleep(2)
            stop = ssh("lab1", "systemctl stop sglang.service")
            codes = [a.result() for a in answers]
        assert stop.returncode == 0, stop.stderr
        assert codes == [200] * 8, codes
        assert unit("ActiveState") == "inactive" and unit("Result") == "success"
        log = ssh("lab1", "journalctl -u sglang -o cat -n 300").stdout
        assert re.search(r"Gracefully exiting\.\.\. Remaining number of requests [1-8]\.", log)
        assert "Subprocess" not in log.split("Draining requests")[-1]  # no child died early
    finally:
        without_drop_in()
        ssh("lab1", "systemctl start sglang.service")
        wait_serving()


def deployed() -> None:
    """lab1 serving from a deploy (run on its own, a test finds the module's lab fresh)."""
    if health() != "200":
        code, out = deploy()
        assert code == 0, out[-3000:]
    wait_serving()


def main_pid() -> int:
    return int(unit("MainPID"))


def back_serving(before: int, restarts: int, budget: float) -> float:
    """Seconds until lab1 serves again from a new main process, one automatic restart later."""
    tic = time.monotonic()
    deadline = tic + budget
    while time.monotonic() < deadline:
        if health() == "200" and main_pid() not in (0, before):
            assert unit("NRestarts") == str(restarts + 1)
            return time.monotonic() - tic
        time.sleep(1)
    raise AssertionError(f"not back within {budget:.0f} s:\n"
                         + ssh("lab1", "systemctl status sglang; journalctl -u sglang -n 30 "
                                       "-o cat").stdout)


def restart_sec() -> float:
    return _seconds(unit("RestartUSec"))


def _seconds(span: str) -> float:
    """systemd's time span (``30s``, ``1min 30s``, ``100ms``) in seconds."""
    units = {"min": 60.0, "ms": 0.001, "s": 1.0, "h": 3600.0}
    total = 0.0
    for number, name in re.findall(r"([\d.]+)\s*(min|ms|s|h)", span):
        total += float(number) * units[name]
    return total


READY_BUDGET = 30  # the simulator loads in 2 s and captures in ~2 s; slack for this machine


def test_a_server_killed_with_sigkill_comes_back(lab: None) -> None:
    """kill -9 of the main process (as the OOM killer ends it): restarted after RestartSec, not
    counted clean (SuccessExitStatus=SIGKILL alone made it 'Deactivated successfully', never
    restarted)."""
    wait_serving()
    before, restarts = main_pid(), int(unit("NRestarts"))
    ssh("lab1", f"kill -9 {before}")
    took = back_serving(before, restarts, restart_sec() + READY_BUDGET)
    assert took <= restart_sec() + READY_BUDGET
    rows = status_rows()
    assert rows["lab1"]["restarts"] == restarts + 1
    assert rows["lab1"]["last_crash"] == \
        "killed by SIGKILL, no error logged (the OOM killer, or kill -9)"


def test_a_scheduler_exception_comes_back(lab: None) -> None:
    """The scheduler raises: SIGQUIT to the server, its tree and itself SIGKILLed (as SGLang),
    then systemd restarts it; status names the exception."""
    deployed()
    before, restarts = main_pid(), int(unit("NRestarts"))
    # sglang's own scheduler (a server of one GPU names it sglang::scheduler, no rank)
    assert ssh("lab1", f"pkill -USR1 -P {before} -f '^sglang::scheduler '").returncode == 0
    took = back_serving(before, restarts, restart_sec() + READY_BUDGET)
    assert took <= restart_sec() + READY_BUDGET
    log = ssh("lab1", "journalctl -u sglang -o cat -n 400").stdout
    assert "SIGQUIT received. signum=None, frame=None." in log
    assert "kill_process_tree called" in log
    assert "Scheduled restart job, restart counter is at" in log
    rows = status_rows()
    assert rows["lab1"]["restarts"] == restarts + 1
    assert rows["lab1"]["last_crash"] == ("Scheduler hit an exception: RuntimeError: simulated "
                                          "scheduler exception (SIGUSR1 to the scheduler)")
    # a deploy is a deliberate start: it clears the count
    code, out = deploy()
    assert code == 0, out[-3000:]


def status_rows() -> dict[str, dict[str, object]]:
    result = run("sglang-fleet", "status", "inventories/lab.py", "--json")
    return {r["host"]: r for r in json.loads(result.stdout)
            if r["kind"] == "server" and r["unit"] == "sglang.service"}


def test_a_guest_whose_nspawn_was_killed_is_reported_and_stopped(lab: None) -> None:
    lab2 = next(h for h in state.load().hosts if h.name == "lab2")
    nspawn = int((lab2.dir / "nspawn.pid").read_text())
    guest = hosts.guests()["lab2"]
    os.kill(nspawn, signal.SIGKILL)
    time.sleep(2)
    status = {h["name"]: h for h in json.loads(run("sglang-fleet", "lab", "status",
                                                   "--json").stdout)}
    assert status["lab2"]["state"] == "running without nspawn" and status["lab2"]["running"]
    assert status["lab1"]["state"] == "running"
    assert f"lab2    {address('lab2'):<14}1 GPU  running without nspawn" in \
        run("sglang-fleet", "lab", "status").stdout
    result = run("sglang-fleet", "lab", "down")
    assert result.returncode == 0, result.stderr
    assert "lab2: its guest outlived its nspawn process: powered off" in result.stdout
    assert not hosts.alive(guest) and hosts.guests() == {}
    assert mounted_here() == []
