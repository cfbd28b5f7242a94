"""The gate of a multi-node group, in one pyinfra run of all its members.

A rank >= 1 serves no API: its port answers a dummy health server, 200 whatever happens, so the
gate never reads its HTTP. Its gate is its journal: the start line since the unit's current
start and no exception after it (``host/member_start.py``). Rank 0 then passes the full gate
(health, effective arguments, smoke generation, soak, capacity: ``gate.gate``). Last, every
member's MainPID must be the one it had when its check passed: a member that restarted during
the gate (a crash, systemd's restart) fails it, named. Only then does each member keep its files
as the last good release; a failure anywhere fails every member, which get their last good
files back and restart as a group (``group_restart``).

The order is pyinfra's: it runs an operation on every host of the run before it starts the
next, so the operations below, built on every member in this order, run as

    members started (ranks >= 1 wait for their start line; rank 0 waits with them)
    → rank 0's gate → every MainPID unchanged → every member keeps, or fails with the group

and rank 0's gate begins only once every member's start line was seen (or its absence said).

    record = shared(GroupGate, "gate")
    member_started(name="...", launch=launch, budget=1800, record=record, result=result)
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field

from pyinfra import logger
from pyinfra.api.deploy import deploy
from pyinfra.api.operation import operation
from pyinfra.context import host, state
from pyinfra.facts.files import File

from sglang_fleet import hostconfig
from sglang_fleet.config.profile import Profile
from sglang_fleet.config.render import Launch
from sglang_fleet.hostconfig import groups
from sglang_fleet.ops import Ops, fail, preview, result_line, run
from sglang_fleet.ops.host_programs import program
from sglang_fleet.remote.terminal import printable
from sglang_fleet.report import summary
from sglang_fleet.stages.gate.host.member_start import MARK
from sglang_fleet.stages.gate.program import GateResult
from sglang_fleet.stages.service import last_good
from sglang_fleet.stages.service.deploy import startup_budget
from sglang_fleet.stages.service.group_restart import restart_group, shared

MEMBER = "sglang_fleet.stages.gate.host.member_start"  # run by the system python


@dataclass
class GroupGate:
    """What the members' gates found, shared by every member's operations (``shared``): each
    member's MainPID when its check passed, and why any of them failed (by host)."""

    group: str
    pids: dict[str, str] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)

    def failure(self) -> str | None:
        """The first failure found, naming its host (None: none so far)."""
        return next(iter(self.errors.values()), None)

    def failed(self, name: str, error: str) -> str:
        self.errors.setdefault(name, error)
        return error


def who(name: str | None = None) -> str:
    """``HOST (rank R of group G)`` for this host."""
    return (f"{name or host.name} (rank {groups.rank_of(host)} of group "
            f"{hostconfig.of(host).sglang_group})")


def main_pid(unit: str) -> str:
    """The unit's MainPID now, read on the host ("" when systemd does not answer)."""
    ok, output = run(f"systemctl show -p MainPID --value {shlex.quote(unit)}")
    return next(iter(output.stdout_lines), "").strip() if ok else ""


