"""Where SGLang and its kernel libraries keep what they compile: a persistent directory under
/var/cache/sglang, so a restart finds its kernels instead of compiling them again. A cache whose
entries carry their own key (version, GPU architecture, source) is shared by every release; any
other gets one directory per release, so a release never loads what another built.

    from sglang_fleet.stages.compiled.kernel_caches import cache_env
    cache_env("0.5.23")["SGLANG_DG_CACHE_DIR"]      # '/var/cache/sglang/deep_gemm'
    cache_env("0.5.23")["SGLANG_CACHE_DIR"]         # '/var/cache/sglang/release/0.5.23/sglang'

Each variable below was read from the source of the wheels named in ``read_by`` (file and line
of the version checked); tests/unit/stages/compiled/test_kernel_caches.py greps those wheels
again, so a wrong claim fails.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from sglang_fleet.config import releases
from sglang_fleet.paths import CACHE

SHARED = "shared"  # one directory for every release: the cache keys its own entries
PER_RELEASE = "release"  # one directory per release: its entries are not keyed by version
# What a release key may look like before it becomes part of a path (a version, nothing more).
_VERSION = re.compile(r"[0-9]+(\.[0-9]+)*(\.post[0-9]+|rc[0-9]+)?")


@dataclass(frozen=True)
class Where:
    """Where a library reads the variable: ``dist`` (as on PyPI) at ``version``, the file inside
    the wheel and its line; line 0 for a compiled library, searched for ``needle`` (its bytes).

        Where("triton", "3.9.0", "triton/knobs.py", 349)
    """

    dist: str
    version: str
    path: str
    line: int
    needle: str = ""


@dataclass(frozen=True)
class Cache:
    """One cache: the variable that moves it, its directory, whether releases share it, the
    default it replaces, and which releases read it (``since``/``until`` inclusive).
    ``installed_by``: the sglang wheel's ``Requires-Dist`` that brings the reading library in
    ("" for SGLang itself, "driver" for the CUDA driver)."""

    variable: str
    subdir: str
    scope: str
    default: str
    why: str
    read_by: tuple[Where, ...]
    installed_by: str = ""
    since: str | None = None
    until: str | None = None

    def read_in(self, version: str) -> bool:
        """Whether SGLang ``version`` (or a library it pins) reads the variable.

            Cache(..., since="0.5.18").read_in("0.5.17")   # False
        """
        if self.since and not releases.at_least(version, self.since):
            return False
        return not (self.until and releases.at_least(version, _next(self.until)))


def _next(version: str) -> str:
    """A version above every post release of ``version``: "0.5.19" -> "0.5.19.post999"."""
    return f"{version}.post999"


def _sg(version: str, path: str, line: int) -> Where:
    return Where("sglang", version, path, line)


ENV = "sglang/srt/environ.py"
DG_WRAPPER = "sglang/srt/layers/deep_gemm_wrapper/compile_utils.py"

CACHES: tuple[Cache, ...] = (
    Cache(
        "SGLANG_DG_CACHE_DIR", "deep_gemm", SHARED, "~/.cache/deep_gemm (0.5.10-0.5.17), "
        "$SGLANG_CACHE_DIR/deep_gemm (0.5.18+)",
        "DeepGEMM's JIT kernels: precompiling them 'typically takes 10-20 mins'. SGLang copies "
        "it into DG_JIT_CACHE_DIR at import (overwriting any DG_JIT_CACHE_DIR set). Self-keyed: "
        "each kernel lives in kernel.<name>.<digest>, the digest over DeepGEMM's library "
        "version, the NVCC version, the flags (--gpu-architecture=sm_<arch>) and the code.",
        (_sg("0.5.10", ENV, 383), _sg("0.5.10", DG_WRAPPER, 34),
         _sg("0.5.12", ENV, 404), _sg("0.5.12", DG_WRAPPER, 36),
         _sg("0.5.13", ENV, 541), _sg("0.5.13", DG_WRAPPER, 38),
         _sg("0.5.19", ENV, 1078), _sg("0.5.19", DG_WRAPPER, 46),
         _sg("0.5.23", ENV, 1373), _sg("0.5.23", DG_WRAPPER, 51),
         # DeepGEMM itself (compiled): bundled in sglang-kernel 0.4.1 (0.5.10), then its own
         # wheel, sgl-deep-gemm. 0.2.x's binary holds "JIT_CACHE_DIR" beside "not home.empty()"
         # and its other JIT_* settings without the DG_ prefix (added at run time, we infer).
         Where("sglang-kernel", "0.4.1", "deep_gemm/deep_gemm_cpp.abi3.so", 0, "DG_JIT_CACHE_DIR"),
         Where("sgl-deep-gemm", "0.1.2", "deep_gemm/_C.so", 0, "DG_JIT_CACHE_DIR"),
         Where("sgl-deep-gemm", "0.2.3.post2", "deep_gemm/_C.so", 0, "JIT_CACHE_DIR"))),
    Cache(
        "FLASHINFER_WORKSPACE_BASE", "flashinfer", SHARED,
        "~ (flashinfer appends .cache/flashinfer)",
        "flashinfer's JIT modules (678 s on a first call without them) and the cubins it "
        "downloads when flashinfer-cubin is absent. Self-keyed: modules live in "
        "<base>/.cache/flashinfer/<flashinfer version>/<arch>/cached_ops.",
        (Where("flashinfer-python", "0.6.7.post2", "flashinfer/jit/env.py", 52),
         Where("flashinfer-python", "0.7.2", "flashinfer/jit/env.py", 67),
         _sg("0.5.19", ENV, 1813), _sg("0.5.23", ENV, 2320)),
        installed_by="flashinfer_python"),
    Cache(
        "TRITON_CACHE_DIR", "triton", SHARED, "~/.triton/cache",
        "Triton's compiled kernels (SGLang's triton attention and MoE kernels, torch.compile). "
        "Self-keyed: each entry's name hashes the kernel source, Triton's version and the "
        "target GPU.",
        (Where("triton", "3.9.0", "triton/knobs.py", 349),
         _sg("0.5.19", ENV, 1808), _sg("0.5.23", ENV, 2311)),
        installed_by="torch"),
    Cache(
        "TORCHINDUCTOR_CACHE_DIR", "torchinductor", SHARED, "/tmp/torchinductor_<user>",
        "torch inductor's FX graph and autotuning caches. Its default is under /tmp, which the "
        "unit's PrivateTmp empties at every restart. Self-keyed: keys include torch's version "
        "and the device.",
        (Where("torch", "2.13.0", "torch/_inductor/runtime/cache_dir_utils.py", 15),
         _sg("0.5.19", ENV, 1809), _sg("0.5.23", ENV, 2312)),
        installed_by="torch"),
    Cache(
        "CUDA_CACHE_PATH", "nv", SHARED, "~/.nv/ComputeCache",
        "the CUDA driver's cache of PTX compiled for this GPU. Self-keyed by the driver "
        "(PTX contents, driver version, device).",
        (_sg("0.5.19", ENV, 1810), _sg("0.5.23", ENV, 2313)),
        installed_by="driver"),
    Cache(
        "HF_HOME", "huggingface", SHARED, "$XDG_CACHE_HOME/huggingface or ~/.cache/huggingface",
        "Hugging Face hub downloads (configs, tokenizers). Content-addressed by revision.",
        (Where("huggingface_hub", "2.4.0", "huggingface_hub/constants.py", 163),),
        installed_by="transformers"),
    Cache(
        "SGLANG_JIT_CACHE_DIR", "sglang-jit", SHARED, "~/.cache/sglang/jit (not under "
        "SGLANG_CACHE_DIR)",
        "SGLang's own JIT kernels (0.5.18+). Self-keyed: "
        "<target>/<module>/build-<build_key>, every input folded into build_key.",
        (_sg("0.5.19", ENV, 1091), _sg("0.5.23", ENV, 1397),
         _sg("0.5.23", "sglang/kernels/jit/utils/compile/cache.py", 318)),
        since="0.5.18"),
    Cache(
        "TILELANG_CACHE_DIR", "tilelang", SHARED, "~/.tilelang/cache",
        "TileLang's compiled kernels (pinned from 0.5.12; DeepSeek-V4 prenorm kernels). "
        "Self-keyed: the key holds tilelang's and torch's versions.",
        (Where("tilelang", "0.1.12", "tilelang/env.py", 337), _sg("0.5.23", ENV, 2317)),
        installed_by="tilelang", since="0.5.12"),
    Cache(
        "SGLANG_CACHE_DIR", "sglang", PER_RELEASE, "~/.cache/sglang",
        "SGLang's own cache root: torch.compile graphs, flashinfer autotune results, the GPU "
        "P2P access table, CuTe AOT objects. Per release: the P2P table is keyed by "
        "CUDA_VISIBLE_DEVICES only and the CuTe objects are loaded into the process as they are.",
        (_sg("0.5.10", "sglang/srt/compilation/backend.py", 397),
         _sg("0.5.10", "sglang/srt/utils/runai_utils.py", 31),
         _sg("0.5.12", ENV, 655), _sg("0.5.13", ENV, 855),
         _sg("0.5.19", ENV, 1088), _sg("0.5.23", ENV, 1383))),
    Cache(
        "SGLANG_CUTE_AOT_CACHE_DIR", "sglang/cute_aot", PER_RELEASE, "$SGLANG_CACHE_DIR/cute_aot",
        "CuTe DSL ahead-of-time objects (0.5.20+), loaded into the process as they are "
        "('must be trusted'): per release.",
        (_sg("0.5.23", ENV, 1387),),
        since="0.5.20"),
    Cache(
        "TORCH_EXTENSIONS_DIR", "torch_extensions", PER_RELEASE,
        "$XDG_CACHE_HOME/torch_extensions/py<ver>_cu<ver>",
        "C++/CUDA extensions torch builds at run time. Per release: torch rebuilds when the "
        "sources or flags change, not when torch itself does, so a new torch could load a "
        "library built against the old one's ABI.",
        (Where("torch", "2.13.0", "torch/utils/cpp_extension.py", 2800),
         _sg("0.5.23", "sglang/srt/utils/cpp_extension_loader.py", 33)),
        installed_by="torch"),
    Cache(
        "TVM_FFI_CACHE_DIR", "tvm-ffi", PER_RELEASE, "~/.cache/tvm-ffi",
        "tvm-ffi's JIT builds (SGLang's JIT kernels up to 0.5.17). Per release: the directory "
        "is <name>_<hash of the sources and flags>, not of tvm-ffi's version nor of the headers "
        "the sources include (which come with each release).",
        (Where("apache-tvm-ffi", "0.1.9", "tvm_ffi/cpp/extension.py", 625),
         _sg("0.5.17", "sglang/kernels/jit/utils/compile.py", 273)),
        installed_by="apache-tvm-ffi"),
    Cache(
        "OUTLINES_CACHE_DIR", "outlines", PER_RELEASE, "~/.cache/outlines",
        "outlines' compiled regex automata (structured output). Per release: entries are "
        "cloudpickled Python objects, valid only for the library versions that wrote them.",
        (Where("outlines", "0.1.11", "outlines/caching.py", 54),),
        installed_by="outlines"),
    Cache(
        "FLASH_ATTENTION_CUTE_DSL_CACHE_DIR", "cute_dsl", PER_RELEASE,
        "/tmp/<user>/flash_attention_cute_dsl_cache",
        "FlashAttention CuTe DSL kernels (0.5.16-0.5.19, used only with "
        "FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1). Its default is under /tmp (emptied by "
        "PrivateTmp); compiled objects: per release.",
        (_sg("0.5.16", "sglang/jit_kernel/flash_attn/cute/cache_utils.py", 41),
         _sg("0.5.19", "sglang/kernels/ops/attention/flash_attn/cute/cache_utils.py", 41)),
        since="0.5.16", until="0.5.19"),
    Cache(
        "XDG_CACHE_HOME", "xdg", PER_RELEASE, "~/.cache",
        "what any library puts under the user's cache directory without a variable of its "
        "own (torch's default extension root, SGLang's expert packs). Unknown keying: per "
        "release.",
        (Where("torch", "2.13.0", "torch/_appdirs.py", 349),
         _sg("0.5.23", "sglang/srt/model_loader/expert_pack_runtime.py", 29))),
)


def release_key(version: str) -> str:
    """The directory name of a release's own caches: its version, checked to be only that.

        release_key("0.5.13.post1")   # '0.5.13.post1'
    """
    if not _VERSION.fullmatch(version):
        raise ValueError(f"SGLang version {version!r} cannot name a cache directory "
                         "(expected digits and dots, e.g. 0.5.23)")
    return version


def cache_dir(cache: Cache, version: str, root: str = CACHE) -> str:
    """The directory ``cache`` uses for SGLang ``version``.

        cache_dir(CACHES[0], "0.5.23")   # '/var/cache/sglang/deep_gemm'
    """
    if cache.scope == SHARED:
        return f"{root}/{cache.subdir}"
    return f"{root}/release/{release_key(version)}/{cache.subdir}"


def caches_for(version: str) -> list[Cache]:
    """The caches SGLang ``version`` (or a library it pins) reads."""
    return [c for c in CACHES if c.read_in(version)]


def cache_env(version: str, root: str = CACHE) -> dict[str, str]:
    """The environment that points every cache of ``version`` under ``root``; goes into the
    unit's EnvironmentFile (after the defaults, before the profile's own ``env``).

        cache_env("0.5.12")["TORCH_EXTENSIONS_DIR"]
        # '/var/cache/sglang/release/0.5.12/torch_extensions'
    """
    release_key(version)  # a clear error before any comparison of versions
    return {c.variable: cache_dir(c, version, root) for c in caches_for(version)}


# ``python -m sglang.compile_deep_gemm <launch_server flags> [--timeout S]`` (default 3600 s):
# shipped by every supported release (sglang/compile_deep_gemm.py, 0.5.10 - 0.5.23). It starts a
# server without CUDA graphs on --port, sends one generation and kills it: the DeepGEMM cache
# (SGLANG_DG_CACHE_DIR) is filled for that model and TP size. It needs the model's GPU memory and
# a free port, so beside a running server it fits only on spare GPUs.
PRECOMPILE_MODULE = "sglang.compile_deep_gemm"
PRECOMPILE_SINCE = "0.5.10"


def precompile_module(version: str) -> str | None:
    """The module that fills ``version``'s DeepGEMM cache without serving, if it ships one.

        precompile_module("0.5.23")   # 'sglang.compile_deep_gemm'
    """
    return PRECOMPILE_MODULE if releases.at_least(version, PRECOMPILE_SINCE) else None
