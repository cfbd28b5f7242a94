"""DeepGEMM's JIT precompile, paid once per cache entry as SGLang pays it.

SGLang (``srt/layers/deep_gemm_wrapper/compile_utils.py``) points DeepGEMM's ``DG_JIT_CACHE_DIR``
at ``SGLANG_DG_CACHE_DIR`` (default ``~/.cache/deep_gemm`` up to 0.5.17, then
``$SGLANG_CACHE_DIR/deep_gemm``, ``SGLANG_CACHE_DIR`` defaulting to ``~/.cache/sglang``). At the
first use of each GEMM shape it compiles the kernel for every M, logging "Entering DeepGEMM JIT
Pre-Compile session ... (typically 10-20 mins)" and "Try DeepGEMM JIT Compiling for <...> N=, K=";
DeepGEMM keeps each kernel in ``cache/kernel.<name>.<digest>``, the digest over its version, the
compiler, the GPU architecture and the code: shapes come from the model and the TP size.

The simulator keeps one entry per GEMM shape, keyed by release, GPU name (``nvidia-smi``) and
shape, and sleeps ``SGLANG_SIM_JIT_SECONDS`` (split over the shapes) for each entry it lacks.
Unset, the model uses no DeepGEMM kernel: nothing is logged or written.

    compiled = warmup(args, "0.5.23", shape, "NVIDIA B200", 120.5, scheduler)
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import sys
import time
import uuid
from argparse import Namespace
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from sglang_sim.args import release_tuple
from sglang_sim.logs import SCHEDULER
from sglang_sim.model import ModelShape

JIT_SECONDS = "SGLANG_SIM_JIT_SECONDS"
# Set by compile_deep_gemm, as sglang.compile_deep_gemm sets it (envs).
PRECOMPILE_STAGE = "SGLANG_IN_DEEPGEMM_PRECOMPILE_STAGE"
LOGGER = "sglang.srt.layers.deep_gemm_wrapper.compile_utils"
KERNEL = "GEMM_NT_F8F8BF16"  # DeepGemmKernelType of a dense FP8 linear layer
_GB = 1 << 30


@dataclass(frozen=True)
class Gemm:
    """One GEMM shape a layer runs: ``N`` outputs, ``K`` inputs (per TP rank)."""

    n: int
    k: int
    num_groups: int = 1


def cache_dir(release: str, env: Mapping[str, str] = os.environ) -> Path:
    """``DG_JIT_CACHE_DIR`` as the release sets it (environ.py / compile_utils.py).

        cache_dir("0.5.23", {"SGLANG_CACHE_DIR": "/c"})   # Path('/c/deep_gemm')
    """
    if release_tuple(release) < (0, 5, 18, 0):
        return Path(env.get("SGLANG_DG_CACHE_DIR",
                            os.path.join(os.path.expanduser("~"), ".cache", "deep_gemm")))
    if "SGLANG_DG_CACHE_DIR" in env:
        return Path(env["SGLANG_DG_CACHE_DIR"])
    base = env.get("SGLANG_CACHE_DIR", os.path.expanduser("~/.cache/sglang"))
    return Path(os.path.expanduser(base)) / "deep_gemm"


def gemms(shape: ModelShape, tp: int) -> list[Gemm]:
    """The dense GEMMs of a decoder layer, split over ``tp`` ranks as SGLang's linear layers
    split them: QKV and gate/up by output columns, O and down by input rows."""
    h, q, kv = shape.hidden_size, shape.num_heads * shape.head_dim, \
        shape.num_kv_heads * shape.head_dim
    shapes = [Gemm((q + 2 * kv) // tp, h), Gemm(h, q // tp),
              Gemm(2 * shape.intermediate_size // tp, h), Gemm(h, shape.intermediate_size // tp)]
    return list(dict.fromkeys(shapes))


def entry(root: Path, release: str, gpu: str, gemm: Gemm) -> Path:
    """Where the compiled kernel of ``gemm`` lies: ``cache/kernel.<name>.<digest>``."""
    key = f"{release}|{gpu}|{KERNEL}|{gemm.n}|{gemm.k}|{gemm.num_groups}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:32]
    return root / "cache" / f"kernel.{KERNEL.lower()}.{digest}"


def m_max(chunked_prefill_size: int) -> int:
    """How many Ms are compiled per shape (update_deep_gemm_config, no fast warmup)."""
    top = 1024 * 16
    if chunked_prefill_size < 1:
        top = 1024 * 64
    elif chunked_prefill_size > 8192:
        top = chunked_prefill_size * 2
    return min(1024 * 128, top)


def required_gb(gemm: Gemm, ms: int) -> float:
    """_BaseWarmupExecutor.get_memory_requirement for a dense FP8 GEMM (128-blocks)."""
    blocks = -(-gemm.k // 128)
    scales = ms * blocks * 4 + -(-gemm.n // 128) * blocks * 4
    return (ms * gemm.k + gemm.n * gemm.k + ms * gemm.n * 2 + scales) / _GB


def jit_seconds(env: Mapping[str, str] = os.environ) -> float | None:
    """The cost of a cold compile (all shapes), or None when the model uses no DeepGEMM."""
    raw = env.get(JIT_SECONDS)
    return None if raw is None or raw == "" else float(raw)


@contextmanager
def _lock(root: Path, release: str, gemm: Gemm) -> Iterator[None]:
    """_local_rank_compile_lock (0.5.19+): one compile per shape across ranks sharing the dir."""
    if release_tuple(release) < (0, 5, 19, 0):
        yield
        return
    locks = root / "locks"
    locks.mkdir(parents=True, exist_ok=True)
    with open(locks / f"{KERNEL}_n{gemm.n}_k{gemm.k}_g{gemm.num_groups}.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _compile(path: Path, seconds: float) -> None:
    """Pay the compile and publish the entry atomically (DeepGEMM renames a finished build)."""
    time.sleep(seconds)
    tmp = path.parent / f".tmp-{uuid.uuid4().hex}"
    tmp.mkdir(parents=True)
    (tmp / "kernel.cubin").write_bytes(b"sglang-sim cubin\n")
    try:
        tmp.rename(path)
    except OSError:  # another rank published it first
        (tmp / "kernel.cubin").unlink()
        tmp.rmdir()


def _progress(ms: int, seconds: float) -> None:
    """tqdm's last line for ``tqdm(m_list, desc="DeepGEMM warmup")`` (stderr)."""
    mins, secs = divmod(int(seconds), 60)
    rate = ms / seconds if seconds > 0 else float(ms)
    print(f"DeepGEMM warmup: 100%|██████████| {ms}/{ms} [{mins:02d}:{secs:02d}<00:00, "
          f"{rate:.2f}it/s]", file=sys.stderr, flush=True)


