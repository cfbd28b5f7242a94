"""What a host's compiled kernels were compiled for: a digest (``Inputs``) of the release, its
DeepGEMM, the GPU architecture and the flags and environment that change which kernels a server
compiles, recorded once a server of that release passed the gate there or the host received
the cache of a host that did.

    inputs = host_inputs(launches, release)       # Inputs, or why they cannot be known
    inputs.digest                                 # '3f9a…' (24 hex digits)
    kernels_recorded(name="Record what the kernels were compiled for", launches=launches,
                     release=release)
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
from dataclasses import asdict, dataclass, field
from typing import Any

from pyinfra.api.operation import operation
from pyinfra.context import host
from pyinfra.facts.files import File

from sglang_fleet import paths
from sglang_fleet.config.render import RENAMED_DESTS, Launch
from sglang_fleet.facts.nvidia import NvidiaSmi, SmiReport
from sglang_fleet.facts.python import DeepGemm
from sglang_fleet.ops import Ops
from sglang_fleet.ops.host_programs import program
from sglang_fleet.stages.engine.deploy import Release

HOST = "sglang_fleet.stages.compiled.host"
PROGRAM = f"{HOST}.cache_copy"  # the host program that records, packs and unpacks a kernel cache
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
    say.

        gpu_arch(SmiReport((gpu,) * 8, None))   # '10.0'
    """
    caps = sorted({gpu.compute_cap for gpu in report.gpus}) if report.ok else []
    if not caps or not all(_CAP.fullmatch(cap) for cap in caps):
        return None
    return ",".join(caps)


def inputs_for(launches: list[Launch], release: Release, deep_gemm: str | None,
               arch: str | None) -> Inputs | str:
    """The host's inputs, or why not known; its servers differ only in port and GPUs."""
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


def record_path(release: Release, digest: str) -> str:
    """Where a host records that its cache holds ``digest``'s kernels (pruned with the release)."""
    return f"{paths.COMPILED}/{release.id}-{digest}.json"


def host_inputs(launches: list[Launch], release: Release) -> Inputs | str:
    """This host's inputs, from its facts (the release's venv, nvidia-smi)."""
    return inputs_for(launches, release, host.get_fact(DeepGemm, python=release.python_bin),
                      gpu_arch(host.get_fact(NvidiaSmi)))


@operation(is_idempotent=True)
def kernels_recorded(launches: list[Launch], release: Release) -> Ops:
    """Once its servers passed the gate: the host records what its kernels were compiled for.

        kernels_recorded(name="Record what the kernels were compiled for", launches=launches,
                         release=release)
    """
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
