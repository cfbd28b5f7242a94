"""Gate stage (every run): health within the startup budget (failing fast, with this
invocation's journal), the effective arguments against the rendered ones, a smoke generation,
a soak and the capacity report, run on the host by the host program ``check_server``; a failed
gate puts the last good unit and environment back (its own operation, ``last_good_back``) and
fails the deploy.

    from sglang_fleet.stages.gate import run_gate
    run_gate(profile, launches)    # in a pyinfra deploy, after the service stage
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from pyinfra import logger
from pyinfra.api.deploy import deploy
from pyinfra.api.operation import operation
from pyinfra.context import host, state
from pyinfra.facts.files import File, FindInFile, Link, Sha256File

from sglang_fleet.config.profile import Profile
from sglang_fleet.config.render import MAMBA_STRATEGY_DESTS, Launch
from sglang_fleet.errors import InputError
from sglang_fleet.ops import Ops, fail
from sglang_fleet.ops.host_programs import module_file, upload
from sglang_fleet.paths import CURRENT, LAST_GOOD, RELEASES, env_file, gate_record, unit_path
from sglang_fleet.remote import eta
from sglang_fleet.report import summary
from sglang_fleet.rollout.cutover import leave_routers
from sglang_fleet.stages import resize
from sglang_fleet.stages.engine import Release
from sglang_fleet.stages.gate_program import CHECKER, check, error_of, result_of
from sglang_fleet.stages.service import (
    foreign_listeners,
    found_down,
    start_command,
    startup_budget,
    unit_condition,
)

_RELEASE = re.compile(re.escape(RELEASES) + r"/[^/ ]+")


def expectations(launch: Launch) -> dict[str, Any]:
    """What /server_info must report for this launch (SGLang resolves the rest itself)."""
    args = launch.args
    expect: dict[str, Any] = {"model_path": args["model_path"], "version": launch.version,
                              "served_model_name": args.get("served_model_name")}
    if args.get("speculative_algorithm"):
        expect["speculative_algorithm"] = args["speculative_algorithm"]
    for dest in MAMBA_STRATEGY_DESTS:
        if args.get(dest) not in (None, "auto"):
            expect[dest] = args[dest]
    if args.get("max_running_requests") is not None:
        expect["max_running_requests"] = args["max_running_requests"]
    return expect


def soak_requests(data: Any, host_name: str) -> int | None:
    """``gate_soak_requests`` from host data: None (twice max running requests), 0 (no soak)
    or a number of concurrent requests.

        soak_requests({"gate_soak_requests": 64}, "b200-01")    # 64
    """
    value = data.get("gate_soak_requests")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InputError.one(f"pyinfra data of {host_name}", "gate_soak_requests",
                             f"must be a whole number of requests, 0 or more, got {value!r}",
                             "e.g. gate_soak_requests = 64, or 0 to skip the soak; leave it "
                             "out for twice max running requests")
    return value


def _same(a: str, b: str) -> bool:
    """Both files exist and hold the same bytes (read as facts: checksums)."""
    sums = [host.get_fact(Sha256File, path=path) for path in (a, b)]
    return sums[0] is not None and sums[0] == sums[1]


def _saved(unit: str) -> str:
    return f"{LAST_GOOD}/{unit}"


@dataclass
class Verdict:
    """What the gate of one unit found, for the operations after it: the operations are all
    built before any runs, so the gate writes here when it runs and they read it then
    (``last_good_back`` and ``gate_failed`` its error, ``host_capacity`` what it measured).

        verdict = Verdict(); verdict.error = "soak: 3 of 32 failed"; verdict.failed()  # True
    """

    error: str | None = None
    measured: dict[str, Any] | None = None  # the GATE line's "measured", once it passed
    resize: int | None = None  # the mamba cache size for the target: restart once with it

    def failed(self) -> bool:
        return self.error is not None

    def resizing(self) -> bool:
        """The gate found fewer running requests than the target and a size that fits; true
        until a gate fails."""
        return self.resize is not None and self.error is None


@operation(is_idempotent=True)
def gate(profile: Profile, launch: Launch, budget: int, job: str, verdict: Verdict,
         soak: int | None = None, final: bool = True) -> Ops:
    """Run the gate's checks of the launch's server on the host; when it passes (and its log's
    max running requests reaches ``memory.target_running_requests``), keep its unit and
    environment as the last good release.

    + profile: the profile the server was rendered from
    + launch: the rendered server (unit, port, expected arguments)
    + budget: seconds the server may take to become healthy
    + job: ``COMPLETIONS,TOKENS`` for the job estimate, or empty
    + verdict: where the result goes for ``last_good_back`` and ``gate_failed`` after it
    + soak: concurrent requests of the soak (None: twice max running requests; 0: none)
    + final: False for a first gate that may ask for a sized restart (``verdict.resize``)
      instead of failing short of the target

    A failed gate changes nothing here: ``last_good_back`` puts the last good release back and
    ``gate_failed`` fails the deploy; with no last good release this operation fails at once.

        gate(name="Gate sglang.service", profile=profile, launch=launch, budget=1800, job="",
             verdict=Verdict())
    """
    if not state.is_executing:
        return
    unit, env, saved = launch.unit, env_file(launch.unit), _saved(launch.unit)
    target = profile.memory.target_running_requests
    ok, lines = check(profile, launch, "--expect", json.dumps(expectations(launch)),
                      *(["--job", job] if job else []), "--record", gate_record(unit),
                       *(["--soak-requests", str(soak)] if soak is not None else []),
                       *(["--target", str(target)] if target else []),
                       budget=budget)
    result = result_of(lines)
    error = None if ok else error_of(lines)
    if error is None:
        error, slots = resize.judge(profile, launch, result, final, verdict.resize)
        if slots is not None:
            verdict.resize = slots
            host.noop(f"{unit} passed the gate short of its target: the next operation "
                      f"restarts it with --max-mamba-cache-size {slots}")
            return
    if error is None:
        verdict.measured = result.get("measured")
        if _files_are_last_good(unit):
            host.noop(f"{unit} passed the gate and is the last good release already")
            return
        yield (f"install -d -m 700 {LAST_GOOD} && cp -p {unit_path(unit)} {saved} && "
               f"cp -p {env} {saved}.env")
        return
    if not host.get_fact(File, path=saved):
        yield fail(f"{error} (no earlier good release to return to)")
        return
    verdict.error = error
    logger.warning(f"{host.print_prefix}{unit}: gate failed, putting the last good release back")
    host.noop(f"{unit} failed the gate: the next operation puts the last good release back")


@operation(is_idempotent=True)
def gate_failed(profile: Profile, launch: Launch, budget: int, verdict: Verdict) -> Ops:
    """Fail the deploy with the gate's error and what serves after the last good release was
    put back (its health, checked within the startup budget).

    + profile: the profile the server was rendered from
    + launch: the rendered server
    + budget: seconds the restored server may take to become healthy
    + verdict: what ``gate`` found (the operation does nothing when the gate passed)

        gate_failed(name="Gate verdict", profile=profile, launch=launch, budget=1800,
                    verdict=verdict)
    """
    if not state.is_executing or not verdict.failed():
        return
    back, lines = check(profile, launch, "--health-only", budget=budget, show=False)
    yield fail(f"{verdict.error}; {what_serves(launch, back, lines)}")


@operation(is_idempotent=True)
def host_capacity(units: list[str], verdicts: list[Verdict], job: str) -> Ops:
    """After the host's last gate: its servers' effective max running requests and measured
    output tok/s summed, and with a job its time (``eta``), from what each gate measured.

    + units: the host's server units, in the order of ``verdicts``
    + verdicts: what each unit's gate found (filled in when the gates ran)
    + job: ``COMPLETIONS,TOKENS``, or empty

        host_capacity(name="Capacity of the host", units=["sglang.service"],
                      verdicts=[verdict], job="900000,1000")
    """
    if not state.is_executing:
        return
    servers = [eta.from_record(unit, v.measured) for unit, v in zip(units, verdicts,
                                                                     strict=True)]
    for line in eta.lines(eta.estimate(servers, eta.parse_job(job)), "host",
                          "this run's gate soaks"):
        logger.info(f"{host.print_prefix}{line}")
    host.noop(f"capacity of {len(units)} server{'s' if len(units) > 1 else ''} summed")
    yield from ()


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
    return (f"the last good release serves again ({launch.unit} alone on port {launch.port}, "
            f"/health_generate 200, /server_info: SGLang {info.get('version')}, model "
            f"{info.get('model_path')})")


@operation(is_idempotent=True)
def smoke(profile: Profile, launch: Launch) -> Ops:
    """The gate's smoke generation alone, with the gate's program the deploy left on the host.

    + profile: the profile the server was rendered from (its served model name)
    + launch: the rendered server

        smoke(name="Smoke sglang.service", profile=profile, launch=launch)
    """
    if not state.is_executing:
        return
    if not host.get_fact(File, path=module_file(CHECKER)):
        yield fail(f"{module_file(CHECKER)} is missing: run deploys/sglang.py first")
        return
    ok, _ = check(profile, launch, "--smoke-only", label=f"{launch.unit}: ")
    if not ok:
        yield fail(f"{launch.unit}: smoke test failed")
        return
    host.noop(f"{launch.unit} answered the smoke generation")


def _release_of(unit_file: str) -> str | None:
    """The engine release directory a unit file runs (read as a fact)."""
    lines = host.get_fact(FindInFile, path=unit_file, pattern=f"{RELEASES}/") or []
    found = next((m for m in (_RELEASE.search(line) for line in lines) if m), None)
    return found.group(0) if found else None


def _saved_files(unit: str) -> bool:
    saved = _saved(unit)
    return bool(host.get_fact(File, path=saved) and host.get_fact(File, path=f"{saved}.env"))


def _files_are_last_good(unit: str) -> bool:
    """The unit and environment files in place are the ones that last passed the gate."""
    saved = _saved(unit)
    return _same(saved, unit_path(unit)) and _same(f"{saved}.env", env_file(unit))


def _files_back(unit: str) -> str:
    saved = _saved(unit)
    return (f"cp -p {saved} {unit_path(unit)} && cp -p {saved}.env {env_file(unit)} && "
            "systemctl daemon-reload")


def _current_back(unit: str) -> Ops:
    """``current`` on the release the last good unit runs."""
    release = _release_of(_saved(unit))
    link = host.get_fact(Link, path=CURRENT)
    if release and link and link.get("link_target") != release:
        yield f"ln -sfn {release} {CURRENT}.new && mv -T {CURRENT}.new {CURRENT}"


@operation(is_idempotent=True)
def last_good_back(unit: str) -> Ops:
    """Put the unit and environment that last passed the gate back, with the ``current`` link
    on the release they run, and restart the unit if it ran something else.

    + unit: the server unit, e.g. ``sglang.service``

        last_good_back(name="Last good sglang.service", unit="sglang.service")
    """
    if not _saved_files(unit):
        yield fail(f"{unit}: no release has passed the gate on this host: nothing to go back to")
        return
    if not _files_are_last_good(unit):
        yield from leave_routers([unit])
        yield f"{_files_back(unit)} && {start_command(unit)}"
    else:
        condition = unit_condition(unit)
        down = found_down(unit, condition)
        if down:
            logger.warning(f"{host.print_prefix}{down}")
        if condition.get("ActiveState") != "active":
            yield from leave_routers([unit])
            yield start_command(unit)
        else:
            host.noop(f"{unit} runs its last good release")
    yield from _current_back(unit)


@operation(is_idempotent=True)
def files_back(unit: str) -> Ops:
    """The last good unit and environment files back in place, ``current`` on their release,
    without a restart: for a host a roll stopped after its files changed and before its
    restart, whose server still runs the last good release. A unit no release of which passed
    the gate (a new instance never started) is removed.

    + unit: the server unit, e.g. ``sglang.service``

        files_back(name="Files of sglang.service back", unit="sglang.service")
    """
    if not _saved_files(unit):
        if host.get_fact(File, path=unit_path(unit)) and unit_condition(unit).get(
                "ActiveState") != "active":
            yield f"rm -f {unit_path(unit)} {env_file(unit)} && systemctl daemon-reload"
        else:
            host.noop(f"{unit}: no last good release to put back")
        return
    if _files_are_last_good(unit):
        host.noop(f"{unit}: its files are the last good release's")
    else:
        yield _files_back(unit)
    yield from _current_back(unit)


@operation(is_idempotent=True)
def regate(profile: Profile, launch: Launch, budget: int) -> Ops:
    """Health (within the startup budget) and a smoke generation of what serves now.

    + profile: the profile the server was rendered from
    + launch: the rendered server
    + budget: seconds the server may take to become healthy

        regate(name="Gate sglang.service again", profile=profile, launch=launch, budget=1800)
    """
    if not state.is_executing:
        return
    for only in ("--health-only", "--smoke-only"):
        ok, _ = check(profile, launch, only, budget=budget, label=f"{launch.unit}: ")
        if not ok:
            yield fail(f"{launch.unit}: the last good release does not pass the gate either "
                       f"({only.removeprefix('--').replace('-only', '')})")
            return


@deploy("Back to the last good release")
def restore_last_good(profile: Profile, launches: list[Launch]) -> None:
    """What a rolling redeploy does to a host whose new release failed."""
    summary.failed_hosts_at_exit()
    for launch in launches:
        last_good_back(name=f"Last good {launch.unit}", unit=launch.unit)
        regate(name=f"Gate {launch.unit}: health and smoke generation", profile=profile,
               launch=launch, budget=startup_budget())


def _sized_restart(profile: Profile, launch: Launch, release: Release, verdict: Verdict,
                   target: int, job: str, soak: int | None) -> None:
    """What follows a gate short of the target, each only when it found a size: the restart
    with it, the gate again (final: short again fails), and the size remembered."""
    resize.sized_restart(name=f"{launch.unit}: restart once with the mamba cache sized for "
                         f"{target} running requests (only if the gate found fewer)",
                         profile=profile, launch=launch, release=release, verdict=verdict,
                         _if=verdict.resizing)
    gate(name=f"Gate {launch.unit} after the sized restart (only if there was one)",
         profile=profile, launch=launch, budget=startup_budget(), job=job, verdict=verdict,
         soak=soak, _if=verdict.resizing)
    resize.remember_size(name=f"Remember the mamba cache size of {launch.unit} for later "
                         "deploys (only after a sized restart passed)", profile=profile,
                         launch=launch, verdict=verdict, _if=verdict.resizing)


@deploy("Smoke test")
def smoke_test(profile: Profile, launches: list[Launch]) -> None:
    for launch in launches:
        smoke(name=f"Smoke {launch.unit}", profile=profile, launch=launch)


@deploy("Gate programs")
def gate_programs() -> None:
    """The host programs the gate runs (``check_server`` and what it imports), uploaded before
    the service stage so that none of it happens while the server restarts."""
    upload("capacity", "crash", "eta", "readiness", CHECKER)


@deploy("Gate")
def run_gate(profile: Profile, launches: list[Launch], release: Release) -> None:
    """Health, effective arguments, smoke generation, soak and capacity report; with
    ``memory.target_running_requests``, one restart with the mamba cache sized for it when the
    log shows fewer; rollback on failure. The programs it runs are on the host already
    (``gate_programs``)."""
    summary.failed_hosts_at_exit()
    job = host.data.get("job_estimate") or ""  # "COMPLETIONS,TOKENS", e.g. "900000,1000"
    soak = soak_requests(host.data, host.name)
    verdicts = []
    target = profile.memory.target_running_requests
    for launch in launches:
        verdict = Verdict()
        verdicts.append(verdict)
        gate(name=f"Gate {launch.unit}: health, arguments, smoke generation, soak, capacity",
             profile=profile, launch=launch, budget=startup_budget(), job=str(job),
             verdict=verdict, soak=soak, final=target is None)
        if target is not None:
            _sized_restart(profile, launch, release, verdict, target, str(job), soak)
        last_good_back(name=f"Back to the last good {launch.unit} (only if the gate failed)",
                       unit=launch.unit, _if=verdict.failed)
    host_capacity(name=f"Capacity of the host ({len(launches)} server"
                  f"{'s' if len(launches) > 1 else ''}): summed from the gates",
                  units=[launch.unit for launch in launches], verdicts=verdicts, job=str(job))
    # Every server is gated (and a failed one put back) before a verdict fails the host: a
    # first server's failure must not leave the others on a release nobody checked.
    for launch, verdict in zip(launches, verdicts, strict=True):
        gate_failed(name=f"Gate verdict on {launch.unit} (if it failed: what serves now)",
                    profile=profile, launch=launch, budget=startup_budget(), verdict=verdict,
                    _if=verdict.failed)
