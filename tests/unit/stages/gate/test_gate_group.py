"""The gate of a multi-node group: a rank >= 1 passes by its journal's start line (never its
HTTP), rank 0 by the full gate once every member started, every MainPID unchanged afterwards;
the group restarts whole (rank 0 stopped first, all started together), and teardown stops rank
0 first. The order is pyinfra's own, read from a State built with both members."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pyinfra
import pytest
from pyinfra.api.deploy import deploy
from pyinfra.api.host import Host as PyinfraHost
from pyinfra.api.inventory import Inventory
from pyinfra.api.state import State, StateStage
from pyinfra.connectors.util import CommandOutput
from pyinfra.context import ctx_host, ctx_state, host

from sglang_fleet import hostconfig, ops
from sglang_fleet.config.render import render_all
from sglang_fleet.hostconfig import groups
from sglang_fleet.stages.gate import deploy as gate
from sglang_fleet.stages.gate import group as gate_group
from sglang_fleet.stages.gate.group import GroupGate
from sglang_fleet.stages.gate.host import member_start
from sglang_fleet.stages.gate.program import GateResult
from sglang_fleet.stages.service import deploy as service
from sglang_fleet.stages.service import group_restart, last_good, units
from sglang_fleet.stages.service.group_restart import GroupRestart
from sglang_fleet.stages.teardown import deploy as teardown
from tests.fakes import RELEASE, Host, commands, executed
from tests.unit.stages.service.test_group_unit import TP16, inventory

UNIT = "sglang.service"
START = "[2026-07-01 10:00:09] Dummy health check server started in background thread at " \
        "0.0.0.0:30000"
SINCE = "Wed 2026-07-01 10:00:00 UTC"


class Executing:
    is_executing = True
    failed_hosts: frozenset[Any] = frozenset()  # hosts that failed earlier in the run


def member(name: str, shell: dict[str, list[str]] | None = None) -> Host:
    """The fake host in the deploy's place, as ``name`` of the test group ``g`` (b200-01 rank
    0, b200-02 rank 1)."""
    real = inventory().get_host(name)
    fake = Host(shell=shell)
    fake.name, fake.print_prefix = real.name, f"[{real.name}] "
    fake.data, fake.groups, fake.inventory = real.data, real.groups, real.inventory  # type: ignore[attr-defined]
    return fake


@pytest.fixture
def use(monkeypatch: pytest.MonkeyPatch) -> Callable[[Host], Host]:
    for module in (gate, gate_group, group_restart, last_good, service):
        monkeypatch.setattr(module, "state", Executing(), raising=False)

    def install(fake: Host) -> Host:
        for module in (gate, gate_group, group_restart, last_good, service, ops):
            monkeypatch.setattr(module, "host", fake, raising=False)
        return fake

    return install


# --- the member's own check, on its host (stages/gate/host/member_start.py) -----------------

def program_result(monkeypatch: pytest.MonkeyPatch, lines: list[str],
                   state: dict[str, str] | None = None) -> dict[str, object]:
    """What member_start finds with this journal (budget 0: one look)."""
    now = {"ActiveState": "active", "SubState": "running", "InvocationID": "inv1",
           "MainPID": "4242", "ExecMainStartTimestamp": SINCE, **(state or {})}
    monkeypatch.setattr(member_start, "unit_state", lambda unit: now)
    monkeypatch.setattr(member_start, "journal", lambda invocation: lines)
    return member_start.check(UNIT, budget=0)


def test_the_start_line_with_nothing_after_it_passes_with_its_pid(
        monkeypatch: pytest.MonkeyPatch) -> None:
    found = program_result(monkeypatch, ["Init parallel ends. elapsed=1.20 s", START])
    assert found == {"ok": True, "pid": "4242", "line": START, "since": SINCE}


def test_no_start_line_says_since_when_and_how_far_it_got(
        monkeypatch: pytest.MonkeyPatch) -> None:
    found = program_result(monkeypatch, ["Init torch distributed begin."])
    assert found["ok"] is False
    assert str(found["error"]).startswith(f"no start line ({member_start.START} ...) since {SINCE}")
    assert "not even the rendezvous with rank 0 ended" in str(found["error"])
    found = program_result(monkeypatch, ["Init torch distributed ends. elapsed=3.1 s, mem "
                                         "usage=0.19 GB"])
    assert "the last sign of progress: Init torch distributed ends." in str(found["error"])


def test_an_exception_after_the_start_line_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    found = program_result(monkeypatch, [
        START, "[2026-07-01 10:03:00 TP8] Scheduler hit an exception: Traceback (most recent "
        "call last):", '  File "scheduler.py", line 1, in event_loop',
        "RuntimeError: [/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:547] Connection "
        "closed by peer"])
    assert found["ok"] is False
    assert str(found["error"]).startswith(f"an exception after its start line ({START}): ")
    assert "Connection closed by peer" in str(found["error"])


def test_a_rendezvous_timeout_fails_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    found = program_result(monkeypatch, [
        "Init torch distributed begin.", "Scheduler hit an exception: Traceback (most recent "
        "call last):", "torch.distributed.DistNetworkError: The client socket has timed out"])
    assert str(found["error"]).startswith("an exception before its start line: ")


def test_a_member_that_went_down_is_said_so(monkeypatch: pytest.MonkeyPatch) -> None:
    found = program_result(monkeypatch, ["Init parallel begin."],
                           {"SubState": "auto-restart", "Result": "signal"})
    assert "went down before its start line" in str(found["error"])


# --- the operations, on the fake host ----------------------------------------------------------

def answered(found: dict[str, object]) -> dict[str, list[str]]:
    """The fake host's answer to the member_start program."""
    return {r"sglang_fleet\.stages\.gate\.host\.member_start": ["sglang.service: x",
                                                    f"{member_start.MARK} {json.dumps(found)}"]}


