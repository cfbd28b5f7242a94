"""A multi-node group's restart in one pyinfra run: the group restarts whole or not at all, rank
0 stopped first, then the other members, then every member started in one operation.

Why whole: a member that restarts alone finds no rendezvous (rank 0's TCPStore is long gone)
and rank 0 loses a peer, which crashes every rank of the group. Why rank 0 first: it is the
one in the routers (its stop drains it; from 0.5.14 its drained SIGTERM broadcasts SGLang's
ShutdownReq, which ends the other members' schedulers cleanly), while a member stopped first
is a lost peer for rank 0. Why together: rank 0's rendezvous waits for every rank within
``--dist-timeout``, and pyinfra runs an operation on every host of the run before it starts the
next one, so the members' starts, one operation, are seconds apart.

Each member decides only for itself whether its unit must restart (its files changed, or it is
down); the decision is shared through a record all members' operations hold (``shared``):
pyinfra builds every host's operations in one process, then runs them operation by operation,
so what members write in one operation the others read in the next.

    restart_group(launch.unit, changes=[unit_op, env_op], waves=waves, _if=waves.going)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from pyinfra import logger
from pyinfra.api.command import FunctionCommand
from pyinfra.api.operation import OperationMeta, operation
from pyinfra.context import ctx_state, host
from pyinfra.operations.util import any_changed

from sglang_fleet import hostconfig
from sglang_fleet.facts.systemd import UnitCondition
from sglang_fleet.fleet.cutover import disrupt
from sglang_fleet.hostconfig import groups
from sglang_fleet.ops import Ops
from sglang_fleet.stages.service.units import found_down, start_command
from sglang_fleet.stages.service.waves import Waves

T = TypeVar("T")
_RECORDS: dict[tuple[int, str, str], Any] = {}


def shared(kind: Callable[[str], T], purpose: str) -> T:
    """The one record of ``purpose`` for this host's group in this pyinfra run: every member's
    deploy gets the same object (keyed by the run's state and the group's name)."""
    group = hostconfig.of(host).sglang_group or ""
    run = id(ctx_state.get())  # type: ignore[no-untyped-call]  # pyinfra's API is untyped here
    found: T = _RECORDS.setdefault((run, group, purpose), kind(group))
    return found


@dataclass
class GroupRestart:
    """Which members of ``group`` asked for a restart (their name), filled as they decide."""

    group: str
    wanted_by: list[str] = field(default_factory=list)

    def wanted(self) -> bool:
        return bool(self.wanted_by)


def _who() -> str:
    return f"{host.name} (rank {groups.rank_of(host)} of group {hostconfig.of(host).sglang_group})"


@operation(is_idempotent=True)
def restart_wanted(unit: str, record: GroupRestart, restart: bool = False) -> Ops:
    """Whether this member's unit must (re)start: down, or ``restart`` (what it runs changed, or
    a restore); said to the group's record, so that every member restarts with it. The unit is
    enabled here.

    + record: the group's shared record (``shared(GroupRestart, ...)``)
    + restart: it must restart whatever its state (``restart_group``'s ``_if``)

        restart_wanted(name="Must group tp16-a restart?", unit="sglang.service", record=record)
    """
    condition = host.get_fact(UnitCondition, unit=unit)
    down = found_down(unit, condition)
    if down:
        logger.warning(f"{host.print_prefix}{down}")
    if restart or condition.get("ActiveState") != "active":
        yield FunctionCommand(_wanted, (unit, record), {})
    else:
        host.noop(f"{unit} runs what it should")
    if condition.get("UnitFileState") != "enabled":
        yield f"systemctl enable {unit}"


def _wanted(state: Any, host: Any, unit: str, record: GroupRestart) -> None:
    record.wanted_by.append(host.name)
    host.noop(f"{unit} must (re)start: its group {record.group} restarts whole")


@operation(is_idempotent=True)
def group_stopped(unit: str, record: GroupRestart, rank0: bool) -> Ops:
    """When any member asked for a restart: rank 0's unit stopped (``rank0``), or the other
    members' (not ``rank0``: the operation after rank 0's). In a roll the group leaves the
    routers first (rank 0's URL, whichever member disrupts first).

    + record: the group's shared record, filled by ``restart_wanted``
    + rank0: stop rank 0 (True) or the members of rank >= 1 (False)

        group_stopped(name="Group tp16-a: rank 0 stopped first", unit="sglang.service",
                      record=record, rank0=True)
    """
    if not record.wanted():  # also in the preview: the members decide as they run
        return
    if (groups.rank_of(host) == 0) is not rank0:
        host.noop(f"{_who()}: {'rank 0 stops first' if rank0 else 'stopped already'}")
        return
    logger.info(f"{host.print_prefix}{_who()}: stopping {unit} (group restart asked by "
                f"{', '.join(record.wanted_by)})")
    # the whole host leaves: a member's server is one rank of the group's one worker
    yield from disrupt(f"systemctl stop {unit}")


@operation(is_idempotent=True)
def group_started(unit: str, record: GroupRestart, waves: Waves | None = None) -> Ops:
    """Every member's unit started in this one operation (pyinfra runs it on all of them at
    once), when the group restarts: rank 0's rendezvous waits for all of them.

    + waves: the host's restart waves, told of the start (``wave_ready`` waits for rank 0)

        group_started(name="Group tp16-a: every member started together",
                      unit="sglang.service", record=record)
    """
    if not record.wanted():  # also in the preview: the members decide as they run
        return
    if waves is not None:
        waves.start(unit)
    yield from disrupt(start_command(unit))


def restart_group(unit: str, changes: list[OperationMeta], waves: Waves | None = None,
                  always: bool = False, _if: Any = None) -> None:
    """The five operations of a group's restart, built on every member in the same order
    (pyinfra orders a run's operations by each host's sequence)."""
    group = hostconfig.of(host).sglang_group
    record = shared(GroupRestart, "restart-always" if always else "restart")
    changed: Callable[[], bool] = (lambda: True) if always else any_changed(*changes)
    going = [_if] if _if is not None else []
    restart_wanted(name=f"Group {group}: must it restart? ({unit} changed on a member)",
                   unit=unit, record=record, restart=True, _if=[*going, changed])
    restart_wanted(name=f"Group {group}: must it restart? ({unit} down on a member)",
                   unit=unit, record=record, _if=[*going, lambda: not changed()])
    group_stopped(name=f"Group {group}: rank 0 stopped first (if the group restarts)",
                  unit=unit, record=record, rank0=True, _if=going)
    group_stopped(name=f"Group {group}: the other members stopped (if the group restarts)",
                  unit=unit, record=record, rank0=False, _if=going)
    group_started(name=f"Group {group}: every member started together (if the group restarts)",
                  unit=unit, record=record, waves=waves, _if=going)
