"""Gate stage (every run): health within the startup budget (failing fast, with this
invocation's journal), the effective arguments against the rendered ones, a smoke generation,
a soak and the capacity report, run on the host by the host program ``check_server``; a passed
gate keeps the unit and environment as the last good release, a failed one puts them back (its
own operation, ``last_good.restore_unit``) and fails the deploy.

    from sglang_fleet.stages.gate.deploy import run_gate
    run_gate(profile, launches)    # in a pyinfra deploy, after the service stage
"""

from __future__ import annotations

from pyinfra import logger
from pyinfra.api.deploy import deploy
from pyinfra.api.operation import operation
from pyinfra.context import host, state
from pyinfra.facts.files import File

from sglang_fleet import hostconfig
from sglang_fleet.config.exposure import spans_hosts
from sglang_fleet.config.profile import Profile
from sglang_fleet.config.render import Launch
from sglang_fleet.hostconfig import groups
from sglang_fleet.ops import Ops, fail, preview
from sglang_fleet.ops.host_programs import module_file, upload
from sglang_fleet.remote import eta
from sglang_fleet.remote.terminal import printable
from sglang_fleet.report import summary
from sglang_fleet.stages.engine.deploy import Release
from sglang_fleet.stages.gate import resize
from sglang_fleet.stages.gate.group import (
    GroupGate,
    group_kept,
    group_unchanged,
    main_pid,
    member_started,
    who,
)
from sglang_fleet.stages.gate.program import (
    CHECKER,
    HOST,
    GateResult,
    check,
    check_together,
    error_of,
    gate_flags,
    result_of,
)
from sglang_fleet.stages.service import last_good
from sglang_fleet.stages.service.deploy import foreign_listeners, startup_budget
from sglang_fleet.stages.service.group_restart import restart_group, shared


@operation(is_idempotent=True)
def gate(profile: Profile, launch: Launch, budget: int, job: str, result: GateResult,
         soak: int | None = None, final: bool = True, group: GroupGate | None = None) -> Ops:
    """Run the gate's checks of the launch's server on the host; when it passes (and its log's
    max running requests reaches ``memory.target_running_requests``), keep its unit and
    environment as the last good release.

    + launch: the rendered server (unit, port, expected arguments)
    + budget: seconds the server may take to become healthy
    + job: ``COMPLETIONS,TOKENS`` for the job estimate, or empty
    + result: where what it found goes, for ``last_good.restore_unit`` and ``gate_failed``
    + soak: concurrent requests of the soak (None: twice max running requests; 0: none)
    + final: False for a first gate that may ask for a sized restart (``result.resize``)
      instead of failing short of the target
    + group: rank 0 of a multi-node group: its members' record (``gate_group``); the gate is
      not waited for when a member failed, and keeping the files waits for the whole group

    A failed gate changes nothing here: ``last_good.restore_unit`` puts the last good release
    back and ``gate_failed`` fails the deploy; with no last good release this operation fails
    at once.

        gate(name="Gate sglang.service", profile=profile, launch=launch, budget=1800, job="",
             result=GateResult())
    """
    if not state.is_executing:  # it checks the server the run has just (re)started
        yield from preview(gate_preview(profile, launch, budget, soak))
        return
    unit = launch.unit
    failure = group.failure() if group is not None else None
    if group is not None and failure is not None:  # rank 0 cannot be healthy without it
        result.error = group.failed(host.name, f"group {group.group}: {failure}")
        logger.warning(f"{host.print_prefix}{unit}: not gated: {failure}")
        return
    if result.checked is not None:  # checked with the host's other servers (check_together)
        (ok, lines), result.checked = result.checked, None  # a gate after a restart checks anew
    else:
        ok, lines = check(profile, launch, *gate_flags(profile, launch, job, soak), budget=budget)
    printed = result_of(lines)
    error = None if ok else error_of(lines)
    if error is None:
        error, slots = resize.judge(profile, launch, printed, final, result.resize)
        if slots is not None:
            result.resize = slots
            host.noop(f"{unit} passed the gate short of its target: the next operation "
                      f"restarts it with --max-mamba-cache-size {slots}")
            return
    if error is None:
        result.measured = printed.get("measured")
        if group is not None:  # kept once every member is seen unchanged (gate_group)
            group.pids[host.name] = main_pid(unit)
            host.noop(f"{unit} passed the gate; its group's members are checked next")
            return
        if last_good.in_place(unit):
            host.noop(f"{unit} passed the gate and is the last good release already")
            return
        yield last_good.keep_command(unit)
        return
    if group is not None:  # the group's last good release goes back whole (gate_group)
        result.error = group.failed(host.name, f"{who()}: {error}")
        return
    if not host.get_fact(File, path=last_good.saved_unit(unit)):
        yield fail(f"{error} (no earlier good release to return to)")
        return
    result.error = error
    logger.warning(f"{host.print_prefix}{unit}: gate failed, putting the last good release back")
    host.noop(f"{unit} failed the gate: the next operation puts the last good release back")


