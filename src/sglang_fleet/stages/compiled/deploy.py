"""Compile once per fleet: in a roll, the first host to pass its gate on a release hands the
DeepGEMM kernels it compiled to the identical hosts after it, through the controller, so their
restarts load and capture instead of compiling (when every GPU serves there is none to warm on).
What a cache was compiled for is a digest (``compiled_records.Inputs``).

    announce_kernels(launches=launches, release=release)  # preparing (converge.prepare)
    share_kernels(launches=launches, release=release)     # after the gate (converge.serve)
    receive_kernels(launches=launches, release=release)   # after the turn, before the restart

The receiving host program checks the sha256, the manifest's digest and every member, and
writes as the service user; both sides keep within ``kernel_share_max_gib`` and
``kernel_share_max_entries``. Nothing here fails a deploy: a cache that cannot be shared or
received is said, and that host's restart compiles.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import time
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyinfra import logger
from pyinfra.api.command import FunctionCommand
from pyinfra.api.deploy import deploy
from pyinfra.api.operation import operation
from pyinfra.context import host
from pyinfra.facts.files import File

from sglang_fleet import hostconfig, paths
from sglang_fleet.config.render import Launch
from sglang_fleet.facts.systemd import UnitStates
from sglang_fleet.fleet import roll_directory
from sglang_fleet.fleet.roll_directory import RollDirectory
from sglang_fleet.ops import Ops, privilege, result_line, run
from sglang_fleet.ops.host_programs import program, upload
from sglang_fleet.stages.compiled import exchange
from sglang_fleet.stages.compiled.host.cache_archive import Bound
from sglang_fleet.stages.compiled.records import (
    HOST,
    PROGRAM,
    Inputs,
    differences,
    host_inputs,
    kernels_recorded,
    record_path,
)
from sglang_fleet.stages.engine.deploy import Release

# --- the plan: which hosts share, which receive, which compile --------------------------------

@dataclass(frozen=True)
class Decision:
    """What a host does before its restart: ``offer`` to receive, or None (``why`` says)."""

    offer: dict[str, Any] | None
    why: str
    mismatch: bool = False  # it compiles itself although a host before it shared a cache


def decide(inputs: Inputs, recorded: bool, offers: list[dict[str, Any]]) -> Decision:
    """Receive, or compile, given what the hosts before it in the roll shared.

        decide(inputs, False, [{"digest": inputs.digest, "host": "h1", "files": 40, ...}])
        # Decision(offer={...}, why='receives the kernels h1 compiled for …')
    """
    digest = inputs.digest
    if recorded:
        return Decision(None, f"its cache holds the kernels compiled for {digest} already")
    same = [o for o in offers if o.get("digest") == digest]
    if same:
        offer, there = same[0], same[0].get("host")
        if offer.get("error"):
            return Decision(None, f"compiles itself: {there} compiled for the same inputs but "
                            f"could not share its cache ({offer['error']})", mismatch=True)
        if not offer.get("files"):
            return Decision(None, f"{there} compiled no DeepGEMM kernel for the same inputs: "
                            "nothing to receive")
        return Decision(offer, f"receives the kernels {there} compiled for {digest}")
    if offers:
        other = offers[0]
        why = "; ".join(differences(inputs.as_dict(), other.get("inputs") or {},
                                    str(other.get("host"))))
        return Decision(None, f"compiles itself: no host before it compiled for its inputs "
                        f"({why})", mismatch=True)
    return Decision(None, "compiles itself: the first host of the roll with its inputs (its "
                    "kernels then go to the hosts after it)")


def share_problem(name: str, order: list[str], digest: str, offers: list[dict[str, Any]],
                  past: AbstractSet[str] = frozenset(),
                  wants: dict[str, dict[str, Any]] | None = None) -> str | None:
    """Why this host does not share its kernels (None: it does). ``wants``: what the others
    said while prepared; a host that said nothing may need them.

        share_problem("h3", ["h1", "h2", "h3"], d, [])   # 'no host of the roll after it ...'
    """
    if name not in order:
        return "not a host of this roll"
    later = [other for other in order[order.index(name) + 1:] if other not in past]
    if not later:
        return "no host of the roll after it is still to restart"
    said = wants or {}
    if all(other in said and (said[other].get("digest") != digest or
                              not said[other].get("needs")) for other in later):
        return "every host after it holds these kernels already or compiles for other inputs"
    for offer in offers:
        if offer.get("digest") == digest:
            return f"{offer.get('host')} shared the kernels for {digest} already"
    return None


# --- on the host --------------------------------------------------------------------------------

def in_roll() -> RollDirectory | None:
    """The roll's directory while an operation runs on one of its hosts; None otherwise."""
    roll_dir = roll_directory.current()
    if roll_dir is None or host.name not in roll_dir.hosts():  # a roll's runs skip the preview
        return None
    return roll_dir


