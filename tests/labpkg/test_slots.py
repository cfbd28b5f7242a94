"""Lab slots (``SGLANG_FLEET_LAB_SLOT``): each slot's addresses, state directory and guests are
its own, slot 0 is the lab as it always was, and the test run gives each worker its own slot and
spreads the lab modules over the workers."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sglang_fleet_lab import hosts, state, supervise
from tests.conftest import LAB_MINUTES, ROOT, lab_scope, lab_slot, schedule_order


def slot_view(slot: str | None) -> dict[str, object]:
    """What a fresh python sees of the lab with ``SGLANG_FLEET_LAB_SLOT=slot`` (unset: None)."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("SGLANG_FLEET_LAB_SLOT", "SGLANG_FLEET_LAB_DIR")}
    if slot is not None:
        env["SGLANG_FLEET_LAB_SLOT"] = slot
    code = ("import json; from sglang_fleet_lab import state; lab = state.Lab(); "
            "print(json.dumps({'slot': lab.slot, 'dir': str(lab.dir), 'site': lab.site_address,"
            " 'host1': state.host_address(1), 'host3': state.host_address(3),"
            " 'repo': lab.repo_url, 's3': lab.s3_url, 'key': str(lab.key_file('admin'))}))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=60, env=env)
    assert result.returncode == 0, result.stderr
    view: dict[str, object] = json.loads(result.stdout)
    return view


def test_slot_0_is_the_lab_as_it_always_was() -> None:
    for slot in (None, "0"):
        assert slot_view(slot) == {
            "slot": 0, "dir": "/var/lib/sglang-fleet-lab", "site": "127.0.0.2",
            "host1": "127.0.0.11", "host3": "127.0.0.13",
            "repo": "http://127.0.0.2:8080/compute/cuda/repos", "s3": "http://127.0.0.2:9000",
            "key": "/var/lib/sglang-fleet-lab/ssh/admin-key"}


def test_slot_k_has_its_own_addresses_and_state() -> None:
    assert slot_view("3") == {
        "slot": 3, "dir": "/var/lib/sglang-fleet-lab-3", "site": "127.0.3.2",
        "host1": "127.0.3.11", "host3": "127.0.3.13",
        "repo": "http://127.0.3.2:8080/compute/cuda/repos", "s3": "http://127.0.3.2:9000",
        "key": "/var/lib/sglang-fleet-lab-3/ssh/admin-key"}


@pytest.mark.parametrize("text", ["-1", "256", "one", "1.5"])
def test_a_slot_that_is_not_one_is_refused(text: str) -> None:
    with pytest.raises(SystemExit, match="SGLANG_FLEET_LAB_SLOT"):
        state.slot_from({"SGLANG_FLEET_LAB_SLOT": text})
    assert state.slot_from({}) == state.slot_from({"SGLANG_FLEET_LAB_SLOT": " "}) == 0


def test_the_cli_and_the_inventory_follow_the_slot(tmp_path: Path) -> None:
    """``sglang-fleet lab status`` and ``inventories/lab.py`` read the slot's state."""
    lab_dir = state.state_dir(254)
    env = {**os.environ, "SGLANG_FLEET_LAB_SLOT": "254"}
    env.pop("SGLANG_FLEET_LAB_DIR", None)
    lab_dir.mkdir(parents=True, exist_ok=True)
    try:
        (lab_dir / "lab.json").write_text(json.dumps({"hosts": [
            {"name": "lab1", "address": "127.0.254.11", "gpus": 2, "hgx": False}],
            "slot": 254}))
        status = subprocess.run(["sglang-fleet", "lab", "status", "--json"], env=env, cwd=ROOT,
                                capture_output=True, text=True, timeout=60)
        assert status.returncode == 0, status.stderr
        assert [(h["name"], h["address"], h["state"]) for h in json.loads(status.stdout)] == \
            [("lab1", "127.0.254.11", "stopped")]
        code = ("from pyinfra.api import Config, State; from pyinfra.api.inventory import "
                "Inventory; from pyinfra.context import ctx_state; "
                "ctx_state.set(State(Inventory(([], {})), Config())); "
                "from pyinfra_cli.inventory import make_inventory; "
                "inv = make_inventory('inventories/lab.py'); h = inv.get_host('lab1'); "
                "print(h.data.ssh_hostname, h.data.ssh_key, h.data.nvidia_repo_base_url)")
        inventory = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT,
                                   capture_output=True, text=True, timeout=60)
        assert inventory.returncode == 0, inventory.stderr
        assert inventory.stdout.split() == [
            "127.0.254.11", f"{lab_dir}/ssh/id_ed25519",
            "http://127.0.254.2:8080/compute/cuda/repos"]
    finally:
        shutil.rmtree(lab_dir)


def test_guest_marks_carry_the_slot() -> None:
    assert supervise.mark(2, "lab1") == "2/lab1"
    assert supervise.parse_mark("2/lab1") == (2, "lab1")
    assert supervise.parse_mark("lab1") == (0, "lab1")  # booted before slots: slot 0's


def test_guests_lists_only_its_own_slots() -> None:
    """A process that looks like a guest of slot 251 (PID 1 of its namespace, marked) is found
    in slot 251 only; slots no lab uses, so no running lab sees it."""
    fake = subprocess.Popen(["unshare", "--pid", "--fork", "env",
                             f"{supervise.GUEST_MARK}={supervise.mark(251, 'labq')}",
                             "sleep", "60"])
    try:
        deadline = time.monotonic() + 10
        while "labq" not in hosts.guests(251) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert set(hosts.guests(251)) == {"labq"}
        assert "labq" not in hosts.guests(252) and "labq" not in hosts.guests(0)
    finally:
        fake.kill()
        fake.wait()


def test_each_worker_takes_its_own_slot() -> None:
    for worker, base, slot in (("gw0", None, "0"), ("gw1", None, "1"), ("gw1", "4", "5")):
        environ = {"PYTEST_XDIST_WORKER": worker}
        if base is not None:
            environ["SGLANG_FLEET_LAB_SLOT"] = base
        lab_slot(environ)
        assert environ["SGLANG_FLEET_LAB_SLOT"] == slot
    alone = {"SGLANG_FLEET_LAB_SLOT": "2"}  # no xdist: the slot it was given
    lab_slot(alone)
    assert alone == {"SGLANG_FLEET_LAB_SLOT": "2"}


def test_lab_modules_go_first_longest_first_each_one_unit() -> None:
    assert lab_scope("tests/lab/test_dp.py::test_one") == "tests/lab/test_dp.py"
    assert lab_scope("tests/test_cli.py::test_x") is None
    modules = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests" / "lab").glob("test_*.py"))
    assert set(modules) == set(LAB_MINUTES)  # every lab module has its measured minutes
    order = schedule_order(["tests/test_cli.py::test_x", *modules, "tests/test_y.py::test_z"])
    assert order[:len(modules)] == sorted(modules, key=lambda m: -LAB_MINUTES[m])
    assert order[len(modules):] == ["tests/test_cli.py::test_x", "tests/test_y.py::test_z"]
