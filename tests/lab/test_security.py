"""Security on a shared host: an unprivileged user in ``adm`` and ``systemd-journal`` finds no key
in any command line, unit, status or journal line; the server and the router keep their keys to
themselves; systemd runs hostile strings literally; the units' exposure is measured; teardown
leaves no key behind."""

from __future__ import annotations

import base64
import json
import re
import shlex
from collections.abc import Iterator

import pytest

from sglang_fleet.ops.unitfile import env_line, systemd_word
from tests.lab.conftest import ROUTER, SSH_DIR, booted_lab, pyinfra, ssh, url
from tests.unit.test_hostile import CONTROL, HOSTILE

pytestmark = pytest.mark.lab
AUDITOR = "runuser -u auditor -- "


def keys() -> dict[str, str]:
    return {name: (SSH_DIR / f"{name}-key").read_text().strip() for name in ("api", "admin")}


@pytest.fixture(scope="module")
def fleet() -> Iterator[None]:
    for _ in booted_lab("--hosts", "2", "--gpus", "1"):
        for deploy in ("deploys/sglang.py", "deploys/router.py"):
            result = pyinfra(deploy, "--data", "sglang_allowed_clients=[\"10.20.0.0/16\"]")
            assert result.returncode == 0, (result.stdout + result.stderr)[-5000:]
            assert not set(keys().values()) & set(re.findall(r"[\w-]{16,}", result.stdout))
        ssh("lab1", "useradd -m -G adm,systemd-journal auditor")
        yield


def as_auditor(command: str) -> str:
    result = ssh("lab1", AUDITOR + f"sh -c {shlex.quote(command)}")
    return result.stdout + result.stderr


@pytest.mark.parametrize("command", [
    "ps -eo args", "systemctl status --no-pager -l sglang.service sglang-router.service",
    "systemctl show -p ExecStart sglang.service sglang-router.service",
    "cat /etc/systemd/system/sglang.service /etc/systemd/system/sglang-router.service",
    "journalctl -u sglang.service -u sglang-router.service --no-pager -o cat",
    "cat /proc/$(systemctl show -p MainPID --value sglang.service)/cmdline",
    "cat /proc/$(systemctl show -p MainPID --value sglang.service)/environ",
])
def test_another_user_finds_no_key(fleet: None, command: str) -> None:
    seen = as_auditor(command)
    assert seen.strip()
    for name, key in keys().items():
        assert key not in seen, f"the {name} key is visible to {command!r}"


def test_the_journal_shows_server_args_with_the_key_masked(fleet: None) -> None:
    journal = as_auditor("journalctl -u sglang.service --no-pager -o cat")
    line = next(line for line in journal.splitlines() if "server_args=" in line)
    # ServerArgs(api_key='…') up to 0.5.18, {'api_key': '…'} from 0.5.19: the key masked either way.
    assert re.search(r"api_key'?(=|: )'<redacted>'", line), line[:300]


def test_server_info_masks_the_key_for_clients(fleet: None) -> None:
    key = keys()["api"]
    out = ssh("lab1", f"curl -s -H 'Authorization: Bearer {key}' "
                      f"{url('lab1', 30000)}/server_info").stdout
    info = json.loads(out)
    assert info["api_key"] == "*" * len(key) and key not in out


def test_the_router_takes_worker_changes_from_the_admin_key_only(fleet: None) -> None:
    codes = {}
    for name, key in keys().items():
        codes[name] = ssh("lab1", f"curl -s -o /dev/null -w '%{{http_code}}' "
                                  f"-H 'Authorization: Bearer {key}' {ROUTER}/workers").stdout
    assert codes == {"api": "401", "admin": "200"}


def test_units_carry_the_client_allow_list(fleet: None) -> None:
    for unit in ("sglang.service", "sglang-router.service"):
        shown = ssh("lab1", f"systemctl show -p IPAddressAllow -p IPAddressDeny {unit}").stdout
        values = dict(line.split("=", 1) for line in shown.splitlines() if "=" in line)
        # systemd lists each set in no fixed order.
        assert "10.20.0.0/16" in values["IPAddressAllow"].split(), shown
        assert set(values["IPAddressDeny"].split()) == {"0.0.0.0/0", "::/0"}, shown


