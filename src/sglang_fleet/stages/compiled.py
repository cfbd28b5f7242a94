"""Compile once per fleet: in a roll, the first host to pass its gate on a release hands the
DeepGEMM kernels it compiled to the identical hosts after it, through the controller, so their
restarts load and capture instead of compiling (when every GPU serves there is none to warm on).

What a cache was compiled for is a digest (``Inputs``) of the release, the DeepGEMM its venv
installs, the GPU architecture (``nvidia-smi`` compute_cap) and the rendered flags and
environment that change which kernels a server compiles. A host records it
(``/var/cache/sglang-fleet/compiled/<release>-<digest>.json``, root's) once a server of that
release passed the gate there, or once it received the cache of a host that did.

    announce_kernels(launches=launches, release=release)  # preparing (converge.prepare)
    share_kernels(launches=launches, release=release)     # after the gate (converge.serve)
    receive_kernels(launches=launches, release=release)   # after the turn, before the restart

In a roll the hosts say while they are prepared which digest they need, and whether they lack
it; after its gate, the first host with a digest a later host lacks packs its cache
(``sglang_fleet_remote.cache_copy``) and the controller keeps the archive and its sha256 in
the roll's directory (root's, 0700; files 0600). A later host whose own cache lacks
that digest receives it after its turn, before its restart: uploaded to root's staging,
unpacked by the host program (sha256, the manifest's digest, every member checked; written as
the service user). A host whose digest differs compiles itself, and the roll says in what the
inputs differ. Nothing here fails a deploy: a cache that cannot be shared or received is said,
and that host's restart compiles.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import time
from collections.abc import Set as AbstractSet
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pyinfra import logger
from pyinfra.api.command import FunctionCommand
from pyinfra.api.deploy import deploy
from pyinfra.api.operation import operation
from pyinfra.context import host, state
from pyinfra.facts.files import File

from sglang_fleet import paths
from sglang_fleet.config.render import RENAMED_DESTS, Launch
from sglang_fleet.facts.nvidia import NvidiaSmi, SmiReport
from sglang_fleet.facts.python import DeepGemm
from sglang_fleet.facts.systemd import UnitStates
from sglang_fleet.ops import Ops, privilege, result_line, run
from sglang_fleet.ops.host_programs import program, upload
from sglang_fleet.rollout import cutover
from sglang_fleet.rollout.cutover import RollDirectory
from sglang_fleet.stages.engine import Release

PROGRAM = "cache_copy"
STAGE = "caches"  # in the roll's directory: archives, offers, notes
DIGEST_CHARS = 24

# The flags (argparse destinations, as Launch.args holds them) whose value changes which
# DeepGEMM kernels a server compiles. SGLang compiles one set per (kernel type, N, K, groups)
# for every M of a list (0.5.23 srt/layers/deep_gemm_wrapper/compile_utils.py:150-193): the
# kernel type comes from the weights' quantization (entrypoint.py:219-237), N and K from the
# weights split over the ranks, the M list from the chunked prefill size (compile_utils.py:
# 59-110), the architecture from the GPU (configurer.py:38-60).
KERNEL_DESTS = frozenset({
    # the model's GEMMs and their types
    "model_path", "revision", "model_impl", "load_format", "dtype", "quantization",
    "quantization_param_path", "modelopt_quant", "kv_cache_dtype",
    # N and K per rank
    "tp_size", "dp_size", "enable_dp_attention", "attn_dp_size", "ep_size", "pp_size",
    "moe_dense_tp_size", "moe_dp_size", "shared_experts_tp_size",
    # the M list
    "chunked_prefill_size",
    # a draft model's own GEMMs (MTP/NextN's are the model's own layers)
    "speculative_algorithm", "speculative_draft_model_path",
    "speculative_draft_model_revision", "speculative_draft_model_quantization",
    "speculative_draft_load_format", "speculative_draft_kv_cache_dtype",
})
# Every backend (attention, NSA, MoE runner and all-to-all, FP8/FP4/BF16 GEMM runners) picks
# its kernels, DeepGEMM's or others'; DeepEP's modes pick masked or contiguous grouped GEMMs.
# Conservative: a backend that compiles nothing only keeps hosts that differ in it apart.
_KERNEL_DEST = re.compile(r"\w+_backend|deepep_\w+")
# Not in the digest, by SGLang's own precompile: sglang.compile_deep_gemm turns torch compile
# and CUDA graphs off (0.5.23 compile_deep_gemm.py:186-199) to fill the cache a server with them
# uses; speculative steps, top-k and draft tokens change neither N, K nor the M list; port,
# host, names, parsers, memory and scheduling compile nothing.
#
# The environment that changes what DeepGEMM compiles or how: SGLang's DeepGEMM switches
# (0.5.23 srt/environ.py:1348-1378: SGLANG_ENABLE_JIT_DEEPGEMM, SGLANG_JIT_DEEPGEMM_FAST_WARMUP
# for the M list, SGLANG_DG_USE_NVRTC for the compiler, ...), DeepGEMM's own DG_* settings, the
# CUDA toolkit it compiles with, and the prefix threshold the precompile sets to reach every
# DeepSeek GEMM (compile_deep_gemm.py:43). Not where the cache lives.
_KERNEL_ENV = re.compile(r"SGLANG_(\w*_)?(DEEPGEMM|DEEP_GEMM|DG)(_\w*)?|DG_\w+|CUDA_HOME|"
                         r"SGLANG_CHUNKED_PREFIX_CACHE_THRESHOLD")
_NOT_KERNEL_ENV = frozenset({"SGLANG_DG_CACHE_DIR", "DG_JIT_CACHE_DIR"})
_SAME_DEST = {old: new for new, olds in RENAMED_DESTS.items() for old in olds}
_CAP = re.compile(r"[0-9]{1,2}\.[0-9]{1,2}")


def kernel_flags(launch: Launch) -> dict[str, Any]:
    """The launch's arguments that change its kernels, by destination (a renamed one under its
    newest name), defaults included.

        kernel_flags(render(profile))["tp_size"]   # 1
    """
    return {_SAME_DEST.get(dest, dest): value for dest, value in sorted(launch.args.items())
            if _SAME_DEST.get(dest, dest) in KERNEL_DESTS or _KERNEL_DEST.fullmatch(dest)}


def kernel_env(launch: Launch) -> dict[str, str]:
    """The launch's environment that changes its kernels.

        kernel_env(launch)   # {'SGLANG_JIT_DEEPGEMM_FAST_WARMUP': '1'} or {}
    """
    return {k: v for k, v in sorted(launch.env.items())
            if _KERNEL_ENV.fullmatch(k) and k not in _NOT_KERNEL_ENV}


@dataclass(frozen=True)
class Inputs:
    """What a host's kernels are compiled for; ``digest`` names it.

        Inputs("sglang-0.5.23-0123456789", "sgl-deep-gemm==0.2.3.post2", "10.0",
               {"tp_size": 1, ...}, {}).digest   # '3f9a…' (24 hex digits)
    """

    release: str  # Release.id: package, version, extras, index, python
    deep_gemm: str  # what installs DeepGEMM into the release's venv ("none" without it)
    gpu_arch: str  # the GPUs' compute capability ("10.0" on a B200)
    flags: dict[str, Any] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def digest(self) -> str:
        text = json.dumps(self.as_dict(), sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:DIGEST_CHARS]


def gpu_arch(report: SmiReport) -> str | None:
    """The host's GPU architecture(s), as ``nvidia-smi`` gives compute_cap; None when it cannot
    say (no GPU listed, nvidia-smi failing, an answer not of the form ``10.0``).

        gpu_arch(SmiReport((gpu,) * 8, None))   # '10.0'
    """
    caps = sorted({gpu.compute_cap for gpu in report.gpus}) if report.ok else []
    if not caps or not all(_CAP.fullmatch(cap) for cap in caps):
        return None
    return ",".join(caps)


def inputs_for(launches: list[Launch], release: Release, deep_gemm: str | None,
               arch: str | None) -> Inputs | str:
    """The host's inputs, or why they cannot be known (then it neither shares nor receives).
    A host's servers differ only in port and GPUs (render._env), so the first one speaks for
    all."""
    if deep_gemm is None:
        return f"{release.python_bin} did not say which DeepGEMM it has"
    if arch is None:
        return "nvidia-smi did not give the GPUs' compute capability"
    return Inputs(release.id, deep_gemm, arch, kernel_flags(launches[0]),
                  kernel_env(launches[0]))


_LABELS = {"release": "release", "deep_gemm": "DeepGEMM", "gpu_arch": "GPU architecture"}


def differences(ours: dict[str, Any], theirs: dict[str, Any], there: str) -> list[str]:
    """In what two hosts' inputs differ, each as "WHAT X here, Y on HOST".

        differences(a.as_dict(), b.as_dict(), "b200-01")
        # ['GPU architecture 9.0 here, 10.0 on b200-01']
    """
    found = []
    for key, label in _LABELS.items():
        if ours.get(key) != theirs.get(key):
            found.append(f"{label} {ours.get(key)} here, {theirs.get(key)} on {there}")
    for key, label in (("flags", "--"), ("env", "env ")):
        mine, other = ours.get(key) or {}, theirs.get(key) or {}
        for name in sorted(set(mine) | set(other)):
            if mine.get(name) != other.get(name):
                shown = name.replace("_", "-") if key == "flags" else name
                found.append(f"{label}{shown} {mine.get(name)!r} here, {other.get(name)!r} on "
                             f"{there}")
    return found or [f"their digests differ ({there} recorded other inputs)"]


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
    """Why this host does not share its kernels (None: it does). ``past`` are the hosts past
    their turn already (its own batch, and those before); ``wants`` what the others said
    while they were prepared (their digest, whether they need its kernels): a host that said
    nothing may need them.

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


