"""An honest preview: an operation that decides only when it runs (``if not
state.is_executing``) says in pyinfra's preview (its change detection, before "Beginning
operation run") what it may do, in one line for the host, and counts as a change when it may
change the host: a stand-in command the run never executes (``ops.preview``)."""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from sglang_fleet import ops
from sglang_fleet.config.render import Launch, render, render_all
from sglang_fleet.hostconfig import HostConfig
from sglang_fleet.stages.compiled import records as compiled_records
from sglang_fleet.stages.driver import deploy as driver
from sglang_fleet.stages.gate import deploy as gate
from sglang_fleet.stages.gate import group as gate_group
from sglang_fleet.stages.gate import program as gate_program
from sglang_fleet.stages.gate import resize
from sglang_fleet.stages.gate.group import GroupGate
from sglang_fleet.stages.router import deploy as router
from sglang_fleet.stages.service import deploy as service
from sglang_fleet.stages.service import group_restart, last_good
from sglang_fleet.stages.service.group_restart import GroupRestart
from sglang_fleet.stages.service.waves import Waves
from sglang_fleet.stages.teardown import deploy as teardown
from sglang_fleet.stages.warmup import deploy as warmup
from tests.conftest import field_profile
from tests.fakes import RELEASE, Host, commands
from tests.unit.stages.test_disruption import operations

PROFILE = field_profile({"memory.target_running_requests": 48}, gpus=1)
LAUNCH: Launch = render(PROFILE)  # sglang.service
REBOOTING = driver.DriverConfig.of(HostConfig.from_data({"allow_reboot": True, "gpu_count": 8},
                                                        "h1"))
HELD = driver.DriverConfig.of(HostConfig.from_data({"nvidia_driver_version": "580.95.05"}, "h1"))
GATE = ("the gate of sglang.service will run: health (within 1800 s), arguments, smoke "
        "generation, soak, capacity, max running requests against the target 48; if it passes, "
        "its unit and environment are kept as the last good release")
ROUTER = SimpleNamespace(url="http://10.0.0.2:30080")


