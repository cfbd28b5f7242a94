"""Three lab hosts behind the real gateway (smg, the default), reached as cloud images are
(root's SSH login refused, a user with passwordless sudo): a hand-started server on a port, the
router deploy, rolling redeploys under load (a good change and a release that fails to start),
and teardown back to a fresh host."""

from __future__ import annotations

import itertools
import json
import re
import shlex
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.lab.conftest import (
    ADMIN_KEY_FILE,
    KEY_FILE,
    ROUTER,
    SSH_DIR,
    address,
    booted_lab,
    compile_seconds,
    pyinfra,
    run,
    ssh,
    url,
)
from tests.lab.load import Background, Load

pytestmark = pytest.mark.lab
HOSTS = ("lab1", "lab2", "lab3")
INSTANCES = 3  # servers per lab host: the shipped profile's instances: auto on its 3 GPUs
BATCH = 2  # --batch-instances: a wave of the first alone (the compile), then one of 2
JIT = 12  # seconds of a cold DeepGEMM compile, far above a warm start's ~4 s
SERVERS = [f"sglang-{i}.service" for i in range(INSTANCES)]
EVERY_WORKER = {url(host, 30000 + k): True for host in HOSTS for k in range(INSTANCES)}
# What teardown must leave as it found it: packages, unit files and the product's paths.
SNAPSHOT = r"""
dpkg-query -W -f '${Package} ${Version}\n' | sort
systemctl list-unit-files --no-legend --no-pager | awk '{print $1, $2}' | sort
for p in /opt/sglang /etc/sglang /var/lib/sglang /var/cache/sglang /var/cache/sglang-fleet \
         /etc/sglang-router \
         /var/lib/sglang-fleet /var/cache/sglang-router /var/cache/private/sglang-router \
         /etc/apt/sources.list.d /etc/apt/preferences.d /etc/apt/apt.conf.d /etc/systemd/system
do echo "== $p"; find $p 2>/dev/null | sort; done
getent passwd sglang; getent group sglang; true
"""


def snapshot(host: str) -> list[str]:
    return ssh(host, SNAPSHOT).stdout.splitlines()


@pytest.fixture(scope="module")
def fresh() -> Iterator[dict[str, list[str]]]:
    """Three booted hosts reached as a sudo user; what they look like before any deploy."""
    for _ in booted_lab("--hosts", "3", "--gpus", str(INSTANCES), "--sudo-user", "deployer"):
        yield {host: snapshot(host) for host in HOSTS}


@pytest.fixture(scope="module")
def fleet(fresh: dict[str, list[str]]) -> dict[str, list[str]]:
    """Deployed as the sudo user (the driver stage reboots the fresh hosts, which ends the server
    test_a_hand_started_server left on lab2)."""
    for deploy in ("deploys/sglang.py", "deploys/router.py"):
        result = pyinfra(deploy)
        assert result.returncode == 0, (result.stdout + result.stderr)[-5000:]
    for host in HOSTS:
        assert ssh(host, "stat -c '%U %a' /etc/sglang/sglang-0.env").stdout.split() == \
            ["root", "600"]
        for secret in (key(), ADMIN_KEY_FILE.read_text().strip()):
            found = ssh(host, f"grep -rlF {shlex.quote(secret)} /tmp /var/tmp /home")
            assert not found.stdout.strip(), f"{host}: a key in {found.stdout}"
    return fresh


def login(user: str) -> int:
    return run("ssh", "-i", str(SSH_DIR / "id_ed25519"), "-o", "BatchMode=yes",
               "-o", f"UserKnownHostsFile={SSH_DIR / 'known_hosts'}",
               "-o", "StrictHostKeyChecking=accept-new", f"{user}@{address('lab1')}",
               "true").returncode


def test_root_login_is_refused_and_the_user_sudoes(fresh: dict[str, list[str]]) -> None:
    assert login("root") != 0
    assert login("deployer") == 0
    assert ssh("lab1", "id -un").stdout.strip() == "root"  # the lab's own access: sudo


def test_a_hand_started_server_stops_the_deploy_before_any_change(
        fresh: dict[str, list[str]]) -> None:
    ssh("lab2", f"setsid -f python3 -m http.server 30000 --bind {address('lab2')} "
                ">/dev/null 2>&1 </dev/null; sleep 1")
    result = pyinfra("deploys/sglang.py")
    out = result.stdout + result.stderr
    assert result.returncode != 0
    # Started over SSH without a login session, it runs in ssh.service's control group here.
    assert re.search(r"host lab2: port 30000: held by pid \d+ \(root, started \w{3} \w{3} .*, "
                     r"(unit ssh\.service|no systemd unit \(started by hand\))\): "
                     r"python3 -m http.server 30000 --bind "
                     rf"{re.escape(address('lab2'))}, not by sglang-0.service", out), out[-3000:]
    assert "replace_stale_servers=true" in out
    for host in HOSTS:
        assert snapshot(host) == fresh[host], host
    ssh("lab2", "pkill -f 'http.server 30000'")


