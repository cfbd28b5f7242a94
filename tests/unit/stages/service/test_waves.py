"""Restart waves inside a host: which servers restart together, and the service stage's waits
between waves (the first server alone and ready before the others start from its caches; in a
roll with --batch-instances, each wave back in the routers before the next leaves). The real
thing, under load, is in tests/lab/test_fleet.py."""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterator
from typing import Any

import pytest
from pyinfra.api.command import FunctionCommand
from pyinfra.connectors.util import CommandOutput, OutputLine

from sglang_fleet import ops
from sglang_fleet.config.profile import Profile
from sglang_fleet.config.render import Launch, render_all
from sglang_fleet.fleet import cutover, roll_directory
from sglang_fleet.stages.gate import program as checker
from sglang_fleet.stages.service import deploy as service
from sglang_fleet.stages.service.units import start_command
from sglang_fleet.stages.service.waves import Waves, plan, retired, wave_of
from tests.conftest import field_profile
from tests.fakes import RELEASE, Host, commands

UNITS = [f"sglang-{i}.service" for i in range(8)]


def test_the_first_server_restarts_alone_then_the_rest_together() -> None:
    assert plan(UNITS, restarting=set(UNITS)) == [UNITS[:1], UNITS[1:]]


def test_the_rest_k_at_a_time() -> None:
    assert plan(UNITS, restarting=set(UNITS), per_wave=3) == [
        UNITS[:1], UNITS[1:4], UNITS[4:7], UNITS[7:]]
    assert plan(UNITS, restarting=set(UNITS), per_wave=1) == [[u] for u in UNITS]
    assert plan(UNITS, restarting=set(UNITS), per_wave=8) == [UNITS[:1], UNITS[1:]]
    assert [wave_of(i, 3) for i in range(8)] == [0, 1, 1, 1, 2, 2, 2, 3]


def test_new_instances_restart_in_waves_of_their_own_and_the_others_stay() -> None:
    # 4 → 8 instances: sglang-0..3 unchanged, sglang-4..7 new; the first new one compiles
    new = set(UNITS[4:])
    assert plan(UNITS, restarting=new) == [UNITS[4:5], UNITS[5:]]
    assert plan(UNITS, restarting=new, per_wave=2) == [UNITS[4:5], UNITS[5:7], UNITS[7:]]


def test_a_retired_instance_is_in_no_wave_and_no_change_is_no_wave() -> None:
    # 8 → 4 instances: sglang-4..7 retire (before any wave); the rest are unchanged
    assert retired(UNITS, keep=UNITS[:4]) == UNITS[4:]
    assert plan(UNITS[:4], restarting=set()) == []
    assert retired(["sglang.service"], keep=UNITS) == ["sglang.service"]  # 1 → 8
    assert plan(UNITS[:4], restarting={"sglang-2.service"}, per_wave=2) == [
        ["sglang-2.service"]]


def test_a_failed_wave_stops_the_waves() -> None:
    waves = Waves()
    waves.start(UNITS[0])
    assert waves.going() and waves.due() == UNITS[:1]
    waves.error = "sglang-0.service failed to start: CUDA error"
    assert not waves.going()


class Shell(Host):
    """A host whose check_server answers by unit: ready unless the unit is in ``failing``."""

    def __init__(self, failing: tuple[str, ...] = ()) -> None:
        super().__init__({"UnitCondition": {"ActiveState": "active",
                                            "UnitFileState": "enabled"}})
        self.data: dict[str, Any] = {}
        self.failing = failing
        self.checked: list[str] = []
        self.commands: list[list[str]] = []  # each check_servers call: a wave waited at once

    def run_shell_command(self, command: str, **kwargs: Any) -> tuple[bool, CommandOutput]:
        words = shlex.split(command)
        assert words[-2] == "--servers" and "sglang_fleet.stages.gate.host.check_servers" in words
        lines: list[str] = []
        units = [argv[argv.index("--unit") + 1] for argv in json.loads(words[-1])]
        for argv, unit in zip(json.loads(words[-1]), units, strict=True):  # as check_servers
            assert "--health-only" in argv and argv[argv.index("--budget") + 1] == "1800"
            self.checked.append(unit)
            if unit in self.failing:
                lines += ["error: failed to start", f'GATE {{"ok": false, "error": "{unit} '
                          'failed to start: CUDA out of memory"}', 'CHECKED {"exit": 1}']
            else:
                lines += ["health: /health_generate 200", 'GATE {"ok": true}',
                          'CHECKED {"exit": 0}']
        self.commands.append(words)
        return not set(units) & set(self.failing), output(*lines)  # this call's servers


