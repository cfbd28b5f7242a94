"""memory.target_running_requests on a lab host in the seed's situation: SGLang 0.5.12 sizes 24
mamba slots by itself (5 per request with extra_buffer and the overlap schedule: 4 running
requests) while about 30 GB of the GPU stay free. The deploy reads that from the log, restarts
each server once with the size for 48, ends with 48 running requests (read from the log, not
from /server_info's echo of the command line), remembers the size so the next deploy changes
nothing, and names why a target that cannot fit cannot, with the last good release serving."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import pytest

from sglang_fleet.remote import capacity
from tests.lab.conftest import booted_lab, pyinfra, ssh

pytestmark = pytest.mark.lab
HOST = "lab1"
# The seed: 0.5.12, the pools at 0.95 of the GPU and a mamba share that SGLang turns into 24
# slots for the lab model on a B200 (the simulator follows kv_cache sizing as the release does).
SEED = ("sglang.engine.version=0.5.12", "sglang.memory.mem_fraction_static=0.95",
        "sglang.mamba.full_memory_ratio=0.04")
TARGET = "sglang.memory.target_running_requests=48"


@pytest.fixture(scope="module")
def lab() -> Iterator[None]:
    yield from booted_lab("--hosts", "1", "--gpus", "2")


def deploy(*data: str) -> tuple[int, str]:
    result = pyinfra("deploys/sglang.py", *[a for d in data for a in ("--data", d)])
    return result.returncode, result.stdout + result.stderr


def units() -> list[str]:
    found = ssh(HOST, "ls /etc/systemd/system").stdout.split()
    return sorted(u for u in found if re.fullmatch(r"sglang(-\d+)?\.service", u))


def startup(unit: str) -> capacity.Capacity:
    """The capacity of the unit's running invocation, from its own journal."""
    invocation = ssh(HOST, f"systemctl show -p InvocationID --value {unit}").stdout.strip()
    log = ssh(HOST, f"journalctl _SYSTEMD_INVOCATION_ID={invocation} -o cat --no-pager").stdout
    return capacity.parse(log.splitlines(), "0.5.12")


def starts(unit: str) -> int:
    return int(ssh(HOST, f"journalctl -u {unit} -o cat | grep -c 'fired up' || true").stdout)


def changed_ops(out: str) -> int:
    total = next(line for line in out.splitlines() if "Grand total" in line).split()
    return 0 if total[3] == "-" else int(total[3])


def test_the_seed_without_a_target_serves_4_requests(lab: None) -> None:
    code, out = deploy(*SEED)
    assert code == 0, out[-5000:]
    for unit in units():
        cap = startup(unit)
        assert (cap.mamba_slots, cap.slots_per_request, cap.max_running_requests) == (24, 5, 4)
        assert cap.available_gpu_gb is not None and 25 <= cap.available_gpu_gb <= 35


def test_the_target_restarts_each_server_once_and_ends_with_48(lab: None) -> None:
    before = {unit: starts(unit) for unit in units()}
    code, out = deploy(*SEED, TARGET)
    assert code == 0, out[-5000:]
    for unit in units():
        assert (f"[{HOST}] {unit}: target: max running requests 4 (from the log) is below "
                "memory.target_running_requests 48: restarting once with "
                "--max-mamba-cache-size 240") in out, out[-5000:]
        assert starts(unit) == before[unit] + 2  # the start with 48 requested, then the sized
        cap = startup(unit)
        assert cap.mamba_slots == 240 and (cap.max_running_requests or 0) >= 48
        assert "--max-mamba-cache-size 240" in ssh(HOST, f"systemctl cat {unit}").stdout
    records = ssh(HOST, "stat -c '%U %a %n' /var/lib/sglang/sizing/*.json").stdout.split("\n")
    assert records[0].startswith("root 644 /var/lib/sglang/sizing/")
    path = records[0].split()[2]
    assert json.loads(ssh(HOST, f"cat {path}").stdout)["max_mamba_cache_size"] == 240


def test_the_next_deploy_starts_right_the_first_time(lab: None) -> None:
    pids = {u: ssh(HOST, f"systemctl show -p MainPID --value {u}").stdout for u in units()}
    code, out = deploy(*SEED, TARGET)
    assert code == 0, out[-5000:]
    assert changed_ops(out) == 0, out[-5000:]
    assert {u: ssh(HOST, f"systemctl show -p MainPID --value {u}").stdout
            for u in units()} == pids
    assert "reaches memory.target_running_requests 48" in out


def test_a_target_that_cannot_fit_names_why_and_the_last_good_keeps_serving(lab: None) -> None:
    code, out = deploy(*SEED, "sglang.memory.target_running_requests=100")
    assert code != 0
    assert "memory.target_running_requests 100 needs 500 mamba slots" in out, out[-5000:]
    assert re.search(r"GiB short\. Levers: memory\.mem_fraction_static .*; "
                     r"memory\.target_running_requests \d+ \(the most that fit now\)", out)
    assert "the last good release serves again" in out
    for unit in units():
        cap = startup(unit)
        assert cap.mamba_slots == 240 and (cap.max_running_requests or 0) >= 48