def test_the_service_cannot_change_what_root_runs_or_stages(fleet: None) -> None:
    owners = ssh("lab1", "stat -c '%n %U %a' /opt/sglang /opt/sglang/tools /var/lib/sglang "
                         "/var/lib/sglang/models /var/cache/sglang-fleet "
                         "/var/cache/sglang-fleet/uv /etc/sglang").stdout.split("\n")
    assert [line.split()[1:] for line in owners if line] == [
        ["root", "755"], ["root", "755"], ["root", "755"], ["root", "755"], ["root", "700"],
        ["root", "700"], ["root", "700"]]
    for target in ("/var/lib/sglang/models/planted", "/var/lib/sglang/planted",
                   "/opt/sglang/tools/planted", "/var/cache/sglang-fleet/uv/planted"):
        assert ssh("lab1", f"runuser -u sglang -- touch {target}").returncode != 0, target
    assert ssh("lab1", "runuser -u sglang -- touch /var/cache/sglang/x "
                       "/var/lib/sglang/state/x").returncode == 0


def test_exposure_scores(fleet: None) -> None:
    for unit in ("sglang.service", "sglang-router.service"):
        out = ssh("lab1", f"systemd-analyze security --no-pager {unit} | tail -1").stdout
        score = float(re.search(r"exposure level for \S+: (\d+\.\d+)", out).group(1))  # type: ignore[union-attr]
        print(f"{unit}: systemd-analyze security {score}")
        assert score <= 2.0, out


def test_systemd_passes_hostile_words_and_values_literally(fleet: None) -> None:
    words = [w for w in HOSTILE if "\x00" not in w]
    values = {f"H_{i}": v for i, v in enumerate(HOSTILE) if not CONTROL.search(v)}
    code = ("import json, os, sys; json.dump({'argv': sys.argv[1:], 'env': {k: v for k, v in "
            "os.environ.items() if k.startswith('H_')}}, open('/run/hostile.json', 'w'))")
    unit = ("[Service]\nType=oneshot\nEnvironmentFile=/run/hostile.env\nExecStart="
            + " ".join(systemd_word(w) for w in ["/usr/bin/python3", "-c", code, *words]) + "\n")
    env = "".join(env_line(k, v) + "\n" for k, v in values.items())
    for path, text in (("/etc/systemd/system/hostile.service", unit), ("/run/hostile.env", env)):
        blob = base64.b64encode(text.encode()).decode()
        ssh("lab1", f"echo {blob} | base64 -d > {path}")
    result = ssh("lab1", "rm -f /tmp/pwned; systemctl daemon-reload && systemctl start "
                         "hostile.service && cat /run/hostile.json; test ! -e /tmp/pwned")
    assert result.returncode == 0, result.stdout + result.stderr
    got = json.loads(result.stdout)
    assert got == {"argv": words, "env": values}


def test_teardown_leaves_no_key(fleet: None) -> None:
    result = pyinfra("deploys/teardown.py", "--data", "purge=engine,weights,driver")
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-5000:]
    for line in ("removing sglang.service and its secret file /etc/sglang/sglang.env",
                 "removing sglang-router.service and its secret file "
                 "/etc/sglang/sglang-router.env",
                 "removing secret file /etc/sglang/aws-credentials",
                 "removing secret file /etc/sglang/last-good/sglang.service.env"):
        assert f"[lab1] {line}" in out, out[-3000:]
    for key in keys().values():
        for host in ("lab1", "lab2"):
            found = ssh(host, f"grep -rlF {shlex.quote(key)} /etc /opt /var/lib /var/cache "
                              "2>/dev/null").stdout
            assert not found.strip(), f"{host}: {found}"
