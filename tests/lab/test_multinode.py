"""A multi-node group on the lab (``inventories/lab_multinode.py``): lab1 and lab2 serve one
server of the shipped profile at tp 16 (rank 0 on lab1, rank 1 on lab2, 8 GPUs each), lab3 one
server of its own beside it (a second worker, so that a roll of the group keeps the fleet
serving). The group's deploy and gate, the router holding rank 0 alone, a rank killed and the
group restarting whole by itself, a rank that never starts failing the gate by name, a roll
under load without a failed request, and teardown rank 0 first."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.lab.conftest import ADMIN_KEY_FILE, KEY_FILE, ROUTER, address, booted_lab, run, ssh, url
from tests.lab.load import Load

pytestmark = pytest.mark.lab
INVENTORY = "inventories/lab_multinode.py"
GROUP = ("lab1", "lab2")  # rank order
HOSTS = (*GROUP, "lab3")
UNIT = "sglang.service"  # a member runs one server; lab3 one too (instances 1)
RANK0 = url("lab1", 30000)
WORKERS = {RANK0: True, url("lab3", 30000): True}  # never lab2's: a dummy health server
MODEL = "qwen3.6-27b"
RECOVERY_BOUND = 180  # seconds from rank 1's kill until the group serves through the router
# lab2's start made to fail (test_a_rank_that_never_starts_fails_the_gate_by_name)
HELD_BACK = "/etc/systemd/system/sglang.service.d/zz-held-back.conf"


@pytest.fixture(scope="module")
def lab() -> Iterator[None]:
    yield from booted_lab("--hosts", str(len(HOSTS)), "--gpus", "8")


def pyinfra(*argv: str) -> tuple[int, str]:
    result = run("pyinfra", "-y", INVENTORY, *argv)
    return result.returncode, result.stdout + result.stderr


def deploy(*data: str) -> tuple[int, str]:
    return pyinfra("deploys/sglang.py", *(a for d in data for a in ("--data", d)))


def unit(host: str, prop: str) -> str:
    return str(ssh(host, f"systemctl show -p {prop} --value {UNIT}").stdout).strip()


def key() -> str:
    return KEY_FILE.read_text().strip()


def workers() -> dict[str, bool]:
    """The router's workers by URL (healthy or not), without those smg lists as draining."""
    out = run("curl", "-s", "-H", f"Authorization: Bearer {ADMIN_KEY_FILE.read_text().strip()}",
              f"{ROUTER}/workers").stdout
    listed: list[dict[str, Any]] = json.loads(out)["workers"]
    return {w["url"]: w["is_healthy"] for w in listed if w.get("status") != "draining"}


def chat(base: str) -> httpx.Response:
    return httpx.post(f"{base}/v1/chat/completions", timeout=60,
                      headers={"Authorization": f"Bearer {key()}"},
                      # past the simulator's 32 reasoning tokens, into the answer
                      json={"model": MODEL, "max_tokens": 96,
                            "messages": [{"role": "user", "content": "What is 2+2?"}]})


def starts_since(host: str, since: float) -> int:
    """How many times sglang.service started since ``since`` (epoch seconds)."""
    out = ssh(host, f"journalctl -u {UNIT} --since @{since:.0f} -o cat --no-pager "
                    f"| grep -c '^Started {UNIT}' || true").stdout
    return int(out.strip() or 0)


@pytest.fixture(scope="module")
def group(lab: None) -> str:
    """The group and lab3 deployed and gated, then the router in front: the deploy's output."""
    code, out = deploy()
    assert code == 0, out[-6000:]
    code, routed = pyinfra("deploys/router.py")
    assert code == 0, routed[-4000:]
    return out