def _result(lines: list[str]) -> dict[str, Any]:
    """The host program's ``CACHECOPY <json>`` line (an error when it printed none)."""
    return result_line(lines, "CACHECOPY") or {"ok": False, "error": "the host program "
                                                "printed no result: " + " | ".join(lines[-3:])}


def _program(*args: str) -> dict[str, Any]:
    _, output = run(shlex.join(program("/usr/bin/python3", PROGRAM, *args)))
    return _result(list(output.stdout_lines))


def bound() -> Bound:
    """What this host may share or accept (host data ``kernel_share_max_*``)."""
    cfg = hostconfig.of(host)
    return Bound(cfg.kernel_share_max_entries, cfg.kernel_share_max_gib)


def _bound_args() -> tuple[str, ...]:
    return "--max-entries", str(bound().entries), "--max-gib", str(bound().gib)


def _mb(count: Any) -> str:
    return f"{int(count or 0) / 1e6:.0f} MB"


@operation(is_idempotent=True)
def kernels_shared(launches: list[Launch], release: Release) -> Ops:
    """In a roll, after its gate: the first host with a digest packs its kernels and the
    controller keeps them for the hosts after it.

        kernels_shared(name="Share the compiled kernels", launches=launches, release=release)
    """
    roll_dir = in_roll()
    if roll_dir is None:
        return
    inputs = host_inputs(launches, release)
    if isinstance(inputs, str):
        host.noop(f"its kernels are not shared: {inputs}")
        return
    digest = inputs.digest
    order = list(roll_dir.hosts())
    past = {other for other in order if roll_dir.has(other, "took")}
    why = share_problem(host.name, order, digest, exchange.offers(roll_dir), past,
                        exchange.wants(roll_dir))
    if why or not exchange.claim(roll_dir, digest):
        host.noop(f"its kernels are not shared: {why or 'another host of its batch shares them'}")
        return
    tic = time.monotonic()
    outgoing = f"{paths.CACHE_COPY}/{digest}.tar.gz"
    packed = _program("pack", "--root", paths.CACHE, "--digest", digest,
                      "--inputs", json.dumps(inputs.as_dict(), sort_keys=True),
                      "--out", outgoing, *_bound_args())
    if packed.get("ok") and packed.get("files"):
        packed = _fetch(outgoing, exchange.archive(roll_dir, digest), packed)
    _offer(roll_dir, inputs, packed, tic)
    yield f"rm -f {shlex.quote(outgoing)} {shlex.quote(outgoing + '.part')}"


def _offer(roll_dir: RollDirectory, inputs: Inputs, packed: dict[str, Any], tic: float) -> None:
    """What this host shares for the hosts after it, or why it could not (they compile)."""
    digest = inputs.digest
    shared = {"digest": digest, "inputs": inputs.as_dict(), "host": host.name}
    if not packed.get("ok"):
        exchange.offer(roll_dir, {**shared, "error": str(packed.get("error"))})
        logger.warning(f"{host.print_prefix}its kernels could not be shared: "
                       f"{packed.get('error')}; the hosts after it compile their own")
        return
    exchange.offer(roll_dir, {**shared, "files": packed["files"], "bytes": packed["bytes"],
                              "sha256": packed["sha256"], "archive_bytes": packed["archive_bytes"]})
    exchange.note(roll_dir, host.name, f"shared with the hosts after it: {packed['files']} "
                  f"files ({_mb(packed['bytes'])})")
    logger.info(f"{host.print_prefix}shared the kernels compiled for {digest}: "
                f"{packed['files']} files, {_mb(packed['archive_bytes'])} packed, on the "
                f"controller in {time.monotonic() - tic:.1f} s")


