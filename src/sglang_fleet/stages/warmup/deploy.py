"""Warm-up stage: when a deploy is about to restart a server onto other kernels (another
release, model or flags), fill the new release's compile caches first, while the old server
still serves, so the restart pays only loading and graph capture (profile ``warmup``):

- ``compile`` (default): the release's own precompile entry point (``<package>.compile_deep_gemm``,
  beside its launcher), where the release ships one;
- ``full``: a warm-up start of the new release itself, one generation, then a stop;
- ``off``: nothing.

It runs on GPUs no server of the profile uses, as the service user with the service's cache
environment and sandbox, with one-off keys in a root-only environment file; a host without
such GPUs is said so and the restart pays the compile.

    from sglang_fleet.stages.warmup.deploy import warm_caches
    warm_caches(profile=profile, launches=launches, release=release)   # before the service
"""

from __future__ import annotations

import hashlib
import json
import secrets
import shlex
from pathlib import Path
from typing import Any

import jinja2
from pyinfra import logger
from pyinfra.api.command import FunctionCommand
from pyinfra.api.deploy import deploy
from pyinfra.api.host import Host
from pyinfra.api.operation import operation
from pyinfra.api.state import State
from pyinfra.context import host, state
from pyinfra.facts.files import File, FindFiles

from sglang_fleet import paths
from sglang_fleet.config.profile import Profile
from sglang_fleet.config.render import Launch
from sglang_fleet.facts.nvidia import NvidiaSmi
from sglang_fleet.facts.ports import PortListeners
from sglang_fleet.facts.systemd import UnitStates
from sglang_fleet.ops import Ops, privilege, result_line, run
from sglang_fleet.ops.host_programs import program, upload
from sglang_fleet.ops.secretfile import write_secret
from sglang_fleet.ops.unitfile import UnsafeValue
from sglang_fleet.stages.compiled import kernel_caches as caches
from sglang_fleet.stages.engine.deploy import Release
from sglang_fleet.stages.service.deploy import TEMPLATE, environment

HOST = "sglang_fleet.stages.warmup.host"
PROGRAM = f"{HOST}.warm_caches"
PRECOMPILE = caches.PRECOMPILE_MODULE.rpartition(".")[2]  # beside the launcher's module
PORT_OFFSET = 1000  # warm-up servers listen on the server's port + this (+ a few if taken)
MARKS = paths.WARM_MARKS
PROGRESS_SECONDS = 10  # between two of the program's progress lines, shown as they come


def spare_gpus(profile: Profile, gpu_count: int) -> list[int]:
    """GPUs no server of the profile uses, as many as one instance needs (none if too few).

    >>> from sglang_fleet.config.profile import load
    >>> spare_gpus(load("qwen3.6-27b-mtp", {"parallel.instances": 1}), 8)
    [1]
    """
    size = profile.parallel.gpus_per_instance
    first = profile.parallel.servers * size
    return list(range(first, first + size)) if first + size <= gpu_count else []


def precompile_module(launch: Launch) -> str:
    """The release's precompile entry point, in the launcher's package.

    >>> precompile_module(Launch("0.5.23", ("python", "-m", "sglang.launch_server"), {}))
    'sglang.compile_deep_gemm'
    """
    return f"{launch.argv[2].rpartition('.')[0]}.{PRECOMPILE}"


def warm_key(launch: Launch, release: Release, mode: str) -> str:
    """What a warm cache holds kernels for: the release, the flags (not port, host) and env."""
    flags = list(launch.argv[3:])
    for name in ("--port", "--host"):
        if name in flags:
            i = flags.index(name)
            del flags[i:i + 2]
    env = {k: v for k, v in launch.env.items() if k != "CUDA_VISIBLE_DEVICES"}  # per instance
    what = {"release": release.id, "flags": flags, "env": env, "mode": mode}
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:16]


def unused_port(start: int) -> int:
    """The first port from ``start`` nothing listens on."""
    for port in range(start, start + 20):
        if not host.get_fact(PortListeners, port=port):
            return port
    return start


def sandbox() -> list[str]:
    """The service unit's hardening (its template's ``hardening`` block: one source for both),
    for a server on one host, answering this host alone: the warm-up's unit properties."""
    template = jinja2.Environment(undefined=jinja2.StrictUndefined).from_string(
        Path(TEMPLATE).read_text())
    values = {"paths": paths.template_values(), "infiniband": [], "allowed_clients": [],
              "group_peers": []}
    block = "".join(template.blocks["hardening"](template.new_context(values)))
    lines = [line for line in block.splitlines() if line and not line.startswith("#")]
    return [*lines, "IPAddressAllow=localhost", "IPAddressDeny=any"]  # asked from here alone


def unit_name(launch: Launch) -> str:
    return f"sglang-warmup-{launch.instance}"


def warm_env(launch: Launch, gpus: list[int]) -> str:
    """The warm-up's environment file: the service's (caches, the profile's env) on the spare
    GPUs, with a client key and an admin key of its own, new each time."""
    keys = {paths.API_KEY_VAR: secrets.token_hex(32),
            paths.ADMIN_API_KEY_VAR: secrets.token_hex(32)}
    return environment(launch, keys, {"CUDA_VISIBLE_DEVICES": ",".join(map(str, gpus))})


