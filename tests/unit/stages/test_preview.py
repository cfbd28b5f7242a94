"""An honest preview, in pyinfra's own style. pyinfra's preview (its change detection, before
"Beginning operation run"; ``-y`` skips it) runs each operation's body once and stops at its
first command; the run runs it again. So a body reads facts (as they are then) and what earlier
operations wrote as the run went (nothing yet in the preview); work only the run can do is a
FunctionCommand, which the preview counts and never runs; a restart because something changed
is an operation with ``_if``. Only the checks of what the run has just done, which change
nothing when they pass, still ask the phase (``if not state.is_executing``) and say in one line
what they will check (``ops.preview``)."""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from pyinfra.api.command import FunctionCommand

import sglang_fleet
from sglang_fleet import ops
from sglang_fleet.config.render import Launch, render, render_all
from sglang_fleet.stages.gate import deploy as gate
from sglang_fleet.stages.gate import group as gate_group
from sglang_fleet.stages.gate import program as gate_program
from sglang_fleet.stages.gate import resize
from sglang_fleet.stages.gate.group import GroupGate
from sglang_fleet.stages.gate.program import GateResult
from sglang_fleet.stages.router import deploy as router
from sglang_fleet.stages.service import deploy as service
from sglang_fleet.stages.service import group_restart, last_good
from sglang_fleet.stages.service.group_restart import GroupRestart
from sglang_fleet.stages.service.waves import Waves
from sglang_fleet.stages.warmup import deploy as warmup
from tests.conftest import field_profile
from tests.fakes import RELEASE, Host, commands
from tests.unit.stages.test_disruption import operations

PROFILE = field_profile({"memory.target_running_requests": 48}, gpus=1)
LAUNCH: Launch = render(PROFILE)  # sglang.service
GATE = ("the gate of sglang.service will run: health (within 1800 s), arguments, smoke "
        "generation, soak, capacity, max running requests against the target 48; if it passes, "
        "its unit and environment are kept as the last good release")
ROUTER = SimpleNamespace(url="http://10.0.0.2:30080")


# Each operation that still decides by the phase (a check of what the run has just done, which
# changes nothing when it passes: a FunctionCommand would count it as a change on every run) and
# its preview: how it is called, the line it says (None: nothing) and whether it counts as a
# change.
CASES: dict[str, list[tuple[Callable[[], list[Any]], str | None, bool]]] = {
    "stages.gate.deploy.gate": [
        (lambda: commands(gate.gate, PROFILE, LAUNCH, 1800, "", GateResult()), GATE,
         True),
        (lambda: commands(gate.gate, PROFILE, LAUNCH, 60, "", GateResult(), soak=0),
         GATE.replace("1800", "60").replace("soak, ", ""), True)],
    "stages.gate.program.check_together": [
        (lambda: commands(gate_program.check_together, PROFILE, [LAUNCH, LAUNCH], "", None,
                          1800, [GateResult(), GateResult()]),
         "the gate's checks of 2 servers at once, each judged by its own gate", False)],
    "stages.gate.group.member_started": [
        (lambda: commands(gate_group.member_started, LAUNCH, 1800, GroupGate("g")),
         "a rank >= 1 of group g: waits up to 1800 s for sglang.service's start line in its "
         "journal, no exception after it (never its HTTP: a dummy health server); rank 0's gate "
         "follows", False)],
    "stages.gate.deploy.smoke": [
        (lambda: commands(gate.smoke, PROFILE, LAUNCH),
         "a smoke generation against sglang.service", False)],
    "stages.router.deploy.workers_in_step": [
        (lambda: commands(router.workers_in_step, ROUTER, ["http://10.0.0.11:30000"], None),
         "may set the workers of the router http://10.0.0.2:30080 to these 1, through its API",
         True)],
}
# The operations that read in their body only facts and what earlier operations wrote as the
# run went (empty in the preview): in the preview they yield nothing and say nothing, and
# pyinfra asks them again as it runs.
RECORDS: dict[str, Callable[[], list[Any]]] = {
    "stages.gate.deploy.gate_failed": lambda: commands(gate.gate_failed, LAUNCH, GateResult()),
    "stages.gate.deploy.restored": lambda: commands(gate.restored, PROFILE, LAUNCH, 1800,
                                             GateResult()),
    "stages.gate.deploy.host_capacity": lambda: commands(
        gate.host_capacity, ["sglang-0.service", "sglang-1.service"],
        [GateResult(), GateResult()], "900000,1000"),
    "stages.gate.resize.sized_restart": lambda: commands(resize.sized_restart, PROFILE, LAUNCH,
                                                    RELEASE, GateResult()),
    "stages.gate.resize.remember_size": lambda: commands(resize.remember_size, PROFILE, LAUNCH,
                                                    GateResult()),
    "stages.gate.group.group_unchanged": lambda: commands(
        gate_group.group_unchanged, "sglang.service", GroupGate("g")),
    "stages.service.group_restart.group_stopped": lambda: commands(
        group_restart.group_stopped, "sglang.service", GroupRestart("g"), True),
    "stages.service.group_restart.group_started": lambda: commands(
        group_restart.group_started, "sglang.service", GroupRestart("g")),
    "stages.service.deploy.wave_ready": lambda: commands(service.wave_ready, PROFILE, [LAUNCH],
                                                  Waves(), RELEASE, final=True),
}
MODULES = (gate, gate_group, gate_program, group_restart, last_good, resize, router, service,
           warmup)


