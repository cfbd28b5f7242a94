"""Each server's last good release: the unit and environment files that last passed the gate,
kept under ``LAST_GOOD`` (``keep_command``), and put back, with the ``current`` link on the
release they run: after a failed gate (``restore_unit``, restarting it), and for a host a roll
stopped before its restart (``restore_files``, no restart). The environment is kept without its
keys and goes back with the keys in place, today's: a key rotated since is revoked.

    restore_unit(name="Last good sglang.service", unit="sglang.service")
    restore_files(name="Files of sglang.service back", unit="sglang.service")
"""

from __future__ import annotations

import re

from pyinfra import logger
from pyinfra.api.command import FunctionCommand
from pyinfra.api.deploy import deploy
from pyinfra.api.host import Host
from pyinfra.api.operation import operation
from pyinfra.api.state import State
from pyinfra.context import host
from pyinfra.facts.files import File, FindInFile, Link, Sha256File

from sglang_fleet.config.exposure import rules_path
from sglang_fleet.config.profile import Profile
from sglang_fleet.config.render import Launch
from sglang_fleet.facts.systemd import UnitCondition
from sglang_fleet.fleet.cutover import disrupt
from sglang_fleet.ops import Ops, fail, failed
from sglang_fleet.ops.secretfile import KeylessSha256, keys_of, without_keys
from sglang_fleet.paths import CURRENT, LAST_GOOD, RELEASES, env_file, unit_path
from sglang_fleet.report import summary
from sglang_fleet.stages.gate.program import check
from sglang_fleet.stages.service.deploy import startup_budget
from sglang_fleet.stages.service.units import found_down, start_command

_RELEASE = re.compile(re.escape(RELEASES) + r"/[^/ ]+")


def saved_unit(unit: str) -> str:
    """Where the unit file that last passed the gate is kept (its environment: ``.env``).

        saved_unit("sglang.service")   # '/etc/sglang/last-good/sglang.service'
    """
    return f"{LAST_GOOD}/{unit}"


def keep_command(unit: str) -> str:
    """The command that keeps the unit, its environment (without its keys) and its ports'
    table (``.nft``, where it has one) in place as the last good release."""
    saved, rules = saved_unit(unit), rules_path(unit)
    return (f"umask 077 && install -d -m 700 {LAST_GOOD} && cp -p {unit_path(unit)} {saved} && "
            f"{without_keys(env_file(unit))} > {saved}.env && "
            f"{{ if [ -e {rules} ]; then cp -p {rules} {saved}.nft; else rm -f {saved}.nft; fi; }}")


def in_place(unit: str) -> bool:
    """The unit and environment files in place last passed the gate (keys aside), by checksums."""
    saved = saved_unit(unit)
    kept = [host.get_fact(Sha256File, path=path) for path in (saved, f"{saved}.env")]
    now = [host.get_fact(Sha256File, path=unit_path(unit)),
           host.get_fact(KeylessSha256, path=env_file(unit))]
    rules = [host.get_fact(Sha256File, path=p) for p in (f"{saved}.nft", rules_path(unit))]
    return None not in kept and kept == now and rules[0] == rules[1]


def _kept(unit: str) -> bool:
    """A unit and environment file passed the gate on this host once, and are kept."""
    saved = saved_unit(unit)
    return bool(host.get_fact(File, path=saved) and host.get_fact(File, path=f"{saved}.env"))


def _release_of(unit_file: str) -> str | None:
    """The engine release directory a unit file runs (read as a fact)."""
    lines = host.get_fact(FindInFile, path=unit_file, pattern=f"{RELEASES}/") or []
    found = next((m for m in (_RELEASE.search(line) for line in lines) if m), None)
    return found.group(0) if found else None