class Failing(Host):
    """member_start exits 1 when the member did not start."""

    def run_shell_command(self, command: str, **kwargs: Any) -> tuple[bool, CommandOutput]:
        ok, out = super().run_shell_command(command, **kwargs)
        return ("member_start" not in command) and ok, out


def test_a_member_with_no_start_line_fails_the_gate_naming_it(
        use: Callable[[Host], Host], monkeypatch: pytest.MonkeyPatch) -> None:
    error = f"no start line ({member_start.START} ...) since {SINCE}"
    fake = member("b200-02", answered({"ok": False, "error": error}))
    fake.__class__ = Failing
    use(fake)
    launch = render_all(hostconfig.profile_for(fake))[0]  # type: ignore[arg-type]
    record, result = GroupGate("g"), GateResult()
    assert commands(gate_group.member_started, launch, 60, record, result) == []
    assert result.error == f"b200-02 (rank 1 of group g): {error}"
    assert record.failure() == result.error
    # rank 0's gate is not waited for: it fails naming the member, the server never asked
    rank0 = GateResult()
    first = use(member("b200-01"))
    assert commands(gate.gate, hostconfig.profile_for(first), launch, 60, "", rank0,  # type: ignore[arg-type]
                    group=record) == []
    assert rank0.error == f"group g: b200-02 (rank 1 of group g): {error}"


def test_a_member_shows_what_its_journal_said_with_its_escapes(
        use: Callable[[Host], Host]) -> None:
    """A member whose server forged its start line and its error: their escapes as codes."""
    forged = f"\x1b[2K\r{START}\x07"
    fake = use(member("b200-02", answered({"ok": True, "pid": "4242", "line": forged})))
    launch = render_all(hostconfig.profile_for(fake))[0]  # type: ignore[arg-type]
    assert commands(gate_group.member_started, launch, 60, GroupGate("g"), GateResult()) == []
    assert fake.noops == [f"b200-02 (rank 1 of group g) started: \\x1b[2K\\x0d{START}\\x07"]
    fake = member("b200-02", answered({"ok": False, "error": forged}))
    fake.__class__ = Failing
    use(fake)
    result = GateResult()
    assert commands(gate_group.member_started, launch, 60, GroupGate("g"), result) == []
    assert result.error == f"b200-02 (rank 1 of group g): \\x1b[2K\\x0d{START}\\x07"


def test_a_member_with_its_start_line_passes_and_rank0_only_waits(
        use: Callable[[Host], Host]) -> None:
    fake = use(member("b200-02", answered({"ok": True, "pid": "4242", "line": START})))
    launch = render_all(hostconfig.profile_for(fake))[0]  # type: ignore[arg-type]
    record, result = GroupGate("g"), GateResult()
    assert commands(gate_group.member_started, launch, 60, record, result) == []
    assert record.pids == {"b200-02": "4242"} and not result.failed()
    assert fake.noops == [f"b200-02 (rank 1 of group g) started: {START}"]
    rank0 = use(member("b200-01"))
    assert commands(gate_group.member_started, launch, 60, record, GateResult()) == []
    assert rank0.noops == ["b200-01 (rank 0 of group g): its gate follows once every member "
                           "has started"]