def test_the_group_passes_its_gate_and_the_router_holds_rank_0_alone(group: str) -> None:
    out = group
    # rank 1 by its journal's start line, on its own address and port
    # (the start line as the journal has it, after the server's own time prefix)
    assert re.search(rf"\[lab2\] {UNIT}: .*Dummy health check server started in background "
                     rf"thread at {re.escape(address('lab2'))}:30000", out), out[-6000:]
    # rank 0 by the full gate, once rank 1 was seen started
    for host in ("lab1", "lab3"):
        assert f"[{host}] health: /health_generate 200" in out
        assert re.search(rf"\[{host}\] smoke: '4\..*', TTFT \d+ ms", out), out[-4000:]
    assert re.search(r"\[lab2\] health:", out) is None  # its HTTP is never evidence
    argv = ssh("lab2", f"systemctl show -p ExecStart --value {UNIT}").stdout
    assert re.search(r"--tp-size 16 .*--nnodes 2|--nnodes 2 .*--tp-size 16", argv), argv
    assert "--node-rank 1 " in argv and f"--dist-init-addr {address('lab1')}:" in argv, argv
    # 16 TP ranks, 8 on each host
    for host, first in (("lab1", 0), ("lab2", 8)):
        titles = [line.split()[0] for line in ssh(host, "ps -u sglang -o args=").stdout
                  .splitlines() if line.startswith("sglang::scheduler")]
        assert sorted(titles) == sorted(f"sglang::scheduler_TP{first + k}" for k in range(8)), \
            titles

    assert workers() == WORKERS
    answered = chat(ROUTER)
    assert answered.status_code == 200, answered.text
    assert "4" in answered.json()["choices"][0]["message"]["content"], answered.text
    # rank 1 answers no API (SGLang's dummy health server): never a worker
    dummy = httpx.get(f"{url('lab2', 30000)}/v1/models", timeout=10)
    assert dummy.status_code == 404 and dummy.json() == {"detail": "Not Found"}


def test_a_killed_rank_1_restarts_the_whole_group(group: str) -> None:
    """kill -9 of rank 1's server: systemd restarts it (RestartSec), rank 0 loses its peer
    (gloo's closed connection, at once while idle), crashes and is restarted too; they meet
    again at the rendezvous and the router takes rank 0 back by its health checks."""
    pids = {h: unit(h, "MainPID") for h in GROUP}
    restarts = {h: int(unit(h, "NRestarts")) for h in GROUP}
    tic = time.monotonic()
    assert ssh("lab2", f"kill -9 {pids['lab2']}").returncode == 0
    recovered = None
    while time.monotonic() - tic < RECOVERY_BOUND + 60:
        again = all(unit(h, "MainPID") not in ("0", pids[h]) for h in GROUP) and \
            all(int(unit(h, "NRestarts")) > restarts[h] for h in GROUP)
        if again and workers().get(RANK0):
            try:
                if chat(ROUTER).status_code == 200:
                    recovered = time.monotonic() - tic
                    break
            except httpx.HTTPError:
                pass
        time.sleep(2)
    print(f"rank 1 killed: the group served through the router again after "
          f"{recovered if recovered is None else round(recovered, 1)} s")
    assert recovered is not None and recovered <= RECOVERY_BOUND, recovered
    for host in GROUP:  # each restarted once, by systemd
        assert int(unit(host, "NRestarts")) == restarts[host] + 1, host
    rank0 = ssh("lab1", f"journalctl -u {UNIT} -n 400 -o cat --no-pager").stdout
    assert "Connection closed by peer" in rank0  # rank 0 lost its peer, not a stop
    assert "Dummy health check server started" in ssh(
        "lab2", f"journalctl _SYSTEMD_INVOCATION_ID={unit('lab2', 'InvocationID')} -o cat").stdout
    assert workers() == WORKERS


def test_a_roll_of_the_group_under_load_fails_no_request(group: str) -> None:
    """The group is one unit of the roll (out of the router together: rank 0's URL), lab3 the
    next; lab3 serves while the group restarts, the group while lab3 does."""
    since = time.time()
    with Load(ROUTER, key(), MODEL, rate=10) as load:
        time.sleep(2)
        rolled = run("sglang-fleet", "roll", INVENTORY, "--data",
                     "sglang.memory.max_running_requests=40", timeout=900)
        time.sleep(2)
    out = rolled.stdout + rolled.stderr
    print(out[-2500:])
    print(f"roll: {load.sent} requests in {load.seconds:.0f} s, {load.failed} failed")
    assert rolled.returncode == 0, out[-6000:]
    assert "order: lab1 → lab2 → lab3 (2 batches)" in out, out[:2000]
    for host in HOSTS:
        assert re.search(rf"^{host}\s+converged", out, re.M), out[-3000:]
        assert starts_since(host, since) == 1, host  # the group restarted once, whole
    assert load.failed == 0, load.errors[:5]
    assert load.sent / load.seconds >= 8
    assert workers() == WORKERS
    info = httpx.get(f"{RANK0}/server_info", timeout=10,
                     headers={"Authorization": f"Bearer {key()}"}).json()
    assert info["max_running_requests"] == 40