@operation(is_idempotent=True)
def member_started(launch: Launch, budget: int, record: GroupGate,
                   result: GateResult | None = None) -> Ops:
    """On a rank >= 1: wait (within ``budget``) for its start line in the journal since its
    unit's current start, with no exception after it; its MainPID then goes to ``record``. On
    rank 0: nothing, in the same operation, so its gate comes after every member's.

    + budget: seconds the member may take to start (the startup budget)
    + result: the member's GateResult (its ``error`` when it failed); None: a failure fails
      the host here (a restore's check)

        member_started(name="Group tp16-a: members started", launch=launch, budget=1800,
                       record=record, result=GateResult())
    """
    if not state.is_executing:  # it checks the start the run has just made
        yield from preview(f"a rank >= 1 of group {record.group}: waits up to {budget} s for "
                           f"{launch.unit}'s start line in its journal, no exception after it "
                           "(never its HTTP: a dummy health server); rank 0's gate follows",
                           changes=False)
        return
    if not groups.rank_of(host):
        # A member that failed earlier in this run (its start refused: a unit that would not
        # start, a failed command) runs none of this: pyinfra skips a failed host's later
        # operations, so only rank 0 can say that it never started; unsaid, rank 0's gate
        # would wait out the rendezvous and fail on its own timeout, naming nobody.
        failed = {h.name for h in state.failed_hosts}
        for rank, member in enumerate(groups.group_hosts(host)):
            if rank and member.name in failed:
                error = record.failed(member.name, f"{member.name} (rank {rank} of group "
                                      f"{record.group}): failed in this run before its start "
                                      "could be checked (its error above)")
                logger.warning(f"{host.print_prefix}{error}")
        if record.failure() is None:
            host.noop(f"{who()}: its gate follows once every member has started")
        return
    ok, output = run(shlex.join(program("python3", MEMBER, "--unit", launch.unit,
                                        "--budget", str(budget))))
    lines = list(output.stdout_lines)
    for line in lines:
        if not line.startswith(f"{MARK} "):
            logger.info(f"{host.print_prefix}{printable(line)}")
    found = result_line(lines, MARK) or {}
    if ok and found.get("ok"):
        record.pids[host.name] = str(found.get("pid", ""))
        host.noop(printable(f"{who()} started: {found.get('line')}"))
        return
    error = printable(f"{who()}: {found.get('error') or 'its start check gave no result'}")
    record.failed(host.name, error)
    if result is None:
        yield fail(error)
        return
    result.error = error
    logger.warning(f"{host.print_prefix}{error}")


@operation(is_idempotent=True)
def group_unchanged(unit: str, record: GroupGate) -> Ops:
    """Every member's MainPID as when its check passed (rank 0's: when its gate passed): a
    member that restarted during the gate (a crash and systemd's restart) fails it.


        group_unchanged(name="Group tp16-a: no member restarted", unit="sglang.service",
                        record=record)
    """
    passed = record.pids.get(host.name)
    if passed is None:  # it failed its check already (or rank 0 its gate), or the preview
        return
    now = main_pid(unit)
    if now != passed:
        error = record.failed(host.name, f"{who()}: {unit} restarted during the gate (MainPID "
                              f"{passed} when its check passed, {now or 'none'} now)")
        logger.warning(f"{host.print_prefix}{error}")
        return
    host.noop(f"{who()}: {unit} still MainPID {now}")
    yield from ()


@operation(is_idempotent=True)
def group_kept(unit: str, record: GroupGate, result: GateResult) -> Ops:
    """When every member passed: keep this member's unit and environment as the last good
    release. When any failed: this member fails with the group, naming the first failure (its
    last good files go back in the next operations, and the group restarts).

    + result: the member's GateResult

        group_kept(name="Group tp16-a: last good release", unit="sglang.service",
                   record=record, result=result)
    """
    failure = record.failure()
    if failure is None:
        if last_good.in_place(unit):
            host.noop(f"{unit} passed the gate and is the last good release already")
            return
        yield last_good.keep_command(unit)
        return
    error = result.error or f"group {record.group} failed its gate: {failure}"
    result.error = error
    if not host.get_fact(File, path=last_good.saved_unit(unit)):
        yield fail(f"{error} (no earlier good release to return to)")
        return
    logger.warning(f"{host.print_prefix}{unit}: the group's gate failed, its last good release "
                   "goes back on every member")


@deploy("Back to the group's last good release")
def restore_group(profile: Profile, launch: Launch) -> None:
    """What a roll does to a group whose new release failed: every member's last good files
    back, the group restarted whole (rank 0 stopped first, all started together), each rank >=
    1's start line checked, then rank 0's health and a smoke generation."""
    summary.failed_hosts_at_exit()
    record, unit = shared(GroupGate, "restore"), launch.unit
    last_good.restore_files(name=f"Group {record.group}: the last good {unit} back", unit=unit)
    restart_group(unit, changes=[], always=True)
    member_started(name=f"Group {record.group}: every rank >= 1 started again (its journal)",
                   launch=launch, budget=startup_budget(), record=record)
    if not groups.rank_of(host):
        last_good.check_restored(name=f"Gate {unit}: health and smoke generation",
                                 profile=profile, launch=launch, budget=startup_budget())
