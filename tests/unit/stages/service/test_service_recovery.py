"""Recovering from faults, the parts that need no host: the unit's crash-loop lines per systemd
release, what a deploy says when it finds a unit down, the soak's size, the driver change
refused without a reboot, grouped roll errors and the failed-hosts summary."""

from __future__ import annotations

import configparser
from pathlib import Path

import jinja2
import pytest

from sglang_fleet.errors import InputError, Problem
from sglang_fleet.facts.nvidia import LoadedModule
from sglang_fleet.facts.systemd import parse_show, parse_version
from sglang_fleet.hostconfig import HostConfig
from sglang_fleet.report import summary
from sglang_fleet.roll import planning
from sglang_fleet.stages.driver.deploy import DriverConfig, change_refused
from sglang_fleet.stages.gate.host import gate_soak
from sglang_fleet.stages.service import deploy as service
from sglang_fleet.stages.service.deploy import CRASH_RESTARTS, restart_policy
from sglang_fleet.stages.service.units import found_down, start_command


def unit_text(systemd_version: int) -> dict[str, str]:
    """The rendered unit's [Unit] and [Service] keys (the last value of repeated keys)."""
    template = jinja2.Template(Path(service.TEMPLATE).read_text())
    text = template.render(profile_path="p.yaml", version="0.5.23", release_id="r",
                           env_file="/etc/sglang/sglang.env", served_name="m",
                           exec_start="/opt/python -m sglang.launch_server", timeout_start=1800,
                           timeout_stop=600, start_limit_interval=7200, allowed_clients=[],
                           paths={"user": "sglang", "home": "/var/lib/sglang/state",
                                  "cache": "/var/cache/sglang"},
                           **restart_policy(systemd_version))
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string(text)
    return {**parser["Unit"], **parser["Service"]}


def test_restart_steps_only_where_systemd_has_them() -> None:
    new, old = unit_text(255), unit_text(252)
    assert new["RestartSteps"] == str(CRASH_RESTARTS - 1) and new["RestartSec"] == "10"
    assert new["RestartMaxDelaySec"] == "160"
    assert "RestartSteps" not in old and "RestartMaxDelaySec" not in old
    assert old["RestartSec"] == "30"
    for unit in (new, old):  # the loop ends: CRASH_RESTARTS restarts after the first start
        assert unit["StartLimitBurst"] == str(CRASH_RESTARTS + 1)
        assert unit["Restart"] == "on-failure"
    # the whole crash loop fits in the start limit's window, so the limit does bound it
    delays = [10 * 2 ** n for n in range(CRASH_RESTARTS)]
    assert sum(delays) < int(new["StartLimitIntervalSec"])
    assert restart_policy(None)["restart_steps"] == 0  # unknown systemd: the safe form


def test_systemd_facts_parse() -> None:
    assert parse_version(["systemd 252 (252.39-1~deb12u2)", "+PAM +AUDIT"]) == 252
    assert parse_version(["systemd 255 (255.4-1ubuntu8)"]) == 255
    assert parse_version(["bash: systemctl: command not found"]) is None
    assert parse_show(["ActiveState=failed", "Result=start-limit-hit"]) == \
        {"ActiveState": "failed", "Result": "start-limit-hit"}


def test_deliberate_start_clears_the_start_limit_first() -> None:
    command = start_command("sglang.service")
    assert command.index("reset-failed sglang.service") < command.index("restart sglang.service")


def test_a_unit_found_down_is_said_so() -> None:
    limit = found_down("sglang.service", {"ActiveState": "failed", "SubState": "failed",
                                          "Result": "start-limit-hit", "NRestarts": "5"})
    assert limit == ("sglang.service was found failed (start-limit-hit, 5 automatic restarts): "
                     "clearing its failed state and start limit, starting it")
    looping = found_down("sglang.service", {"ActiveState": "activating",
                                            "SubState": "auto-restart", "NRestarts": "2"})
    assert looping is not None and "crash-looping (2 automatic restarts so far)" in looping
    assert found_down("sglang.service", {"ActiveState": "active", "SubState": "running"}) is None
    assert found_down("sglang.service", {"ActiveState": "inactive", "SubState": "dead"}) is None


def test_soak_size() -> None:
    assert gate_soak.soak_count(None, 48) == 96
    assert gate_soak.soak_count(0, 48) == 0
    assert gate_soak.soak_count(10, 48) == 10
    assert gate_soak.soak_count(None, None) == 2 * gate_soak.SOAK_DEFAULT_BATCH
    assert HostConfig.from_data({}, "h").gate_soak_requests is None
    assert HostConfig.from_data({"gate_soak_requests": 0}, "h").gate_soak_requests == 0
    for bad in (-1, "many", True, 2.5):
        with pytest.raises(InputError, match=r"pyinfra data of h: gate_soak_requests"):
            HostConfig.from_data({"gate_soak_requests": bad}, "h")


def driver(**data: object) -> DriverConfig:
    return DriverConfig.of(HostConfig.from_data(data, "h"))


def test_driver_change_without_reboot_is_refused_before_install() -> None:
    loaded = LoadedModule("580.95.05", True)
    refused = change_refused(driver(nvidia_driver_version="580.105.08"), loaded)
    assert refused is not None
    assert refused.startswith("nvidia_driver_version 580.105.08: refused, nothing installed: "
                              "the loaded driver is 580.95.05")
    assert "allow_reboot = True" in refused
    assert change_refused(driver(nvidia_driver_version="580.105.08", allow_reboot=True),
                          loaded) is None
    assert change_refused(driver(nvidia_driver_version="580.95.05"), loaded) is None
    assert change_refused(driver(), loaded) is None  # no version asked: the installed one stays
    assert change_refused(driver(nvidia_driver_version="580.95.05"), None) is None  # fresh host
    with pytest.raises(InputError, match="reboot_timeout_seconds"):
        driver(reboot_timeout_seconds=0)
    assert driver(reboot_timeout_seconds=120).reboot_timeout == 120


def test_errors_every_host_shares_are_reported_once() -> None:
    def err(host: str, message: str) -> InputError:
        return InputError([Problem(f"pyinfra data of {host}", "memory.page_size", message,
                                   "use a power of two")])

    combined = planning.grouped({"a1": err("a1", "bad"), "a2": err("a2", "bad"),
                             "a3": err("a3", "worse")})
    text = str(combined)
    assert "pyinfra data of a1, a2: memory.page_size: bad" in text
    assert "pyinfra data of a3: memory.page_size: worse" in text
    assert text.count("fix:") == 2
    profile_error = InputError([Problem("profiles/p.yaml", "model", "missing", "add it")])
    assert "profiles/p.yaml (hosts b1, b2): model: missing" in \
        str(planning.grouped({"b1": profile_error, "b2": profile_error}))


def test_roll_data_is_said_not_to_be_in_the_inventory() -> None:
    warning = planning.data_warning(["sglang.memory.max_running_requests=48"])
    assert warning is not None
    assert "sglang.memory.max_running_requests=48" in warning
    assert "not in the inventory" in warning and "reverts" in warning
    assert planning.data_warning([]) is None


def test_failed_hosts_summary_names_them() -> None:
    assert summary.line([], {}) is None
    assert summary.line(["lab2", "lab1"], {"lab2": "NVIDIA driver | Loaded driver"}) == \
        "--> 2 hosts failed: lab1 (could not connect), lab2 (NVIDIA driver | Loaded driver)"