def output(*lines: str) -> CommandOutput:
    return CommandOutput([OutputLine("stdout", line) for line in lines])


@pytest.fixture
def launches() -> list[Launch]:
    return render_all(field_profile({"parallel.instances": 3}))


@pytest.fixture
def shell(monkeypatch: pytest.MonkeyPatch) -> Iterator[Shell]:
    fake = Shell()
    for module in (service, ops, checker):
        monkeypatch.setattr(module, "host", fake)
    yield fake


def restart(unit: str, waves: Waves) -> list[Any]:
    """The restart of a unit whose definition changed, the waves told of it as the run does."""
    found = commands(service.unit_started, unit, restart=True, routed=True, waves=waves)
    told = [c for c in found if isinstance(c, FunctionCommand) and c.function == waves.start]
    for command in told:
        command.function(*command.args)
    return [c for c in found if c not in told]


def ready(launches: list[Launch], waves: Waves, final: bool = False,
          profile: Profile | None = None) -> list[Any]:
    return commands(service.wave_ready, profile or field_profile(), launches, waves, RELEASE,
                    final)


def test_a_grpc_wave_is_checked_with_the_release_it_runs_before_current_names_it(
        shell: Shell) -> None:
    grpc = field_profile({"parallel.instances": 3, "server.router_connection": "grpc",
                          "server.api_key_secret": None})
    waves = Waves()
    restart("sglang-0.service", waves)
    ready(render_all(grpc), waves, profile=grpc)
    [words] = shell.commands
    assert RELEASE.python_bin in words and not any("/current/" in w for w in words)


