"""Hosts as cloud B200 images come: root's SSH login refused, a user with passwordless sudo. The
converge, the router, a roll and teardown all run as that user, and no secret passes through a
file another user could read."""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.lab.conftest import booted_lab, pyinfra, run, ssh

pytestmark = pytest.mark.lab
STATE = Path("/var/lib/sglang-fleet-lab")
KEYS = [STATE / "ssh" / "api-key", STATE / "ssh" / "admin-key"]


@pytest.fixture(scope="module")
def lab() -> Iterator[None]:
    yield from booted_lab("--hosts", "2", "--sudo-user", "deployer")


def login(user: str) -> int:
    return run("ssh", "-i", str(STATE / "ssh" / "id_ed25519"), "-o", "BatchMode=yes",
               "-o", f"UserKnownHostsFile={STATE / 'ssh' / 'known_hosts'}",
               "-o", "StrictHostKeyChecking=accept-new", f"{user}@127.0.0.11", "true").returncode


def no_key_in_temporary_files() -> None:
    for key in (path.read_text().strip() for path in KEYS):
        for host in ("lab1", "lab2"):
            found = ssh(host, f"grep -rlF {shlex.quote(key)} /tmp /var/tmp /home 2>/dev/null")
            assert not found.stdout.strip(), f"{host}: {found.stdout}"


def test_root_login_is_refused_and_the_user_sudoes(lab: None) -> None:
    assert login("root") != 0
    assert login("deployer") == 0
    assert ssh("lab1", "id -un").stdout.strip() == "root"  # the lab's own access: sudo


def test_a_hand_started_server_stops_the_deploy_before_any_change(lab: None) -> None:
    ssh("lab2", "setsid -f python3 -m http.server 30000 --bind 127.0.0.12 "
                ">/dev/null 2>&1 </dev/null; sleep 1")
    result = pyinfra("deploys/sglang.py")
    out = result.stdout + result.stderr
    assert result.returncode != 0
    assert re.search(r"host lab2: port 30000: held by pid \d+ \(root, started .*, no systemd "
                     r"unit \(started by hand\)\): python3 -m http.server 30000", out), out[-3000:]
    assert "replace_stale_servers=true" in out
    for host in ("lab1", "lab2"):
        assert ssh(host, "test -e /opt/sglang -o -e /etc/sglang").returncode != 0


def test_converge_and_router_as_the_sudo_user(lab: None) -> None:
    outputs = []
    for deploy in ("deploys/sglang.py", "deploys/router.py"):
        result = pyinfra(deploy, "--data", "replace_stale_servers=true")
        outputs.append(result.stdout + result.stderr)
        assert result.returncode == 0, outputs[-1][-5000:]
    assert re.search(r"\[lab2\] stopping pid \d+ .*python3 -m http.server 30000", outputs[0])
    assert ssh("lab2", "pgrep -f 'http.server 30000'").returncode != 0
    for host in ("lab1", "lab2"):
        assert f"[{host}] health: /health_generate 200" in outputs[0]
        assert f"[{host}] smoke: '4" in outputs[0]
    assert "[lab1] router http://127.0.0.11:30080: 2/2 workers healthy" in outputs[1] or \
        "Router routes to 2 workers" in outputs[1]
    again = pyinfra("deploys/sglang.py")
    assert again.returncode == 0 and "Grand total" in again.stdout
    assert ssh("lab1", "stat -c '%U %a' /etc/sglang/sglang.env").stdout.split() == ["root", "600"]
    no_key_in_temporary_files()


def test_roll_as_the_sudo_user(lab: None) -> None:
    result = run("sglang-fleet", "roll", "inventories/lab.py", "--data",
                 "sglang.memory.max_running_requests=16", timeout=900)
    assert result.returncode == 0, (result.stdout + result.stderr)[-5000:]
    info = ssh("lab2", "systemctl show -p ExecStart --value sglang.service").stdout
    assert "--max-running-requests 16" in info


def test_teardown_as_the_sudo_user(lab: None) -> None:
    result = pyinfra("deploys/teardown.py", "--data", "purge=engine,weights")
    assert result.returncode == 0, (result.stdout + result.stderr)[-5000:]
    assert ssh("lab1", "test -e /etc/sglang || test -e /opt/sglang").returncode != 0
    no_key_in_temporary_files()