class NoFacts(Host):
    """A host the preview must not read: what it says comes from the operation's arguments
    (the facts then are not those the run decides on)."""

    def get_fact(self, fact: type, **kwargs: Any) -> Any:
        raise AssertionError(f"the preview read {fact.__name__}")

    def run_shell_command(self, command: str, **kwargs: Any) -> Any:
        raise AssertionError(f"the preview ran {command}")


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


@pytest.mark.parametrize("name", sorted(RECORDS))
def test_in_the_preview_the_runs_records_are_empty_so_nothing_is_said_or_done(
        name: str, previewing: None, caplog: pytest.LogCaptureFixture) -> None:
    """Neither a stand-in command nor a preview line: the operation's name says what it does,
    and pyinfra asks it again as it runs, once the records are written."""
    with caplog.at_level(logging.INFO, logger="pyinfra"):
        assert RECORDS[name]() == []
    assert caplog.records == []


class FactsOnly(Host):
    """A host whose facts the preview may read, and on which it must run nothing."""

    def run_shell_command(self, command: str, **kwargs: Any) -> Any:
        raise AssertionError(f"the preview ran {command}")


def test_run_time_work_is_a_function_command_the_preview_lists_and_never_runs(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A restore's check, a warm-up, a restart told to the waves and a group member's wish to
    restart: each a FunctionCommand (counted as a change), none of it done in the preview."""
    from tests.unit.stages.warmup.test_warmup import LAUNCH as WARMED
    from tests.unit.stages.warmup.test_warmup import OLD, facts, running
    from tests.unit.stages.warmup.test_warmup import PROFILE as WARMUP

    fake = FactsOnly({**facts(running(OLD, WARMED.argv[3:])),
                      "UnitCondition": {"ActiveState": "active", "UnitFileState": "enabled"}})
    for module in (last_good, warmup, service, group_restart, ops):
        monkeypatch.setattr(module, "host", fake, raising=False)
    waves, record = Waves(), GroupRestart("g")
    found = [*commands(last_good.check_restored, PROFILE, LAUNCH, 1800),
             *commands(warmup.caches_warmed, WARMUP, WARMED, RELEASE, 1800),
             commands(service.unit_started, "sglang.service", restart=True, waves=waves)[-1],
             *commands(group_restart.restart_wanted, "sglang.service", record, restart=True)]
    assert [type(c) for c in found] == [FunctionCommand] * 4
    assert waves.started == [] and not record.wanted()


def test_every_operation_that_decides_when_it_runs_has_its_preview() -> None:
    """An operation with ``if not state.is_executing`` says something in the preview."""
    deciding = {name for name, op in operations().items()
                if "if not state.is_executing" in inspect.getsource(op._inner)}
    assert deciding == set(CASES)


def test_the_phase_is_asked_nowhere_else() -> None:
    """No other ``state.is_executing`` in the product: not in an operation's helper, nor as a
    condition among others (``ops.preview``'s docstring shows the guard it serves)."""
    root = Path(sglang_fleet.__file__).parent
    found = [f"{path.relative_to(root)}:{number}" for path in sorted(root.rglob("*.py"))
             for number, line in enumerate(path.read_text().splitlines(), 1)
             if "is_executing" in line]
    assert len(found) == len(CASES) + 1, found


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
    # the size is the gate's, found as it runs: nothing to restart in the preview ("-")
    assert change["sglang.service: restart once with the mamba cache sized for 48 running "
                  "requests"] == (False, True)
    assert change["Gate verdict on sglang.service"] == (False, True)
    assert f"preview: {GATE}" in caplog.text