def warm_command(profile: Profile, launch: Launch, release: Release, port: int, module: str,
                 budget: int) -> str:
    """A transient unit, as the service user with the service's sandbox and the warm-up's
    environment file, that runs the host program and hands back its output."""
    run = ["systemd-run", "--quiet", "--wait", "--pipe", "--collect",
           f"--unit={unit_name(launch)}", f"--uid={paths.USER}",
           f"--gid={paths.USER}", f"--working-directory={paths.STATE}",
           f"--property=RuntimeMaxSec={budget + 120}",
           f"--property=EnvironmentFile={paths.env_file(unit_name(launch))}",
           *(f"--property={line}" for line in sandbox())]
    words = program("/usr/bin/python3", PROGRAM, "--mode", profile.warmup, "--python",
                    release.python_bin, "--module", module, "--port", str(port),
                    "--timeout", str(budget), "--progress", str(PROGRESS_SECONDS), "--",
                    *launch.argv[3:])
    return shlex.join([*run, *words])


def _report(lines: list[str]) -> dict[str, Any]:
    """The host program's ``WARMUP <json>`` line (an error when it printed none)."""
    return result_line(lines, "WARMUP") or {"ok": False, "error": "the warm-up printed no "
                                             "result", "tail": lines[-10:]}


def warm_up(command: str, env_file: str, env_text: str) -> dict[str, Any]:
    """Run the warm-up with its keys in ``env_file`` (root's, 0600) only while it runs."""
    try:
        write_secret(state, host, env_file, env_text, privilege())
    except OSError as err:
        return {"ok": False, "error": str(err)}
    try:
        _, output = run(command, print_output=True)
    finally:
        run(f"rm -f {shlex.quote(env_file)}")
    return _report(list(output.stdout_lines))


@operation(is_idempotent=True)
def caches_warmed(profile: Profile, launch: Launch, release: Release, budget: int) -> Ops:
    """Before the restart that moves a running server onto other kernels: its caches filled on
    spare GPUs while it still serves.

        caches_warmed(name="Warm caches of sglang.service", profile=profile, launch=launch,
                      release=release, budget=1800)
    """
    if int(launch.args.get("nnodes") or 1) > 1:  # its flags start a rank: it needs them all
        host.noop(f"{launch.unit} is one rank of a multi-node server: a warm-up would need its "
                  "whole group; its own start fills the caches")
        return
    unit = (host.get_fact(UnitStates, units=[launch.unit]) or {}).get(launch.unit)
    if unit is None or unit.active != "active":
        host.noop(f"{launch.unit} is not serving: its own start fills the caches")
        return
    if unit.runs(release.id, launch.argv[2], launch.argv[3:]):
        host.noop(f"{launch.unit} runs this release with these flags: nothing to compile")
        return
    mark = f"{MARKS}/{release.id}-{warm_key(launch, release, profile.warmup)}"  # pruned by id
    if host.get_fact(File, path=mark):
        host.noop(f"the caches are warm for {release.id} with these flags")
        return
    report = host.get_fact(NvidiaSmi)
    gpus = spare_gpus(profile, len(report.gpus) if report.ok else 0)
    if not gpus:
        logger.info(f"{host.print_prefix}warm-up skipped: no GPUs beside the servers' "
                    f"(parallel.instances x tp x dp); {launch.unit} restarts first and "
                    "compiles, the host's other servers after it (restart waves)")
        return
    module = launch.argv[2]
    if profile.warmup == "compile":
        module = precompile_module(launch)
        if caches.precompile_module(launch.version) is None or \
                not host.get_fact(FindFiles, path=release.dir, fname=f"{PRECOMPILE}.py"):
            logger.warning(f"{host.print_prefix}warm-up skipped: {release.id} has no "
                           f"{module}; {launch.unit}'s restart compiles (warmup: full "
                           "warms with a whole start)")
            return
    try:
        env_text = warm_env(launch, gpus)
    except UnsafeValue as err:  # the service stage refuses it too, before any host changes
        logger.warning(f"{host.print_prefix}warm-up skipped: {err}")
        return
    port = unused_port(launch.port + PORT_OFFSET)
    where = f"GPU {','.join(map(str, gpus))}, port {port}"
    command = warm_command(profile, launch, release, port, module, budget)

    def warm(state: State, host: Host) -> bool:
        # a failed warm-up leaves the compile to the restart, and the host goes on
        logger.info(f"{host.print_prefix}warm-up ({profile.warmup}) of {release.id} on {where}, "
                    f"up to {budget} s")
        result = warm_up(command, paths.env_file(unit_name(launch)), env_text)
        if not result.get("ok"):
            for line in result.get("tail") or []:
                logger.warning(f"{host.print_prefix}warm-up: {line}")
            logger.warning(f"{host.print_prefix}warm-up ({profile.warmup}) of {release.id} on "
                           f"{where} failed: {result.get('error')}; {launch.unit}'s restart "
                           "compiles")
            return True
        logger.info(f"{host.print_prefix}warm-up ({profile.warmup}) of {release.id} on "
                    f"{where}: {result.get('seconds')} s while {launch.unit} served")
        return run(f"install -d -m 755 {MARKS} && touch {shlex.quote(mark)}")[0]

    yield FunctionCommand(warm, (), {})


@deploy("Warm-up")
def warm_caches(profile: Profile, launches: list[Launch], release: Release, budget: int) -> None:
    """Each server's caches, warmed before the service stage restarts it."""
    if profile.warmup == "off":
        return
    upload(HOST)
    for launch in launches:
        caches_warmed(name=f"Warm caches of {launch.unit} ({profile.warmup})", profile=profile,
                      launch=launch, release=release, budget=budget)
