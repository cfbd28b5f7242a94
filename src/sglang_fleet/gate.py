"""Gate stage (every run): health within the startup budget (failing fast, with this
invocation's journal), the effective arguments against the rendered ones, a smoke generation
and the capacity report, run on the host by ``gate_check``; a failed gate puts the last good
unit and environment back and fails the deploy.

    from sglang_fleet.gate import run_gate
    run_gate(profile, launch)      # in a pyinfra deploy, after the service stage
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

from pyinfra import logger
from pyinfra.api.deploy import deploy
from pyinfra.api.operation import operation
from pyinfra.context import host, state
from pyinfra.operations import files

from sglang_fleet import summary
from sglang_fleet.engine import CURRENT, RELEASES, TOOLS
from sglang_fleet.errors import InputError
from sglang_fleet.ops import Ops, fail, run
from sglang_fleet.profile import Profile
from sglang_fleet.render import MAMBA_STRATEGY_DESTS, Launch
from sglang_fleet.service import (
    env_file,
    foreign_listeners,
    found_down,
    start_command,
    startup_budget,
    unit_condition,
    unit_path,
)

LAST_GOOD = "/etc/sglang/last-good"
HERE = Path(__file__).resolve().parent


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


def url(profile: Profile, launch: Launch) -> str:
    address = profile.server.host
    return f"http://{'127.0.0.1' if address in ('0.0.0.0', '::') else address}:{launch.port}"


def _check(profile: Profile, launch: Launch, *flags: str, budget: int | None = None,
           show: bool = True, label: str = "") -> tuple[bool, list[str]]:
    """Run gate_check on the host for one launch; show its human lines (after ``label``)."""
    argv = ["--unit", launch.unit, "--url", url(profile, launch), "--env-file",
            env_file(launch.unit), "--model", profile.model.served_name,
            *(["--budget", str(budget)] if budget is not None else []), *flags]
    command = f"PYTHONPATH={TOOLS} python3 -m sglang_fleet.gate_check {shlex.join(argv)}"
    ok, output = run(command)
    lines = list(output.stdout_lines)
    for line in lines if show else ():
        if not line.startswith("GATE "):
            logger.info(f"{host.print_prefix}{label}{line}")
    return ok, lines


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
    ok, _ = run(f"cmp -s {a} {b}")
    return bool(ok)


@operation(is_idempotent=True)
def gate(profile: Profile, launch: Launch, budget: int, job: str,
         soak: int | None = None) -> Ops:
    if not state.is_executing:
        return
    unit, env, saved = launch.unit, env_file(launch.unit), f"{LAST_GOOD}/{launch.unit}"
    ok, lines = _check(profile, launch, "--expect", json.dumps(expectations(launch)),
                       *(["--job", job] if job else []),
                       *(["--soak-requests", str(soak)] if soak is not None else []),
                       budget=budget)
    if ok:
        if not (_same(unit_path(unit), saved) and _same(env, f"{saved}.env")):
            yield (f"install -d -m 700 {LAST_GOOD} && cp -p {unit_path(unit)} {saved} && "
                   f"cp -p {env} {saved}.env")
        return
    error = next((json.loads(line[5:]).get("error", "gate failed") for line in lines
                  if line.startswith("GATE ")), "gate failed")
    has_last, _ = run(f"test -f {saved}")
    if not has_last:
        yield fail(f"{error} (no earlier good release to return to)")
        return
    logger.warning(f"{host.print_prefix}{unit}: gate failed, putting the last good release back")
    run(f"cp -p {saved} {unit_path(unit)} && cp -p {saved}.env {env} && "
        f"systemctl daemon-reload && {start_command(unit)}")
    back, lines = _check(profile, launch, "--health-only", budget=budget, show=False)
    yield fail(f"{error}; {what_serves(launch, back, lines)}")


def what_serves(launch: Launch, healthy: bool, lines: list[str]) -> str:
    """What answers on the launch's port after a restore, as checked: its health, who listens
    and what /server_info says; never a claim nobody checked."""
    stale = foreign_listeners(launch)
    if stale:
        return (f"the last good release is NOT serving: port {launch.port} is held by "
                f"{'; '.join(p.describe() for p in stale)}")
    if not healthy:
        return "the last good release did not come back either (/health_generate)"
    result: dict[str, Any] = next((json.loads(line[5:]) for line in lines
                                   if line.startswith("GATE ")), {})
    info = result.get("serving") or {}
    return (f"the last good release serves again ({launch.unit} alone on port {launch.port}, "
            f"/health_generate 200, /server_info: SGLang {info.get('version')}, model "
            f"{info.get('model_path')})")


@operation(is_idempotent=True)
def smoke(profile: Profile, launch: Launch) -> Ops:
    """The gate's smoke generation alone, with the gate tools the deploy left on the host."""
    if not state.is_executing:
        return
    installed, _ = run(f"test -f {TOOLS}/sglang_fleet/gate_check.py")
    if not installed:
        yield fail(f"{TOOLS} has no gate tools: run deploys/sglang.py first")
        return
    ok, _ = _check(profile, launch, "--smoke-only", label=f"{launch.unit}: ")
    if not ok:
        yield fail(f"{launch.unit}: smoke test failed")