@operation(is_idempotent=True)
def restored(profile: Profile, launch: Launch, budget: int, result: GateResult) -> Ops:
    """After a failed gate and its restore: what serves on the launch's port (its health,
    checked within the startup budget), kept for the verdict. The host's every restored server
    is checked before any verdict fails the host, so none is left starting unchecked.

    + budget: seconds the restored server may take to become healthy
    + result: what ``gate`` found (the operation does nothing when the gate passed)

        restored(name="What serves", profile=profile, launch=launch, budget=1800,
                 result=result)
    """
    if not result.failed():  # also in the preview: no gate has run yet
        return
    if spans_hosts(launch) and groups.rank_of(host):  # its HTTP is a dummy server's: rank 0's
        # verdict says what serves
        result.serving = (f"the group's last good release is back on every member and "
                          f"restarted together: rank 0 {groups.group_hosts(host)[0].name} "
                          "says whether it serves")
    else:
        back, lines = check(profile, launch, "--health-only", budget=budget, show=False)
        result.serving = what_serves(launch, back, lines)
    host.noop(f"{launch.unit}: {result.serving}")
    yield from ()


@operation(is_idempotent=True)
def gate_failed(launch: Launch, result: GateResult) -> Ops:
    """Fail the host with the gate's error and what ``restored`` found serving after it.

    + result: what ``gate`` and ``restored`` found (nothing to do when the gate passed)

        gate_failed(name="Gate verdict", launch=launch, result=result)
    """
    if result.failed():  # never in the preview: no gate has run yet
        yield fail(f"{result.error}; {result.serving or 'what serves was not checked'}")


@operation(is_idempotent=True)
def host_capacity(units: list[str], results: list[GateResult], job: str) -> Ops:
    """After the host's last gate: its servers' effective max running requests and measured
    output tok/s summed, and with a job its time (``eta``), from what each gate measured.

    + units: the host's server units, in the order of ``results``
    + results: what each unit's gate found (filled in when the gates ran)
    + job: ``COMPLETIONS,TOKENS``, or empty

        host_capacity(name="Capacity of the host", units=["sglang.service"],
                      results=[result], job="900000,1000")
    """
    if not any(found.gated() for found in results):  # the preview: no gate has run yet
        return
    servers = [eta.from_record(unit, found.measured)
               for unit, found in zip(units, results, strict=True)]
    for line in eta.lines(eta.estimate(servers, eta.parse_job(job)), "host",
                          "this run's gate soaks"):
        logger.info(f"{host.print_prefix}{line}")
    host.noop(f"capacity of {len(units)} server{'s' if len(units) > 1 else ''} summed")
    yield from ()


def gate_preview(profile: Profile, launch: Launch, budget: int, soak: int | None) -> str:
    """What the gate of a launch will run, as its preview says it.

        gate_preview(profile, launch, 1800, None)
        # 'the gate of sglang.service will run: health (within 1800 s), arguments, ...'
    """
    target = profile.memory.target_running_requests
    checks = [f"health (within {budget} s)", "arguments", "smoke generation",
              *(["soak"] if soak != 0 else []), "capacity",
              *([f"max running requests against the target {target}"] if target else [])]
    return (f"the gate of {launch.unit} will run: {', '.join(checks)}; if it passes, its unit "
            "and environment are kept as the last good release")


def what_serves(launch: Launch, healthy: bool, lines: list[str]) -> str:
    """What answers on the launch's port after a restore, as checked: its health, who listens
    and what /server_info says; never a claim nobody checked."""
    stale = foreign_listeners(launch)
    if stale:
        return (f"the last good release is NOT serving: port {launch.port} is held by "
                f"{'; '.join(p.describe() for p in stale)}")
    if not healthy:
        return "the last good release did not come back either (/health_generate)"
    info = result_of(lines).get("serving") or {}
    return printable(f"the last good release serves again ({launch.unit} alone on port "
                     f"{launch.port}, /health_generate 200, /server_info: SGLang "
                     f"{info.get('version')}, model {info.get('model_path')})")


@operation(is_idempotent=True)
def smoke(profile: Profile, launch: Launch) -> Ops:
    """The gate's smoke generation alone, with the gate's program the deploy left on the host.

    + profile: the profile the server was rendered from (its served model name)

        smoke(name="Smoke sglang.service", profile=profile, launch=launch)
    """
    if not state.is_executing:
        yield from preview(f"a smoke generation against {launch.unit}", changes=False)
        return
    if not host.get_fact(File, path=module_file(CHECKER)):
        yield fail(f"{module_file(CHECKER)} is missing: run deploys/sglang.py first")
        return
    ok, _ = check(profile, launch, "--smoke-only", label=f"{launch.unit}: ")
    if not ok:
        yield fail(f"{launch.unit}: smoke test failed")
        return
    host.noop(f"{launch.unit} answered the smoke generation")