def unchanged(result: subprocess.CompletedProcess[str]) -> bool:
    """A pyinfra run that succeeded without changing anything."""
    out = result.stdout + result.stderr
    if result.returncode or not re.search(r"Grand total\s+\d+\s+-\s+-", out):
        print(out[-3000:])
        return False
    return True


def key() -> str:
    return KEY_FILE.read_text().strip()


def admin_key() -> str:
    return ADMIN_KEY_FILE.read_text().strip()


def starts_since(host: str, since: float, unit: str = "sglang-0.service") -> int:
    """How many times ``unit`` started since ``since`` (epoch seconds)."""
    out = ssh(host, f"journalctl -u {unit} --since @{since:.0f} -o cat --no-pager "
                    f"| grep -c '^Started {unit}' || true").stdout
    return int(out.strip() or 0)


def roll(*data: str, flags: tuple[str, ...] = ()) -> tuple[int, str, Load]:
    args = [*flags, *(a for d in data for a in ("--data", d))]
    with Load(ROUTER, key(), "qwen3.6-27b", rate=25) as load:
        time.sleep(2)
        result = run("sglang-fleet", "roll", "inventories/lab.py", *args, timeout=900)
        time.sleep(2)
    return result.returncode, result.stdout + result.stderr, load


def workers() -> list[dict[str, Any]]:
    """The router's worker list, from its API, without those on their way out (smg lists a
    removed worker as ``draining`` for 5 s)."""
    out = run("curl", "-s", "-H", f"Authorization: Bearer {admin_key()}",
              f"{ROUTER}/workers").stdout
    listed: list[dict[str, Any]] = json.loads(out)["workers"]
    return [w for w in listed if w.get("status") != "draining"]


def router_workers() -> dict[str, bool]:
    return {w["url"]: w["is_healthy"] for w in workers()}


def test_router_routes_to_every_host_with_the_key(fleet: dict[str, list[str]]) -> None:
    assert router_workers() == EVERY_WORKER
    smoke = run("sglang-fleet", "smoke", ROUTER, "--api-key-file", str(KEY_FILE))
    assert smoke.returncode == 0 and "smoke: '4." in smoke.stdout, smoke.stdout + smoke.stderr
    assert run("curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "-X", "POST", "-d", "{}",
               f"{ROUTER}/v1/chat/completions").stdout == "401"
    assert run("curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "-H",
               f"Authorization: Bearer {key()}", f"{ROUTER}/workers").stdout == "401"
    unit = ssh("lab1", "systemctl cat sglang-router.service").stdout
    pid = ssh("lab1", "systemctl show -p MainPID --value sglang-router").stdout.strip()
    cmdline = ssh("lab1", f"tr '\\0' ' ' < /proc/{pid}/cmdline").stdout
    assert pid != "0"
    for secret in (key(), admin_key()):
        assert secret not in unit and secret not in cmdline
    assert ssh("lab1", "stat -c '%U %a' /etc/sglang/sglang-router.env").stdout.strip() == \
        "root 600"
    assert unchanged(pyinfra("deploys/router.py"))


def test_router_deploy_puts_a_missing_worker_back_without_a_restart(
        fleet: dict[str, list[str]]) -> None:
    pid = ssh("lab1", "systemctl show -p MainPID --value sglang-router").stdout.strip()
    lab3 = next(w["id"] for w in workers() if w["url"] == url("lab3", 30000))
    run("curl", "-s", "-X", "DELETE", "-H", f"Authorization: Bearer {admin_key()}",
        f"{ROUTER}/workers/{lab3}")
    time.sleep(1)
    assert url("lab3", 30000) not in router_workers()
    result = pyinfra("deploys/router.py")
    assert result.returncode == 0, result.stderr[-3000:]
    assert re.search(rf"Router routes to {3 * INSTANCES} workers\s+1\s+1\s", result.stderr), \
        result.stderr[-2000:]
    time.sleep(1)
    assert router_workers() == EVERY_WORKER
    assert ssh("lab1", "systemctl show -p MainPID --value sglang-router").stdout.strip() == pid


