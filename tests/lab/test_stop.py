"""A clean stop leaves sglang.service inactive, not failed, whichever way the release ends: 0.5.19+
exit 0 after draining, 0.5.10 - 0.5.18 SIGKILL their own process tree (the unit's
SuccessExitStatus=SIGKILL). The simulator imitates the older ending with SGLANG_SIM_VERSION, set
here by a drop-in on the host."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from tests.lab.conftest import booted_lab, pyinfra, ssh

pytestmark = pytest.mark.lab
HOST = "lab1"
DROP_IN = "/etc/systemd/system/sglang.service.d/zz-sim-release.conf"


@pytest.fixture(scope="module")
def lab() -> Iterator[None]:
    yield from booted_lab("--hosts", "1")


def unit(prop: str) -> str:
    return ssh(HOST, f"systemctl show -p {prop} --value sglang.service").stdout.strip()


def wait_serving(timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        code = ssh(HOST, "curl -s -o /dev/null -w '%{http_code}' "
                         "http://127.0.0.11:30000/health").stdout.strip()
        if code == "200":
            return
        time.sleep(2)
    raise AssertionError("sglang.service did not turn healthy:\n"
                         + ssh(HOST, "journalctl -u sglang -n 30 -o cat").stdout)


def stop_and_check() -> None:
    ssh(HOST, "systemctl stop sglang.service")
    assert unit("ActiveState") == "inactive", ssh(HOST, "systemctl status sglang").stdout
    assert unit("Result") == "success"
    log = ssh(HOST, "journalctl -u sglang -o cat -n 200").stdout
    assert "Draining requests and shutting down..." in log
    assert "Gracefully exiting... Remaining number of requests 0." in log


def test_stop_after_exit_0(lab: None) -> None:
    result = pyinfra("deploys/sglang.py", "--limit", HOST)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    wait_serving()
    stop_and_check()
    assert unit("ExecMainStatus") == "0"


def test_stop_after_sigkill_of_its_own_tree(lab: None) -> None:
    ssh(HOST, f"mkdir -p {DROP_IN.rsplit('/', 1)[0]} && printf '[Service]\\n"
              f"Environment=SGLANG_SIM_VERSION=0.5.18\\n' > {DROP_IN} && systemctl daemon-reload"
              " && systemctl start sglang.service")
    try:
        wait_serving()
        stop_and_check()
        assert unit("ExecMainCode") == "2" and unit("ExecMainStatus") == "9"  # killed, SIGKILL
    finally:
        ssh(HOST, f"rm -f {DROP_IN} && systemctl daemon-reload")