# Each operation's preview: how it is called, the line it says (None: nothing) and whether it
# counts as a change.
CASES: dict[str, list[tuple[Callable[[], list[Any]], str | None, bool]]] = {
    "stages.driver.deploy.driver_change_allowed": [
        (lambda: commands(driver.driver_change_allowed, HELD),
         "stops the host before any install if the loaded driver is not 580.95.05 (a change "
         "needs a reboot; allow_reboot is off)", False),
        (lambda: commands(driver.driver_change_allowed, REBOOTING), None, False)],
    "stages.driver.deploy.load_driver": [
        (lambda: commands(driver.load_driver, REBOOTING),
         "may reboot (if the driver changes: the loaded one is not the installed one), then wait "
         "up to 900 s for the host", True),
        (lambda: commands(driver.load_driver, HELD),
         "stops the host if the loaded driver is not the installed one (a reboot is needed; "
         "allow_reboot is off)", False)],
    "stages.driver.deploy.persistence_mode": [
        (lambda: commands(driver.persistence_mode),
         "may turn persistence mode on (nvidia-smi -pm 1)", True)],
    "stages.driver.deploy.fabric": [
        (lambda: commands(driver.fabric, REBOOTING),
         "on an NVSwitch host: may install the fabric manager of the installed driver and "
         "restart it, and start it and nvlsm", True)],
    "stages.driver.deploy.verify": [
        (lambda: commands(driver.verify, REBOOTING),
         "checks the GPUs with nvidia-smi: 8 GPUs, B200, their memory, driver >= 580.65.06 for "
         "CUDA 13.0, compute capability 10.0, the NVSwitch fabric", False)],
    "stages.service.deploy.unit_running": [
        (lambda: commands(service.unit_running, "sglang-1.service", [], routed=True,
                          waves=Waves()),
         "may (re)start sglang-1.service: when it is not running or what it runs changed",
         True)],
    "stages.service.deploy.wave_ready": [
        (lambda: commands(service.wave_ready, PROFILE, [LAUNCH], Waves(), RELEASE),
         "waits, once a restart wave is whole, until its servers are ready before the next "
         "wave starts", False),
        (lambda: commands(service.wave_ready, PROFILE, [LAUNCH], Waves(), RELEASE, final=True),
         "waits until the last restarted servers are ready", False)],
    "stages.gate.deploy.gate": [
        (lambda: commands(gate.gate, PROFILE, LAUNCH, 1800, "", gate.GateResult()), GATE,
         True),
        (lambda: commands(gate.gate, PROFILE, LAUNCH, 60, "", gate.GateResult(), soak=0),
         GATE.replace("1800", "60").replace("soak, ", ""), True)],
    "stages.gate.deploy.gate_failed": [
        (lambda: commands(gate.gate_failed, LAUNCH, gate.GateResult()),
         "if the gate of sglang.service failed: fails the host, saying what serves once the "
         "last good release is back", False)],
    "stages.gate.program.check_together": [
        (lambda: commands(gate_program.check_together, PROFILE, [LAUNCH, LAUNCH], "", None,
                          1800, [gate.GateResult(), gate.GateResult()]),
         "the gate's checks of 2 servers at once, each judged by its own gate", False)],
    "stages.gate.deploy.restored": [
        (lambda: commands(gate.restored, PROFILE, LAUNCH, 1800, gate.GateResult()),
         "if the gate of sglang.service failed: waits for the last good release to answer",
         False)],
    "stages.gate.group.member_started": [
        (lambda: commands(gate_group.member_started, LAUNCH, 1800, GroupGate("g")),
         "a rank >= 1 of group g: waits up to 1800 s for sglang.service's start line in its "
         "journal, no exception after it (never its HTTP: a dummy health server); rank 0's gate "
         "follows", False)],
    "stages.gate.group.group_unchanged": [
        (lambda: commands(gate_group.group_unchanged, "sglang.service", GroupGate("g")),
         "checks that no member of group g restarted during its gate (each MainPID as when its "
         "check passed)", False)],
    "stages.gate.group.group_kept": [
        (lambda: commands(gate_group.group_kept, "sglang.service", GroupGate("g"),
                          gate.GateResult()),
         "if every member of group g passed: keeps sglang.service and its environment as the "
         "last good release", True)],
    "stages.service.group_restart.restart_wanted": [
        (lambda: commands(group_restart.restart_wanted, "sglang.service", [],
                          GroupRestart("g")),
         "may ask its group g to restart (when sglang.service is not running or what it runs "
         "changed; the group restarts whole)", False)],
    "stages.service.group_restart.group_stopped": [
        (lambda: commands(group_restart.group_stopped, "sglang.service", GroupRestart("g"),
                          True),
         "may stop sglang.service if its group g restarts (rank 0 first)", True)],
    "stages.service.group_restart.group_started": [
        (lambda: commands(group_restart.group_started, "sglang.service", GroupRestart("g")),
         "may start sglang.service with every member of group g at once", True)],
    "stages.gate.deploy.host_capacity": [
        (lambda: commands(gate.host_capacity, ["sglang-0.service", "sglang-1.service"], [],
                          "900000,1000"),
         "sums the capacity of 2 servers from their gates and the time of the job "
         "900000,1000", False)],
    "stages.gate.deploy.smoke": [
        (lambda: commands(gate.smoke, PROFILE, LAUNCH),
         "a smoke generation against sglang.service", False)],
    "stages.service.last_good.check_restored": [
        (lambda: commands(last_good.check_restored, PROFILE, LAUNCH, 1800),
         "checks the last good release of sglang.service: health (within 1800 s) and a smoke "
         "generation", False)],
    "stages.gate.resize.sized_restart": [
        (lambda: commands(resize.sized_restart, PROFILE, LAUNCH, RELEASE, gate.GateResult()),
         "may restart sglang.service once with the mamba cache sized for 48 running requests, "
         "if its gate finds fewer", True)],
    "stages.gate.resize.remember_size": [
        (lambda: commands(resize.remember_size, PROFILE, LAUNCH, gate.GateResult()),
         "may remember the mamba cache size sglang.service passed its gate with, after a "
         "sized restart", True)],
    "stages.warmup.deploy.caches_warmed": [
        (lambda: commands(warmup.caches_warmed, PROFILE, LAUNCH, RELEASE, 1800),
         f"may warm the caches of sglang.service for {RELEASE.id} on spare GPUs while it "
         f"serves ({PROFILE.warmup}, up to 1800 s)", True)],
    "stages.router.deploy.workers_in_step": [
        (lambda: commands(router.workers_in_step, ROUTER, ["http://10.0.0.11:30000"], None),
         "may set the workers of the router http://10.0.0.2:30080 to these 1, through its API",
         True)],
    "stages.compiled.records.kernels_recorded": [
        (lambda: commands(compiled_records.kernels_recorded, [LAUNCH], RELEASE),
         f"may record what the kernels of {RELEASE.id} were compiled for", True)],
    "stages.teardown.deploy.out_of_routers": [
        (lambda: commands(teardown.out_of_routers, [ROUTER], ["http://10.0.0.11:30000"]),
         "takes this host's 1 worker URLs out of the 1 routers that still route to them",
         True)],
}
MODULES = (compiled_records, driver, gate, gate_group, gate_program, group_restart, last_good,
           resize, router, service, teardown, warmup)