@operation(is_idempotent=True)
def last_good_back(unit: str) -> Ops:
    """Put the unit and environment that last passed the gate back, with the ``current`` link
    on the release they run, and restart the unit if it ran something else."""
    saved = f"{LAST_GOOD}/{unit}"
    ok, _ = run(f"test -f {saved} -a -f {saved}.env")
    if not ok:
        yield fail(f"{unit}: no release has passed the gate on this host: nothing to go back to")
        return
    if not (_same(saved, unit_path(unit)) and _same(f"{saved}.env", env_file(unit))):
        yield (f"cp -p {saved} {unit_path(unit)} && cp -p {saved}.env {env_file(unit)} && "
               f"systemctl daemon-reload && {start_command(unit)}")
    else:
        condition = unit_condition(unit)
        down = found_down(unit, condition)
        if down:
            logger.warning(f"{host.print_prefix}{down}")
        if condition.get("ActiveState") != "active":
            yield start_command(unit)
    ok, out = run(
        f"grep -o '{RELEASES}/[^/ ]*' {saved} | head -1; readlink {CURRENT} || true")
    lines = [line.strip() for line in out.stdout_lines] if ok else []
    if len(lines) == 2 and lines[0] != lines[1]:
        yield f"ln -sfn {lines[0]} {CURRENT}.new && mv -T {CURRENT}.new {CURRENT}"


@operation(is_idempotent=True)
def regate(profile: Profile, launch: Launch, budget: int) -> Ops:
    """Health (within the startup budget) and a smoke generation of what serves now."""
    if not state.is_executing:
        return
    for check in ("--health-only", "--smoke-only"):
        ok, _ = _check(profile, launch, check, budget=budget, label=f"{launch.unit}: ")
        if not ok:
            yield fail(f"{launch.unit}: the last good release does not pass the gate either "
                       f"({check.removeprefix('--').replace('-only', '')})")
            return


@deploy("Back to the last good release")
def restore_last_good(profile: Profile, launches: list[Launch]) -> None:
    """What a rolling redeploy does to a host whose new release failed."""
    summary.failed_hosts_at_exit()
    for launch in launches:
        last_good_back(name=f"Last good {launch.unit}", unit=launch.unit)
        regate(name=f"Gate {launch.unit}: health and smoke generation", profile=profile,
               launch=launch, budget=startup_budget())


@deploy("Smoke test")
def smoke_test(profile: Profile, launches: list[Launch]) -> None:
    for launch in launches:
        smoke(name=f"Smoke {launch.unit}", profile=profile, launch=launch)


@deploy("Gate")
def run_gate(profile: Profile, launches: list[Launch]) -> None:
    """Health, effective arguments, smoke generation, soak and capacity report; rollback on
    failure."""
    summary.failed_hosts_at_exit()
    files.directory(name="Gate tools", path=f"{TOOLS}/sglang_fleet", mode="755")
    for name in ("__init__.py", "capacity.py", "gate_check.py", "readiness.py"):
        files.put(name=f"Gate tool {name}", src=str(HERE / name),
                  dest=f"{TOOLS}/sglang_fleet/{name}", mode="644")
    job = host.data.get("job_estimate", "")  # "COMPLETIONS,TOKENS", e.g. "900000,1000"
    soak = soak_requests(host.data, host.name)
    for launch in launches:
        gate(name=f"Gate {launch.unit}: health, arguments, smoke generation, soak, capacity",
             profile=profile, launch=launch,
             budget=startup_budget(), job=str(job), soak=soak)