def held_back(on: bool) -> None:
    """lab2's sglang.service made to fail before its server starts (or no longer)."""
    if on:
        body = "[Service]\\nExecStartPre=/bin/sh -c 'echo held back by the test >&2; exit 1'"
        ssh("lab2", f"mkdir -p {HELD_BACK.rsplit('/', 1)[0]} && printf \"{body}\\n\" > "
                    f"{HELD_BACK} && systemctl daemon-reload")
    else:
        ssh("lab2", f"rm -f {HELD_BACK} && systemctl daemon-reload")


def test_a_rank_that_never_starts_fails_the_gate_by_name(group: str) -> None:
    """A change restarts the group; lab2's start fails (its server never runs): the gate fails
    naming lab2, rank 1, and the deploy fails. Without the fault the next deploy serves."""
    held_back(True)
    try:
        tic = time.monotonic()
        code, out = deploy("sglang.memory.max_running_requests=24",
                           "startup_budget_seconds=120")
        print(f"a rank that never started: the deploy failed after "
              f"{time.monotonic() - tic:.0f} s")
    finally:
        held_back(False)
    assert code != 0, out[-6000:]
    assert re.search(r"\[lab1\] .*lab2 \(rank 1 of group lab-tp16\)", out), out[-6000:]
    code, out = deploy()
    assert code == 0, out[-6000:]
    assert re.search(rf"\[lab2\] {UNIT}: .*Dummy health check server started", out)
    deadline = time.monotonic() + 60
    while workers() != WORKERS and time.monotonic() < deadline:
        time.sleep(2)
    assert workers() == WORKERS
    assert chat(ROUTER).status_code == 200


DOWN = re.compile(r"^Stopping |: (Deactivated successfully|Main process exited|Failed with)")


def went_down_at(host: str, since: float) -> float:
    """When sglang.service on ``host`` began to go down since ``since`` (journald's time of the
    first stop job or exit of its unit, epoch seconds): a stop asked for, or its own end."""
    out = ssh(host, f"journalctl -u {UNIT} --since @{since:.0f} -o json --no-pager").stdout
    for line in out.splitlines():
        entry = json.loads(line)
        if isinstance(entry.get("MESSAGE"), str) and DOWN.search(entry["MESSAGE"]):
            return int(entry["__REALTIME_TIMESTAMP"]) / 1e6
    raise AssertionError(f"{host}: {UNIT} never went down since {since}")


def test_teardown_stops_rank_0_first_and_leaves_no_unit(group: str) -> None:
    since = time.time()
    code, out = pyinfra("deploys/teardown.py")
    assert code == 0, out[-6000:]
    # rank 0 first: its drained stop ends rank 1 with SGLang's ShutdownReq (exit 0), not a
    # lost peer
    assert went_down_at("lab1", since) <= went_down_at("lab2", since)
    assert re.search(r"lab1 \(rank 0 of group lab-tp16\): stopping sglang\.service", out), \
        out[-4000:]
    rank1 = ssh("lab2", f"journalctl -u {UNIT} --since @{since:.0f} -o cat --no-pager").stdout
    assert "terminated with 0" in rank1 and "Connection closed by peer" not in rank1, rank1
    for host in HOSTS:  # no unit file, nothing running (systemd may still name a removed
        # unit "not-found inactive" until it forgets it)
        units = ssh(host, "systemctl list-unit-files --no-legend 'sglang*'; systemctl "
                          "list-units --all --no-legend 'sglang*' | grep -v 'not-found inactive'"
                    ).stdout
        assert units.strip() == "", (host, units)