def test_a_deploy_replaces_a_hand_started_server_when_asked(
        fleet: dict[str, list[str]]) -> None:
    ssh("lab2", "systemctl stop sglang-0.service; setsid -f python3 -m http.server 30000 "
                f"--bind {address('lab2')} >/dev/null 2>&1 </dev/null; sleep 1")
    refused = pyinfra("deploys/sglang.py", "--limit", "lab2")
    assert refused.returncode != 0 and "port 30000: held by pid" in refused.stdout + \
        refused.stderr
    result = pyinfra("deploys/sglang.py", "--limit", "lab2", "--data", "replace_stale_servers=true")
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-5000:]
    assert re.search(r"\[lab2\] stopping pid \d+ .*python3 -m http.server 30000", out), out[-3000:]
    assert ssh("lab2", "pgrep -f 'http[.]server 30000'").returncode != 0
    assert "[lab2] sglang-0.service: health: /health_generate 200" in out
    deadline = time.monotonic() + 60
    while not router_workers().get(url("lab2", 30000)) and time.monotonic() < deadline:
        time.sleep(1)
    assert all(router_workers().values())


def test_roll_restarts_each_host_once_without_a_failed_request(
        fleet: dict[str, list[str]]) -> None:
    since = time.time()
    code, out, load = roll("sglang.memory.max_running_requests=40")
    assert code == 0, out[-5000:]
    assert "order: lab1 → lab2 → lab3" in out
    for host in HOSTS:
        assert starts_since(host, since) == 1, host
        row = re.search(rf"^{host}\s+converged\s+(\d+)\s+([\d.]+)$", out, re.M)
        assert row, out[-2000:]
        # out of the router: the restart (the simulator's load and capture) and the health
        # wait, never more than the host's whole batch
        assert 3 <= float(row.group(2)) <= int(row.group(1)) + 1, row.group(0)
        assert re.search(rf"{host}: out of the router for {row.group(2)} s", out)
    assert load.sent / load.seconds >= 20
    assert load.failed == 0, load.errors[:5]
    assert router_workers() == EVERY_WORKER


def test_release_failing_to_start_stops_the_roll_at_the_first_host(
        fleet: dict[str, list[str]]) -> None:
    since = time.time()
    code, out, load = roll("sglang.engine.version=0.5.22",
                           "sglang.env.SGLANG_SIM_FAIL_STARTUP=simulated startup failure")
    assert code != 0
    assert re.search(r"^lab1\s+failed, last good release serving again", out, re.M), out[-4000:]
    for host in ("lab2", "lab3"):
        assert re.search(rf"^{host}\s+untouched", out, re.M)
        assert starts_since(host, since) == 0, host
    assert "sglang-sim-0.5.23" in ssh("lab1", "readlink /opt/sglang/current").stdout
    assert "SGLANG_SIM_FAIL_STARTUP" not in ssh("lab1", "cat /etc/sglang/sglang-0.env").stdout
    assert load.sent / load.seconds >= 20
    assert load.failed == 0, load.errors[:5]
    assert router_workers() == EVERY_WORKER


class Healthy(Background):
    """The fewest healthy workers the router listed while a roll ran (polled every 0.5 s)."""

    def __init__(self) -> None:
        super().__init__()
        self.fewest: int | None = None

    def _run(self) -> None:
        while not self.stopping.is_set():
            try:
                healthy = sum(router_workers().values())
            except (ValueError, KeyError):  # the router answering mid-change: look again
                healthy = None
            if healthy is not None:
                self.fewest = healthy if self.fewest is None else min(self.fewest, healthy)
            self.stopping.wait(0.5)