def _fetch(outgoing: str, local: Path, packed: dict[str, Any]) -> dict[str, Any]:
    """The host's archive onto the controller (0600), checked against its sha256."""
    with os.fdopen(os.open(local, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as out:
        got = host.get_file(outgoing, out, **privilege())
    with open(local, "rb") as done:
        found = hashlib.file_digest(done, "sha256").hexdigest()
    if got and found == packed["sha256"]:
        return packed
    local.unlink()
    return {"ok": False, "error": f"the archive arrived with sha256 {found}, not "
            f"{packed['sha256']}" if got else f"the download of {outgoing} failed"}


@operation(is_idempotent=True)
def kernels_received(launches: list[Launch], release: Release) -> Ops:
    """In a roll, before its restart: the kernels a host before it compiled for the same
    digest, unpacked into this host's cache when it lacks them.

        kernels_received(name="Receive the compiled kernels", launches=launches,
                         release=release)
    """
    roll_dir = in_roll()
    if roll_dir is None:
        return
    if running_these(launches, release):
        host.noop("its servers run this release with these flags: nothing to compile")
        return
    inputs = host_inputs(launches, release)
    if isinstance(inputs, str):
        _said(roll_dir, f"compiles itself: {inputs}", warn=True)
        return
    recorded = bool(host.get_fact(File, path=record_path(release, inputs.digest)))
    decision = decide(inputs, recorded, exchange.offers(roll_dir))
    if decision.offer is None:
        _said(roll_dir, decision.why, warn=decision.mismatch)
        return
    yield from _receive(roll_dir, decision.offer, release)


def running_these(launches: list[Launch], release: Release) -> bool:
    """Every server of the host runs this release with these flags already."""
    units = host.get_fact(UnitStates, units=[launch.unit for launch in launches]) or {}
    return all((unit := units.get(launch.unit)) is not None and
               unit.runs(release.id, launch.argv[2], launch.argv[3:]) for launch in launches)


@operation(is_idempotent=True)
def kernels_announced(launches: list[Launch], release: Release) -> Ops:
    """In a roll, while the host is prepared: its digest and whether it lacks those kernels,
    so the host before it shares them only when a host after it needs them.

        kernels_announced(name="Say which kernels it needs", launches=launches,
                          release=release)
    """
    roll_dir = in_roll()
    if roll_dir is None:
        return
    inputs = host_inputs(launches, release)
    if isinstance(inputs, str):
        host.noop(f"which kernels it needs is not known: {inputs}")
        return
    needs = not (running_these(launches, release) or
                 host.get_fact(File, path=record_path(release, inputs.digest)))
    yield FunctionCommand(_announce, (roll_dir, inputs.digest, needs), {})


def _announce(state: Any, host: Any, roll_dir: RollDirectory, digest: str, needs: bool) -> bool:
    """On the controller, into the roll's directory, when the operation runs."""
    exchange.want(roll_dir, host.name, digest, needs)
    return True


def _said(roll_dir: RollDirectory, text: str, warn: bool = False) -> None:
    exchange.note(roll_dir, host.name, text)
    (logger.warning if warn else logger.info)(f"{host.print_prefix}kernels: {text}")


def _receive(roll_dir: RollDirectory, shared: dict[str, Any], release: Release) -> Ops:
    digest, there = str(shared["digest"]), str(shared.get("host"))
    over = bound().over(0, int(shared.get("bytes") or 0))
    if over:  # the unpack would refuse it: not uploaded
        _said(roll_dir, f"compiles itself: the kernels from {there} come to {over}", warn=True)
        return
    tic = time.monotonic()
    incoming = f"{paths.CACHE_COPY}/{digest}.tar.gz"
    run(f"install -d -m 700 {paths.CACHE_COPY}")
    if not host.put_file(str(exchange.archive(roll_dir, digest)), incoming, **privilege()):
        got: dict[str, Any] = {"ok": False, "error": "the upload of the archive failed"}
    else:
        got = _program("unpack", "--root", paths.CACHE, "--digest", digest,
                          "--sha256", str(shared["sha256"]), "--archive", incoming,
                          "--user", paths.USER, "--record", record_path(release, digest),
                          "--source", there, *_bound_args())
    if not got.get("ok"):
        _said(roll_dir, f"compiles itself: the kernels from {there} were not unpacked "
              f"({got.get('error')})", warn=True)
    else:
        _said(roll_dir, f"received from {there}: {got.get('placed')} kernels placed, "
              f"{got.get('kept')} there already ({_mb(shared.get('archive_bytes'))} in "
              f"{time.monotonic() - tic:.1f} s)")
    yield f"rm -f {shlex.quote(incoming)}"


@deploy("Compiled kernels received")
def receive_kernels(launches: list[Launch], release: Release) -> None:
    """In a roll, the kernels a host before this one compiled, before this host restarts."""
    upload(HOST)
    kernels_received(name="In a roll, the kernels a host before it compiled (if it lacks them)",
                     launches=launches, release=release)


@deploy("Compiled kernels announced")
def announce_kernels(launches: list[Launch], release: Release) -> None:
    """In a roll's preparation: which kernels this host will need."""
    kernels_announced(name="In a roll, which compiled kernels it needs", launches=launches,
                      release=release)


@deploy("Compiled kernels shared")
def share_kernels(launches: list[Launch], release: Release) -> None:
    """After the gate: what the kernels were compiled for, recorded; in a roll, shared."""
    upload(HOST)
    kernels_recorded(name="Record what the kernels were compiled for", launches=launches,
                     release=release)
    kernels_shared(name="In a roll, the compiled kernels shared with the hosts after it",
                   launches=launches, release=release)