def _logger(scheduler: logging.Logger) -> logging.Logger:
    """compile_utils' logger, printed in the scheduler's format (it runs in the scheduler; one
    per scheduler, as DP ranks compile side by side)."""
    log = logging.getLogger(LOGGER if scheduler.name == SCHEDULER else
                            f"{LOGGER}.{scheduler.name}")
    log.handlers, log.propagate = list(scheduler.handlers), False
    log.setLevel(scheduler.getEffectiveLevel())
    return log


def _announce(log: logging.Logger) -> None:
    log.warning(
        "Entering DeepGEMM JIT Pre-Compile session. "
        "It may take a long time (typically 10-20 mins) "
        "if you have not run `sglang.compile_deep_gemm`. "
        "It is recommended to run `sglang.compile_deep_gemm` with same args as "
        "`sglang.launch_server` for pre-compilation to reduce the overhead if you have not run "
        "it before. For example: `python3 -m sglang.compile_deep_gemm --model "
        "deepseek-ai/DeepSeek-V3 --tp 8 --trust-remote-code`")


def warmup(args: Namespace, release: str, shape: ModelShape, gpu: str, avail_gb: float,
           scheduler: logging.Logger, env: Mapping[str, str] = os.environ) -> int:
    """Compile what the cache lacks for this release, GPU and model; return how many kernels
    were compiled (0 when warm, or when the model uses no DeepGEMM)."""
    total = jit_seconds(env)
    if total is None:
        return 0
    root, stage = cache_dir(release, env), env.get(PRECOMPILE_STAGE) in ("1", "true", "True")
    log, shapes = _logger(scheduler), gemms(shape, args.tp_size)
    ms = m_max(args.chunked_prefill_size or 0)
    compiled = 0
    for i, gemm in enumerate(shapes):
        if i == 0 and not stage:
            _announce(log)
        hint = ("" if stage else " It only takes a little time (typically 1 sec) if you have "
                "run `python3 -m sglang.compile_deep_gemm`. ")
        log.info(f"Try DeepGEMM JIT Compiling for <{KERNEL}> N={gemm.n}, K={gemm.k}, "
                 f"num_groups={gemm.num_groups} with all Ms.{hint}")
        # Inside the lock, as _compile_deep_gemm_one_type_all runs there (0.5.23
        # compile_utils.py:185, its memory line and tqdm bar): a waiter's bar shows its own
        # pass over the Ms, not the wait.
        with _lock(root, release, gemm):
            log.info(f"Required memory for warmup: {required_gb(gemm, ms)}GB, "
                     f"Available memory: {avail_gb}GB")
            tic = time.monotonic()
            path = entry(root, release, gpu, gemm)
            if not path.is_dir():
                _compile(path, total / len(shapes))
                compiled += 1
            _progress(ms, time.monotonic() - tic)
    return compiled