def test_a_member_failed_before_its_check_is_named_by_rank0(
        use: Callable[[Host], Host], monkeypatch: pytest.MonkeyPatch) -> None:
    """A member whose start failed (pyinfra skips its later operations, its check included):
    rank 0 names it, and its gate fails at once instead of waiting out the rendezvous."""
    rank0 = use(member("b200-01"))
    failed = Executing()
    failed.failed_hosts = frozenset([inventory().get_host("b200-02")])
    monkeypatch.setattr(gate_group, "state", failed)
    launch = render_all(hostconfig.profile_for(rank0))[0]  # type: ignore[arg-type]
    record = GroupGate("g")
    assert commands(gate_group.member_started, launch, 60, record, GateResult()) == []
    assert record.errors == {"b200-02": "b200-02 (rank 1 of group g): failed in this run "
                             "before its start could be checked (its error above)"}
    assert rank0.noops == []
    result = GateResult()
    assert commands(gate.gate, hostconfig.profile_for(rank0), launch, 60, "", result,  # type: ignore[arg-type]
                    group=record) == []
    assert result.error == f"group g: {record.errors['b200-02']}"


def test_a_member_whose_main_pid_changed_during_the_gate_fails_named(
        use: Callable[[Host], Host]) -> None:
    record = GroupGate("g", pids={"b200-01": "100", "b200-02": "200"})
    use(member("b200-01", {"MainPID": ["100"]}))
    assert commands(gate_group.group_unchanged, UNIT, record) == []
    use(member("b200-02", {"MainPID": ["311"]}))
    assert commands(gate_group.group_unchanged, UNIT, record) == []
    assert record.errors == {"b200-02": "b200-02 (rank 1 of group g): sglang.service restarted "
                             "during the gate (MainPID 200 when its check passed, 311 now)"}
    # every member fails with the group, rank 0 too, and nobody keeps the files
    result = GateResult()
    use(member("b200-01")).facts["File"] = {"mode": 600}
    assert commands(gate_group.group_kept, UNIT, record, result) == []
    assert result.error == f"group g failed its gate: {record.errors['b200-02']}"


def test_the_whole_group_passed_keeps_every_member(use: Callable[[Host], Host]) -> None:
    use(member("b200-02")).facts["Sha256File"] = lambda path: None
    found = commands(gate_group.group_kept, UNIT, GroupGate("g", pids={"b200-02": "1"}),
                     GateResult())
    assert found == [last_good.keep_command(UNIT)]


def test_a_rank1_verdict_never_asks_its_http(use: Callable[[Host], Host]) -> None:
    fake = use(member("b200-02"))
    launch = render_all(hostconfig.profile_for(fake))[0]  # type: ignore[arg-type]
    result = GateResult(error="b200-02 (rank 1 of group g): no start line")
    assert commands(gate.restored, hostconfig.profile_for(fake), launch, 60,  # type: ignore[arg-type]
                    result) == []
    [failed] = commands(gate.gate_failed, launch, result)
    assert "rank 0 b200-01 says whether it serves" in failed and "exit 1" in failed


def test_the_group_stops_rank0_first_then_starts_every_member(
        use: Callable[[Host], Host]) -> None:
    record = GroupRestart("g")
    use(member("b200-02")).facts["UnitCondition"] = {"ActiveState": "active",
                                                     "UnitFileState": "enabled"}
    assert commands(group_restart.restart_wanted, UNIT, record) == []
    assert not record.wanted()  # nothing changed on it: no restart
    rank0 = use(member("b200-01"))
    rank0.facts["UnitCondition"] = {"ActiveState": "failed", "UnitFileState": "enabled"}
    assert executed(rank0, group_restart.restart_wanted, UNIT, record) == [None]
    assert record.wanted_by == ["b200-01"]  # rank 0 is down: the whole group restarts
    assert commands(group_restart.group_stopped, UNIT, record, True) == [f"systemctl stop {UNIT}"]
    assert commands(group_restart.group_stopped, UNIT, record, False) == []
    use(member("b200-02"))
    assert commands(group_restart.group_stopped, UNIT, record, True) == []
    assert commands(group_restart.group_stopped, UNIT, record, False) == \
        [f"systemctl stop {UNIT}"]
    assert commands(group_restart.group_started, UNIT, record) == [units.start_command(UNIT)]