def test_the_host_waits_for_the_first_server_before_the_others_start(
        shell: Shell, launches: list[Launch], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(roll_directory.ENV, raising=False)  # outside a roll
    units = [launch.unit for launch in launches]
    waves = Waves()
    assert restart(units[0], waves) == [start_command(units[0])]
    assert ready(launches, waves) == [] and shell.checked == units[:1]
    assert shell.noops == ["sglang-0.service ready"]
    for unit in units[1:]:  # the rest start together: nobody waits between them
        restart(unit, waves)
        assert ready(launches, waves) == [] and shell.checked == units[:1]
    ready(launches, waves, final=True)
    assert shell.checked == units and waves.due(final=True) == []
    # the first alone, then the rest waited for at once: one check_servers call each wave
    assert [len(json.loads(words[-1])) for words in shell.commands] == [1, len(units) - 1]


def test_a_first_server_that_is_not_ready_stops_the_waves(
        shell: Shell, launches: list[Launch]) -> None:
    shell.failing = ("sglang-0.service",)
    waves = Waves()
    restart("sglang-0.service", waves)
    assert ready(launches, waves) == []
    assert waves.error == "sglang-0.service failed to start: CUDA out of memory"
    assert shell.noops == [f"sglang-0.service is not ready: {waves.error}"]
    # the final wait does nothing more; the service stage skips every later unit (_if)
    assert ready(launches, waves, final=True) == [] and shell.checked == ["sglang-0.service"]


def test_in_a_roll_with_batch_instances_each_wave_rejoins_the_routers(
        shell: Shell, launches: list[Launch], monkeypatch: pytest.MonkeyPatch) -> None:
    roll_dir = roll_directory.RollDirectory.create()
    monkeypatch.setenv(roll_directory.ENV, str(roll_dir.directory))
    try:
        # without --batch-instances the host left whole, and comes back whole after its gate
        roll_dir.plan({"h1": ["http://h1:30000"]}, drain_timeout=1)
        waves = Waves()
        restart("sglang-0.service", waves)
        assert ready(launches, waves) == [] and shell.noops == ["sglang-0.service ready"]
        roll_dir.plan({"h1": ["http://h1:30000"]}, drain_timeout=1, batch_instances=2)
        shell.checked = []
        waves = Waves(per_wave=2)
        [leave, start] = restart("sglang-0.service", waves)
        assert isinstance(leave, FunctionCommand) and leave.args == (["sglang-0.service"],)
        assert start == start_command("sglang-0.service")
        [back] = ready(launches, waves)
        # the URL the routers reach it at (the host's address: it listens on 0.0.0.0)
        assert isinstance(back, FunctionCommand) and back.function is cutover._rejoin
        assert back.args == (["http://h1:30000"],)
        restart("sglang-1.service", waves)
        assert ready(launches, waves) == []  # a wave of 2: one more first
        restart("sglang-2.service", waves)
        [back] = ready(launches, waves)
        assert back.args == (["http://h1:30001", "http://h1:30002"],)
        assert shell.checked == ["sglang-0.service", "sglang-1.service", "sglang-2.service"]
    finally:
        roll_dir.close()


def test_a_units_files_and_start_come_after_the_wave_before_it_and_stop_with_a_failed_one(
        ) -> None:
    """The service stage as pyinfra builds it (facts of this machine, nothing executed): each
    unit's environment, unit file, reload and start come after the wait for the wave before
    it, and each carries the waves' condition, so a failed first wave leaves every later unit
    as it was (files, release, process)."""
    from pyinfra.api.config import Config
    from pyinfra.api.connect import connect_all
    from pyinfra.api.deploy import add_deploy
    from pyinfra.api.inventory import Inventory
    from pyinfra.api.state import State
    from pyinfra.context import ctx_state


    inventory = Inventory((["@local"], {"secrets": {"sglang-api-key": "k" * 32}}))  # type: ignore[no-untyped-call]
    state = State(inventory, Config())  # type: ignore[no-untyped-call]
    with ctx_state.use(state):
        connect_all(state)
        found = field_profile({"parallel.instances": 3})
        add_deploy(state, service.install_service, profile=found, launches=render_all(found),
                   release=RELEASE,
                   restart_if=[])
    host = inventory.get_host("@local")
    ops = [(sorted(state.op_meta[h].names)[0].split(" | ")[-1],
            state.ops[host][h].global_arguments.get("_if"))
           for h in state.get_op_order() if h in state.ops[host]]  # type: ignore[no-untyped-call]
    names = [name for name, _ in ops]
    for i in range(3):
        unit = f"sglang-{i}.service"
        mine = [n for n, (name, _) in enumerate(ops) if unit in name and "wave" not in name]
        assert [names[n].split(" ")[0] for n in mine] == ["Environment", "Who", "Unit",
                                                           "Restart", "Enable"]
        if i:  # after the wait for the wave before it
            assert min(mine) > names.index(f"Restart wave ready (after sglang-{i - 1}.service, "
                                           "when its wave is whole)")
    conditions = [cond for name, cond in ops if name.startswith((
        "Environment", "Who", "Unit ", "Reload", "Restart sglang", "Enable"))]
    going: list[Any] = [c for cond in conditions
                        for c in (cond if isinstance(cond, list) else [cond])
                        if getattr(c, "__name__", "") == "going"]
    assert len(going) == len(conditions) == 18
    waves = going[0].__self__
    assert all(c.__self__ is waves for c in going) and all(c() for c in going)
    waves.error = "sglang-0.service failed to start"
    assert not any(c() for c in going)  # every later unit's operations are skipped


def test_every_server_is_gated_and_put_back_before_a_verdict_fails_the_host() -> None:
    """The gate stage as pyinfra builds it: each server's gate and its way back come before
    the first verdict, which stops the host's run when it fails; so a first server that fails
    its gate never leaves the others on a release no gate checked."""
    from pyinfra.api.config import Config
    from pyinfra.api.connect import connect_all
    from pyinfra.api.deploy import add_deploy
    from pyinfra.api.inventory import Inventory
    from pyinfra.api.state import State
    from pyinfra.context import ctx_state

    from sglang_fleet.stages.gate import deploy as gate

    inventory = Inventory((["@local"], {}))  # type: ignore[no-untyped-call]
    state = State(inventory, Config())  # type: ignore[no-untyped-call]
    with ctx_state.use(state):
        connect_all(state)
        found = field_profile({"parallel.instances": 3})
        add_deploy(state, gate.run_gate, profile=found, launches=render_all(found),
                   release=RELEASE)
    host = inventory.get_host("@local")
    names = [sorted(state.op_meta[h].names)[0].split(" | ")[-1]
             for h in state.get_op_order() if h in state.ops[host]]  # type: ignore[no-untyped-call]
    first_verdict = min(n for n, name in enumerate(names) if name.startswith("Gate verdict"))
    for i in range(3):
        unit = f"sglang-{i}.service"
        assert names.index(f"Back to the last good {unit} (only if the gate failed)") < \
            first_verdict
        assert any(name.startswith(f"Gate {unit}: health") for name in names[:first_verdict])
    assert [n for n in names[first_verdict:] if n.startswith("Gate verdict")] == [
        f"Gate verdict on sglang-{i}.service (if it failed: what serves now)" for i in range(3)]