def _sized_restart(profile: Profile, launch: Launch, release: Release, result: GateResult,
                   target: int, job: str, soak: int | None) -> None:
    """What follows a gate short of the target, each only when it found a size: the restart
    with it, the gate again (final: short again fails), and the size remembered."""
    resize.sized_restart(name=f"{launch.unit}: restart once with the mamba cache sized for "
                         f"{target} running requests (only if the gate found fewer)",
                         profile=profile, launch=launch, release=release, result=result,
                         _if=result.resizing)
    gate(name=f"Gate {launch.unit} after the sized restart (only if there was one)",
         profile=profile, launch=launch, budget=startup_budget(), job=job, result=result,
         soak=soak, _if=result.resizing)
    resize.remember_size(name=f"Remember the mamba cache size of {launch.unit} for later "
                         "deploys (only after a sized restart passed)", profile=profile,
                         launch=launch, result=result, _if=result.resizing)


def _group_gate(profile: Profile, launch: Launch, job: str, soak: int | None) -> GateResult:
    """A member's part of its group's gate (``gate_group``), built on every member in this
    order: rank 0's gate runs once every member's start was checked. No sized restart: it would
    restart rank 0 alone (a group short of ``memory.target_running_requests`` fails)."""
    record, result = shared(GroupGate, "gate"), GateResult()
    name, unit = record.group, launch.unit
    member_started(name=f"Group {name}: every rank >= 1 started (its journal's start line since "
                   "its start, no exception after it)", launch=launch, budget=startup_budget(),
                   record=record, result=result)
    if not groups.rank_of(host):
        gate(name=f"Gate {unit}: health, arguments, smoke generation, soak, capacity",
             profile=profile, launch=launch, budget=startup_budget(), job=job, result=result,
             soak=soak, group=record)
    group_unchanged(name=f"Group {name}: no member restarted during the gate (its MainPID)",
                    unit=unit, record=record)
    group_kept(name=f"Group {name}: every member passed: {unit} kept as the last good release",
               unit=unit, record=record, result=result)
    last_good.restore_files(name=f"Group {name}: the last good {unit} back (only if the group "
                            "failed)", unit=unit, _if=result.failed)
    restart_group(unit, changes=[], always=True, _if=result.failed)
    return result


@deploy("Smoke test")
def smoke_test(profile: Profile, launches: list[Launch]) -> None:
    for launch in launches:
        smoke(name=f"Smoke {launch.unit}", profile=profile, launch=launch)


@deploy("Gate programs")
def gate_programs() -> None:
    """The host programs the gate runs (``check_server`` and what it imports), uploaded before
    the service stage so that none of it happens while the server restarts."""
    upload(HOST)


@deploy("Gate")
def run_gate(profile: Profile, launches: list[Launch], release: Release) -> None:
    """Health, effective arguments, smoke generation, soak and capacity report; with
    ``memory.target_running_requests``, one restart with the mamba cache sized for it when the
    log shows fewer; rollback on failure. The programs it runs are on the host already
    (``gate_programs``)."""
    summary.failed_hosts_at_exit()
    cfg = hostconfig.of(host)
    job = cfg.job_estimate or ""  # "COMPLETIONS,TOKENS", e.g. "900000,1000"
    soak = cfg.gate_soak_requests
    target = profile.memory.target_running_requests
    results = [GateResult() for _ in launches]
    alone = [(launch, result) for launch, result in zip(launches, results, strict=True)
             if not spans_hosts(launch)]
    if len(alone) > 1:  # the host's gate as long as its slowest server's, not their sum
        check_together(name=f"Gate checks of {len(alone)} servers at once: health, arguments, "
                       "smoke generation, soak, capacity (each judged below)", profile=profile,
                       launches=[launch for launch, _ in alone], job=job, soak=soak,
                       budget=startup_budget(), results=[result for _, result in alone])
    for index, launch in enumerate(launches):
        if spans_hosts(launch):  # one rank of a group (its only server): the group's gate
            results[index] = _group_gate(profile, launch, job, soak)
            continue
        result = results[index]
        gate(name=f"Gate {launch.unit}: health, arguments, smoke generation, soak, capacity",
             profile=profile, launch=launch, budget=startup_budget(), job=job,
             result=result, soak=soak, final=target is None)
        if target is not None:
            _sized_restart(profile, launch, release, result, target, job, soak)
        last_good.restore_unit(name=f"Back to the last good {launch.unit} (only if the gate "
                               "failed)", unit=launch.unit, _if=result.failed)
    if not any(spans_hosts(launch) for launch in launches) or not groups.rank_of(host):
        # a rank >= 1 serves through rank 0, which measures the group's capacity
        host_capacity(name=f"Capacity of the host ({len(launches)} server"
                      f"{'s' if len(launches) > 1 else ''}): summed from the gates",
                      units=[launch.unit for launch in launches], results=results, job=job)
    # Every server is gated, a failed one put back and what then serves checked, before a
    # verdict fails the host: a first server's failure must not leave the others on a release
    # nobody checked, nor a restored one still starting when the deploy ends.
    for launch, result in zip(launches, results, strict=True):
        restored(name=f"What serves on {launch.unit} after the restore (only if the gate "
                 "failed)", profile=profile, launch=launch, budget=startup_budget(),
                 result=result, _if=result.failed)
    for launch, result in zip(launches, results, strict=True):
        gate_failed(name=f"Gate verdict on {launch.unit} (if it failed: what serves now)",
                    launch=launch, result=result, _if=result.failed)