class NoFacts(Host):
    """A host the preview must not read: what it says comes from the operation's arguments
    (the facts then are not those the run decides on)."""

    def get_fact(self, fact: type, **kwargs: Any) -> Any:
        raise AssertionError(f"the preview read {fact.__name__}")


@pytest.fixture
def previewing(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    fake = NoFacts()
    for module in (*MODULES, ops):
        monkeypatch.setattr(module, "host", fake, raising=False)
        monkeypatch.setattr(module, "state", SimpleNamespace(is_executing=False), raising=False)
    yield


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_preview_says_what_the_operation_may_do(
        name: str, previewing: None, caplog: pytest.LogCaptureFixture) -> None:
    for run, line, changes in CASES[name]:
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="pyinfra"):
            found = run()
        assert [r.getMessage() for r in caplog.records] == \
            ([f"[h1] preview: {line}"] if line else [])
        assert found == ([f"true  # {line}"] if changes else [])


def test_every_operation_that_decides_when_it_runs_has_its_preview() -> None:
    """An operation with ``if not state.is_executing`` says something in the preview (the
    roll-only ones in compiled.py do nothing outside a roll, and a roll's runs skip the
    preview with -y)."""
    deciding = {name for name, op in operations().items()
                if "if not state.is_executing" in inspect.getsource(op._inner)}
    assert deciding == set(CASES)


def test_pyinfra_counts_the_gate_and_a_sized_restart_and_says_them(
        caplog: pytest.LogCaptureFixture) -> None:
    """The gate stage as pyinfra builds it, checking for changes (its preview): the gate counts
    as a change, the sized restart (``_if``) as a conditional one, the verdict as none; each
    says what it may do."""
    from pyinfra.api.config import Config
    from pyinfra.api.connect import connect_all
    from pyinfra.api.deploy import add_deploy
    from pyinfra.api.inventory import Inventory
    from pyinfra.api.state import State
    from pyinfra.context import ctx_state

    inventory = Inventory((["@local"], {}))  # type: ignore[no-untyped-call]
    state = State(inventory, Config())  # type: ignore[no-untyped-call]
    with ctx_state.use(state), caplog.at_level(logging.INFO, logger="pyinfra"):
        connect_all(state)
        add_deploy(state, gate.run_gate, profile=PROFILE, launches=render_all(PROFILE),
                   release=RELEASE)
    host = inventory.get_host("@local")
    change = {sorted(state.op_meta[h].names)[0].split(" | ")[-1].split(" (")[0]:
              (state.ops[host][h].operation_meta._maybe_is_change,
               bool(state.ops[host][h].global_arguments["_if"]))
              for h in state.get_op_order() if h in state.ops[host]}  # type: ignore[no-untyped-call]
    assert change["Gate sglang.service: health, arguments, smoke generation, soak, "
                  "capacity"] == (True, False)
    assert change["sglang.service: restart once with the mamba cache sized for 48 running "
                  "requests"] == (True, True)  # "Conditional Change"
    assert change["Gate verdict on sglang.service"] == (False, True)
    assert f"preview: {GATE}" in caplog.text
    assert "preview: may restart sglang.service once with the mamba cache" in caplog.text