# --- the order pyinfra runs them in -----------------------------------------------------------

@pytest.fixture
def built(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., dict[str, list[str]]]]:
    """Build a deploy on both members of group ``g`` in one pyinfra State (no host reached:
    facts answer None) and give each host's operation names in pyinfra's run order. As its
    command line does: an operation is known by the lines of its call (the API alone counts a
    host's operations, which would pair different operations of two hosts)."""
    monkeypatch.setattr(PyinfraHost, "get_fact", lambda self, fact, *a, **k: None)
    monkeypatch.setattr(pyinfra, "is_cli", True)

    def build(body: Callable[[], None]) -> dict[str, list[str]]:
        inv = Inventory(  # type: ignore[no-untyped-call]
            ([("b200-01", {"sglang_group": "g", "sglang_address": "10.0.0.11"}),
              ("b200-02", {"sglang_group": "g", "sglang_address": "10.0.0.12"})], {}),
            b200=(["b200-01", "b200-02"], dict(TP16)))
        state = State(inv, check_for_changes=False)  # the order, not what the bodies would yield
        state.active_hosts = set(inv)
        state.activated_hosts = set(inv)
        state.current_stage = StateStage.Prepare
        with ctx_state.use(state):
            for member_host in inv:  # as pyinfra's command line runs a deploy file, host by host
                with ctx_host.use(member_host):
                    deploy("test")(body)()
        order = state.get_op_order()  # type: ignore[no-untyped-call]
        return {h.name: [sorted(state.op_meta[o].names)[0].split(" | ")[-1] for o in order
                         if o in state.ops[h]] for h in inv}

    yield build


def _gate() -> None:
    prof = hostconfig.profile_for(host)
    gate.run_gate(profile=prof, launches=render_all(prof, rank=groups.rank_for(host, prof)),
                  release=RELEASE)


def test_rank0s_gate_runs_only_after_every_member_started(
        built: Callable[..., dict[str, list[str]]]) -> None:
    by_host = built(_gate)
    started = "Group g: every rank >= 1 started (its journal's start line since its start, " \
              "no exception after it)"
    full = "Gate sglang.service: health, arguments, smoke generation, soak, capacity"
    unchanged = "Group g: no member restarted during the gate (its MainPID)"
    kept = "Group g: every member passed: sglang.service kept as the last good release"
    rank0, rank1 = by_host["b200-01"], by_host["b200-02"]
    assert full in rank0 and full not in rank1  # a rank >= 1's HTTP is never gated
    assert rank0.index(started) < rank0.index(full) < rank0.index(unchanged) < rank0.index(kept)
    assert rank1.index(started) < rank1.index(unchanged) < rank1.index(kept)
    # on failure: last good files back on every member, then the group restarted whole
    for ops_of in (rank0, rank1):
        back = ops_of.index("Group g: the last good sglang.service back (only if the group "
                            "failed)")
        stop0 = ops_of.index("Group g: rank 0 stopped first (if the group restarts)")
        assert ops_of.index(kept) < back < stop0


def test_the_service_stage_restarts_the_group_whole_rank0_first(
        built: Callable[..., dict[str, list[str]]]) -> None:
    def stage() -> None:
        group_restart.restart_group(UNIT, changes=[])

    for names in built(stage).values():
        assert names == ["Group g: must it restart? (sglang.service changed on a member)",
                         "Group g: must it restart? (sglang.service down on a member)",
                         "Group g: rank 0 stopped first (if the group restarts)",
                         "Group g: the other members stopped (if the group restarts)",
                         "Group g: every member started together (if the group restarts)"]


def test_teardown_stops_rank0_first_then_the_members(
        built: Callable[..., dict[str, list[str]]]) -> None:
    def down() -> None:
        rank0 = groups.rank_of(host) == 0
        teardown.teardown(purge=teardown.Purge(), urls=["http://10.0.0.11:30000"] if rank0 else [],
                          routers=[object()] if rank0 else [],  # type: ignore[list-item]
                          is_router=False, group_units=[UNIT])

    by_host = built(down)
    first = "Group g: rank 0's sglang.service stopped first"
    removal = "Stop and remove the server units and environment files"
    rank0, rank1 = by_host["b200-01"], by_host["b200-02"]
    assert rank0.index("Out of the routers") < rank0.index(first) < rank0.index(removal)
    assert rank1.index(first) < rank1.index(removal)