# --- the controller's staging, in the roll's directory --------------------------------

def stage(roll_dir: RollDirectory) -> Path:
    """The roll directory's staging directory for kernels (root's, 0700)."""
    where = roll_dir.directory / STAGE
    where.mkdir(mode=0o700, exist_ok=True)
    return where


def offers(roll_dir: RollDirectory) -> list[dict[str, Any]]:
    """What hosts shared so far (``<digest>.json``), in the order they shared it."""
    found = []
    for path in sorted(stage(roll_dir).glob("*.json"), key=lambda p: p.stat().st_mtime):
        try:
            offer = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(offer, dict):
            found.append(offer)
    return found


def claim(roll_dir: RollDirectory, digest: str) -> bool:
    """This run shares ``digest`` (and no other run of the roll does)."""
    try:
        os.close(os.open(stage(roll_dir) / f"{digest}.claim",
                         os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except FileExistsError:
        return False
    return True


def archive(roll_dir: RollDirectory, digest: str) -> Path:
    return stage(roll_dir) / f"{digest}.tar.gz"


def _write(path: Path, data: dict[str, Any]) -> None:
    part = path.with_name(f".{path.name}.part")
    with os.fdopen(os.open(part, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as out:
        json.dump(data, out)
    part.replace(path)


def offer(roll_dir: RollDirectory, data: dict[str, Any]) -> None:
    """Publish what this host shares (or why it could not) for the hosts after it."""
    _write(stage(roll_dir) / f"{data['digest']}.json", data)


def want(roll_dir: RollDirectory, name: str, digest: str, needs: bool) -> None:
    """What a host said while it was prepared: its digest, and whether it lacks the kernels."""
    _write(stage(roll_dir) / f"{name}.wants", {"digest": digest, "needs": needs})


def wants(roll_dir: RollDirectory) -> dict[str, dict[str, Any]]:
    """What the hosts said while they were prepared, by host."""
    found = {}
    for path in stage(roll_dir).glob("*.wants"):
        try:
            said = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(said, dict):
            found[path.name.removesuffix(".wants")] = said
    return found


def note(roll_dir: RollDirectory, name: str, text: str) -> None:
    """A line for the roll's table about this host's kernels."""
    _write(stage(roll_dir) / f"{name}.note", {"note": text})


def notes(roll_dir: RollDirectory, name: str) -> list[str]:
    """The roll's: what was noted about ``name``'s kernels.

        notes(roll_dir, "b200-02")   # ['kernels: received from b200-01 (41 MB, 3.2 s)']
    """
    try:
        found = json.loads((stage(roll_dir) / f"{name}.note").read_text())
    except (OSError, ValueError):
        return []
    return [f"kernels: {found['note']}"] if isinstance(found, dict) and "note" in found else []


# --- on the host --------------------------------------------------------------------------------

def record_path(release: Release, digest: str) -> str:
    """Where a host records that its cache holds ``digest``'s kernels (pruned with the release,
    as the warm-up marks)."""
    return f"{paths.COMPILED}/{release.id}-{digest}.json"


def host_inputs(launches: list[Launch], release: Release) -> Inputs | str:
    """This host's inputs, from its facts (the release's venv, nvidia-smi)."""
    return inputs_for(launches, release, host.get_fact(DeepGemm, python=release.python_bin),
                      gpu_arch(host.get_fact(NvidiaSmi)))


def in_roll() -> RollDirectory | None:
    """The roll's directory while an operation runs on one of its hosts; None otherwise."""
    roll_dir = cutover.current()
    if not state.is_executing or roll_dir is None or host.name not in roll_dir.hosts():
        return None
    return roll_dir


def _result(lines: list[str]) -> dict[str, Any]:
    """The host program's ``CACHECOPY <json>`` line (an error when it printed none)."""
    return result_line(lines, "CACHECOPY") or {"ok": False, "error": "the host program "
                                                "printed no result: " + " | ".join(lines[-3:])}


def _program(*args: str) -> dict[str, Any]:
    _, output = run(shlex.join(program("/usr/bin/python3", PROGRAM, *args)))
    lines = list(output.stdout_lines)
    return _result(lines)


def _mb(count: Any) -> str:
    return f"{int(count or 0) / 1e6:.0f} MB"


@operation(is_idempotent=True)
def kernels_recorded(launches: list[Launch], release: Release) -> Ops:
    """Once its servers passed the gate: the host records what its kernels were compiled for.

    + launches: the host's servers, gated
    + release: the release they run

        kernels_recorded(name="Record what the kernels were compiled for", launches=launches,
                         release=release)
    """
    if not state.is_executing:
        return
    inputs = host_inputs(launches, release)
    if isinstance(inputs, str):
        host.noop(f"what the kernels were compiled for is not known ({inputs}): not recorded")
        return
    if host.get_fact(File, path=record_path(release, inputs.digest)):
        host.noop(f"the kernels compiled for {inputs.digest} are recorded already")
        return
    yield shlex.join(program("/usr/bin/python3", PROGRAM, "record", "--digest", inputs.digest,
                             "--inputs", json.dumps(inputs.as_dict(), sort_keys=True),
                             "--record", record_path(release, inputs.digest)))


@operation(is_idempotent=True)
def kernels_shared(launches: list[Launch], release: Release) -> Ops:
    """In a roll, after its gate: the first host with a digest packs its kernels and the
    controller keeps them for the hosts after it. Nothing outside a roll.

    + launches: the host's servers, gated
    + release: the release they run

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
    why = share_problem(host.name, order, digest, offers(roll_dir), past, wants(roll_dir))
    if why or not claim(roll_dir, digest):
        host.noop(f"its kernels are not shared: {why or 'another host of its batch shares them'}")
        return
    tic = time.monotonic()
    outgoing = f"{paths.CACHE_COPY}/{digest}.tar.gz"
    packed = _program("pack", "--root", paths.CACHE, "--digest", digest,
                      "--inputs", json.dumps(inputs.as_dict(), sort_keys=True),
                      "--out", outgoing)
    shared = {"digest": digest, "inputs": inputs.as_dict(), "host": host.name}
    if packed.get("ok") and packed.get("files"):
        packed = _fetch(outgoing, archive(roll_dir, digest), packed)
    if not packed.get("ok"):
        offer(roll_dir, {**shared, "error": str(packed.get("error"))})
        logger.warning(f"{host.print_prefix}its kernels could not be shared: "
                       f"{packed.get('error')}; the hosts after it compile their own")
    else:
        offer(roll_dir, {**shared, "files": packed["files"], "bytes": packed["bytes"],
                        "sha256": packed["sha256"], "archive_bytes": packed["archive_bytes"]})
        note(roll_dir, host.name, f"shared with the hosts after it: {packed['files']} files "
             f"({_mb(packed['bytes'])})")
        logger.info(f"{host.print_prefix}shared the kernels compiled for {digest}: "
                    f"{packed['files']} files, {_mb(packed['archive_bytes'])} packed, on the "
                    f"controller in {time.monotonic() - tic:.1f} s")
    yield f"rm -f {shlex.quote(outgoing)} {shlex.quote(outgoing + '.part')}"


def _fetch(outgoing: str, local: Path, packed: dict[str, Any]) -> dict[str, Any]:
    """The host's archive onto the controller (0600), checked against the sha256 the host
    program printed."""
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
    """In a roll, after its turn and before its restart: the kernels a host before it compiled
    for the same digest, unpacked into this host's cache when it lacks them. Nothing outside a
    roll (each host's first server compiles).

    + launches: the host's servers, about to restart
    + release: the release they restart onto

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
    decision = decide(inputs, recorded, offers(roll_dir))
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

    + launches: the host's servers, as they will restart
    + release: the release they will run

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
    want(roll_dir, host.name, digest, needs)
    return True


def _said(roll_dir: RollDirectory, text: str, warn: bool = False) -> None:
    note(roll_dir, host.name, text)
    (logger.warning if warn else logger.info)(f"{host.print_prefix}kernels: {text}")


def _receive(roll_dir: RollDirectory, shared: dict[str, Any], release: Release) -> Ops:
    digest, there = str(shared["digest"]), str(shared.get("host"))
    tic = time.monotonic()
    incoming = f"{paths.CACHE_COPY}/{digest}.tar.gz"
    run(f"install -d -m 700 {paths.CACHE_COPY}")
    if not host.put_file(str(archive(roll_dir, digest)), incoming, **privilege()):
        got: dict[str, Any] = {"ok": False, "error": "the upload of the archive failed"}
    else:
        got = _program("unpack", "--root", paths.CACHE, "--digest", digest,
                          "--sha256", str(shared["sha256"]), "--archive", incoming,
                          "--user", paths.USER, "--record", record_path(release, digest),
                          "--source", there)
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
    upload(PROGRAM, "prune_caches")
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
    upload(PROGRAM, "prune_caches")
    kernels_recorded(name="Record what the kernels were compiled for", launches=launches,
                     release=release)
    kernels_shared(name="In a roll, the compiled kernels shared with the hosts after it",
                   launches=launches, release=release)