def test_roll_with_batch_instances_keeps_each_host_serving(
        fleet: dict[str, list[str]]) -> None:
    """Three servers per host (instances: auto), restarted two at a time onto kernels whose
    cold compile costs 12 s: only the restarting servers leave the router (never fewer than
    9 - 2 healthy), each wave back before the next; on each host the first server compiles
    alone and the others start from its cache; no request fails. A release that fails to
    start then stops at lab1's first server, the others untouched."""
    assert len(router_workers()) == 3 * INSTANCES and all(router_workers().values())
    since = time.time()
    # warm-up off (and no spare GPU anyway): the first server of each host must compile
    jit = ("sglang.warmup=off", f"sglang.env.SGLANG_SIM_JIT_SECONDS=\"{JIT}\"")
    with Healthy() as healthy:
        code, out, load = roll(*jit, flags=("--batch-instances", str(BATCH)))
    assert code == 0, out[-5000:]
    assert healthy.fewest is not None and healthy.fewest >= 3 * INSTANCES - BATCH, healthy.fewest
    assert load.failed == 0, load.errors[:5]
    assert load.sent / load.seconds >= 20
    for host in HOSTS:
        for unit in SERVERS:
            assert starts_since(host, since, unit) == 1, (host, unit)
        first = compile_seconds(host, SERVERS[0], since)
        assert first and sum(first) >= JIT - 2, (host, first)  # it compiled
        for unit in SERVERS[1:]:  # from the cache the first one wrote: nothing to wait for
            assert compile_seconds(host, unit, since) and \
                max(compile_seconds(host, unit, since)) <= 1, (host, unit)
        row = re.search(rf"^{host}\s+converged\s+(\d+)\s+([\d.]+)$", out, re.M)
        assert row, out[-3000:]
        below = itertools.takewhile(lambda line: line.startswith(" "),
                                    out[row.end() + 1:].splitlines())  # the host's own lines
        waves = [m.groups() for m in (re.match(r"\s+wave (\d) out of the router ([\d.]+) s: "
                                               r"(.+)$", line) for line in below) if m]
        after = [list(range(k, min(k + BATCH, INSTANCES))) for k in range(1, INSTANCES, BATCH)]
        assert [(n, urls) for n, _, urls in waves] == [
            (str(w + 1), ", ".join(url(host, 30000 + k) for k in ports))
            for w, ports in enumerate([[0], *after])], out[-3000:]
        assert float(row.group(2)) == max(float(s) for _, s, _ in waves)
        assert float(waves[0][1]) >= JIT  # the compile, out of the router alone
    assert len(router_workers()) == 3 * INSTANCES and all(router_workers().values())

    since = time.time()
    pids = {u: ssh("lab1", f"systemctl show -p MainPID --value {u}").stdout.strip()
            for u in SERVERS[1:]}
    code, out, load = roll("sglang.engine.version=0.5.22",
                           "sglang.env.SGLANG_SIM_FAIL_STARTUP=simulated startup failure",
                           flags=("--batch-instances", str(BATCH)))
    assert code != 0
    assert re.search(r"^lab1\s+failed, last good release serving again", out, re.M), \
        out[-4000:]
    assert "[lab1] sglang-0.service is not ready: the servers after it keep what they run" \
        in out, out[-4000:]
    for unit, pid in pids.items():  # never changed, never restarted
        assert ssh("lab1", f"systemctl show -p MainPID --value {unit}").stdout.strip() == pid
        assert starts_since("lab1", since, unit) == 0, unit
        assert "SGLANG_SIM_FAIL_STARTUP" not in ssh(
            "lab1", f"cat /etc/sglang/{unit.removesuffix('.service')}.env").stdout
    assert "sglang-sim-0.5.23" in ssh("lab1", "readlink /opt/sglang/current").stdout
    for host in ("lab2", "lab3"):
        assert re.search(rf"^{host}\s+untouched", out, re.M)
    assert load.failed == 0, load.errors[:5]
    assert len(router_workers()) == 3 * INSTANCES and all(router_workers().values())
    # No roll back to the inventory's profile: the teardown test after this purges the hosts
    # and deploys that profile afresh.


def test_teardown_purges_back_to_a_fresh_host_and_deploy_works_again(
        fleet: dict[str, list[str]]) -> None:
    kept = pyinfra("deploys/teardown.py", "--limit", "lab3")
    assert kept.returncode == 0, kept.stdout[-3000:]
    assert url("lab3", 30000) not in router_workers()
    assert ssh("lab3", "systemctl cat sglang-0.service").returncode != 0
    assert ssh("lab3", "ls /etc/sglang/sglang-0.env").returncode != 0
    assert ssh("lab3", "ls /opt/sglang/releases /var/lib/sglang/models").stdout.strip()
    assert ssh("lab3", "dpkg -s nvidia-open-580").returncode == 0

    purge = pyinfra("deploys/teardown.py", "--data", "purge=engine,weights,driver")
    assert purge.returncode == 0, purge.stdout[-3000:]
    for host in HOSTS:
        assert snapshot(host) == fleet[host], host
    assert unchanged(pyinfra("deploys/teardown.py", "--data", "purge=engine,weights,driver"))

    for deploy in ("deploys/sglang.py", "deploys/router.py"):
        result = pyinfra(deploy)
        assert result.returncode == 0, (result.stdout + result.stderr)[-5000:]
    assert router_workers() == EVERY_WORKER


def test_unknown_purge_is_refused_before_any_change(fleet: dict[str, list[str]]) -> None:
    result = pyinfra("deploys/teardown.py", "--data", "purge=engine,models")
    out = result.stdout + result.stderr
    assert result.returncode != 0
    assert "purge: unknown 'models'" in out and "fix: a comma-separated subset" in out
    assert "Traceback" not in out
    assert ssh("lab1", "systemctl is-active sglang-0.service").stdout.strip() == "active"