def _copy_back_command(unit: str) -> str:
    """The command that copies the kept unit and environment files back, the environment with
    the keys in place (today's), and reloads systemd."""
    saved, env, rules = saved_unit(unit), env_file(unit), rules_path(unit)
    new = f"{env}.sglang-fleet-new"
    # without_keys: a copy kept before keys were left out holds the keys of then; the ports'
    # table goes back with its unit, which loads it as it starts (none kept: none)
    return (f"umask 077 && {{ {without_keys(f'{saved}.env')} && {keys_of(env)}; }} > {new} && "
            f"{{ if [ -e {saved}.nft ]; then cp -p {saved}.nft {rules}; else rm -f {rules}; fi; }} "
            f"&& cp -p {saved} {unit_path(unit)} && mv -f {new} {env} && systemctl daemon-reload")


def _current_on_kept_release(unit: str) -> Ops:
    """``current`` on the release the kept unit runs."""
    release = _release_of(saved_unit(unit))
    link = host.get_fact(Link, path=CURRENT)
    if release and link and link.get("link_target") != release:
        yield f"ln -sfn {release} {CURRENT}.new && mv -T {CURRENT}.new {CURRENT}"


@operation(is_idempotent=True)
def restore_unit(unit: str) -> Ops:
    """Put the unit and environment that last passed the gate back, with the ``current`` link
    on the release they run, and restart the unit if it ran something else.

        restore_unit(name="Last good sglang.service", unit="sglang.service")
    """
    if not _kept(unit):
        yield fail(f"{unit}: no release has passed the gate on this host: nothing to go back to")
        return
    if not in_place(unit):
        yield from disrupt(f"{_copy_back_command(unit)} && {start_command(unit)}", units=[unit])
    else:
        condition = host.get_fact(UnitCondition, unit=unit)
        down = found_down(unit, condition)
        if down:
            logger.warning(f"{host.print_prefix}{down}")
        if condition.get("ActiveState") != "active":
            yield from disrupt(start_command(unit), units=[unit])
        else:
            host.noop(f"{unit} runs its last good release")
    yield from _current_on_kept_release(unit)


@operation(is_idempotent=True)
def restore_files(unit: str) -> Ops:
    """The last good unit and environment files back in place, ``current`` on their release,
    without a restart (a roll stopped before its restart). A unit that never passed the gate
    is removed.

        restore_files(name="Files of sglang.service back", unit="sglang.service")
    """
    if not _kept(unit):
        if host.get_fact(File, path=unit_path(unit)) and host.get_fact(
                UnitCondition, unit=unit).get("ActiveState") != "active":
            yield f"rm -f {unit_path(unit)} {env_file(unit)} && systemctl daemon-reload"
        else:
            host.noop(f"{unit}: no last good release to put back")
        return
    if in_place(unit):
        host.noop(f"{unit}: its files are the last good release's")
    else:
        yield _copy_back_command(unit)
    yield from _current_on_kept_release(unit)


@operation(is_idempotent=True)
def check_restored(profile: Profile, launch: Launch, budget: int) -> Ops:
    """Health and a smoke generation of what serves now, once the last good release is back.

        check_restored(name="Gate sglang.service: health and smoke generation",
                       profile=profile, launch=launch, budget=1800)
    """
    def checked(state: State, host: Host) -> bool:  # the server the restore has just restarted
        for only in ("--health-only", "--smoke-only"):
            ok, _ = check(profile, launch, only, budget=budget, label=f"{launch.unit}: ")
            if not ok:
                return failed(f"{launch.unit}: the last good release does not pass the gate "
                              f"either ({only.removeprefix('--').replace('-only', '')})")
        return True

    yield FunctionCommand(checked, (), {})


@deploy("Back to the last good release")
def restore_last_good(profile: Profile, launches: list[Launch]) -> None:
    """What a rolling redeploy does to a host whose new release failed."""
    summary.failed_hosts_at_exit()
    for launch in launches:
        restore_unit(name=f"Last good {launch.unit}", unit=launch.unit)
        check_restored(name=f"Gate {launch.unit}: health and smoke generation", profile=profile,
                       launch=launch, budget=startup_budget())
