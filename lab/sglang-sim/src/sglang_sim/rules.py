"""SGLang's argument resolution and startup checks for hybrid models with speculative decoding.

Written from SGLang's own source: ``ServerArgs._handle_mamba_radix_cache`` and
``_handle_speculative_decoding`` in ``sglang/srt/server_args.py`` (0.5.10 - 0.5.19),
``sglang/srt/arg_groups/{overrides,mamba_hook,model_hook,speculative_hook}.py`` (0.5.20+) and
``SpeculativeAlgorithm.from_string``. Failures raise the exception type SGLang raises, with its
message, so a launch dies the same way.
"""

from __future__ import annotations

import json
import logging
import os
from argparse import Namespace
from functools import cache
from typing import Any

from sglang_sim.args import _data_dir, release_tuple

logger = logging.getLogger("sglang.srt.server_args")

NEW_STRATEGY = (0, 5, 14, 0)  # --mamba-radix-cache-strategy; auto resolves per architecture
FLA_CHUNK_SIZE = 64  # sglang/srt/layers/attention/fla/chunk_delta_h.py CHUNK_SIZE
EXTRA_BUFFERS = ("extra_buffer", "extra_buffer_lazy")
SPEC_V2_ENV = "SGLANG_ENABLE_SPEC_V2"


@cache
def _mamba_table() -> dict[str, dict[str, list[str]]]:
    """mamba_archs.json: per release, read from its source by the product's oracle script."""
    table: dict[str, dict[str, list[str]]] = json.loads(
        (_data_dir() / "mamba_archs.json").read_text())
    return table


def _archs(rel: tuple[int, ...], kind: str) -> frozenset[str]:
    known = {release_tuple(v): v for v in _mamba_table()}
    floor = max((t for t in known if t <= rel), default=min(known))
    return frozenset(_mamba_table()[known[floor]][kind])


def extra_buffer_archs(rel: tuple[int, ...]) -> frozenset[str]:
    return _archs(rel, "extra_buffer")


def strategy_dest(args: Namespace) -> str:
    return "mamba_radix_cache_strategy" if hasattr(args, "mamba_radix_cache_strategy") \
        else "mamba_scheduler_strategy"


def resolve_speculative(args: Namespace, spec_names: dict[str, list[str]],
                        rel: tuple[int, ...]) -> None:
    """SpeculativeAlgorithm.from_string, the NEXTN alias, topk-1 draft tokens, default 48, and
    0.5.10's spec v2 switch (overlap schedule only with SGLANG_ENABLE_SPEC_V2)."""
    name = args.speculative_algorithm
    if name is None:
        return
    upper = name.upper()
    if upper not in spec_names["names"] and upper not in spec_names["aliases_of_eagle"]:
        raise ValueError(f"Unknown speculative algorithm name: {name}")
    if upper in spec_names["aliases_of_eagle"]:
        args.speculative_algorithm = "EAGLE"
    if args.speculative_algorithm not in ("EAGLE", "EAGLE3"):
        return
    if args.max_running_requests is None:
        args.max_running_requests = 48
        logger.warning("Max running requests is reset to 48 for speculative decoding. You can "
                       "override this by explicitly setting --max-running-requests.")
    if rel < (0, 5, 11, 0):
        if os.environ.get(SPEC_V2_ENV, "").lower() in ("1", "true", "yes", "on"):
            args.disable_overlap_schedule = False
            if args.speculative_eagle_topk is not None and args.speculative_eagle_topk > 1:
                raise ValueError(
                    "Spec v2 currently only supports topk = 1 for speculative decoding.")
        else:
            args.disable_overlap_schedule = True
    if args.speculative_num_steps is None:  # Qwen auto parameters
        args.speculative_num_steps, args.speculative_eagle_topk = 3, 1
        args.speculative_num_draft_tokens = 4
    if (args.speculative_eagle_topk == 1
            and args.speculative_num_draft_tokens != args.speculative_num_steps + 1):
        logger.warning("speculative_num_draft_tokens is adjusted to speculative_num_steps + 1 "
                       "when speculative_eagle_topk == 1")
        args.speculative_num_draft_tokens = args.speculative_num_steps + 1


def _check_chunk(page: int, rel: tuple[int, ...]) -> None:
    """FLA chunks and pages must nest: server_args.py (0.5.10 - 0.5.18, the mamba_cache_chunk_size
    property from 0.5.13), arg_groups/overrides.py mamba_cache_chunk_size (0.5.19+)."""
    if max(FLA_CHUNK_SIZE, page) % min(FLA_CHUNK_SIZE, page) == 0:
        return
    if rel < (0, 5, 13, 0):
        raise AssertionError(
            "For SSM models with extra buffer, either FLA_CHUNK_SIZE or page_size must be "
            f"divisible by the other, got FLA_CHUNK_SIZE={FLA_CHUNK_SIZE}, self.page_size={page}")
    name = "page_size" if rel >= (0, 5, 15, 0) else "self.page_size"
    raise AssertionError("For SSM models, either chunk_size or page_size must be divisible by the "
                         f"other, got chunk_size={FLA_CHUNK_SIZE}, {name}={page}")


def _old_extra_buffer(args: Namespace, arch: str, rel: tuple[int, ...]) -> None:
    """0.5.10 - 0.5.13.post1 ServerArgs._handle_mamba_radix_cache, extra_buffer branch."""
    if args.disable_radix_cache:
        raise ValueError(
            "mamba extra_buffer is not compatible with --disable-radix-cache"
            + (". " if rel >= (0, 5, 13, 0) else " ") +
            "Overlap scheduling is already supported with no_buffer + disable_radix_cache. "
            "Please use --mamba-scheduler-strategy no_buffer instead.")
    draft, page = args.speculative_num_draft_tokens, args.page_size
    track = args.mamba_track_interval
    if draft is not None:
        assert args.mamba_scheduler_strategy != "extra_buffer_lazy", (
            "extra_buffer_lazy is not yet supported with speculative decoding. "
            "Use --mamba-scheduler-strategy extra_buffer instead.")
        assert track >= draft, (f"mamba_track_interval {track} must be greater than or equal to "
                                f"speculative_num_draft_tokens {draft}")
    if page is not None:
        assert track % page == 0, \
            f"mamba_track_interval {track} must be divisible by page_size {page}"
        _check_chunk(page, rel)


def _old_mamba(args: Namespace, arch: str, rel: tuple[int, ...]) -> None:
    if arch in _archs(rel, "radix_cache_disabled"):
        logger.warning(f"Disabling Radix Cache for {arch} as it is not yet supported.")
        args.disable_radix_cache = True
        return
    if args.mamba_scheduler_strategy == "auto":  # _handle_missing_default_values
        args.mamba_scheduler_strategy = "no_buffer"
    extra = args.mamba_scheduler_strategy in EXTRA_BUFFERS
    if arch not in extra_buffer_archs(rel):
        assert not extra, f"mamba extra_buffer is not supported for {arch} model"
    if extra:
        _old_extra_buffer(args, arch, rel)
    elif not args.disable_radix_cache:
        if args.page_size is not None and args.page_size != 1:
            logger.warning(f"{arch} with radix cache requires page_size=1 in the current Mamba "
                           f"scheduling mode (no_buffer), but got {args.page_size}. "
                           "Automatically setting page_size=1.")
            args.page_size = 1
        if args.speculative_algorithm is None:
            args.disable_overlap_schedule = True
        else:
            raise ValueError(
                f"Speculative decoding for {arch} is not compatible with radix cache when using "
                "--mamba-scheduler-strategy no_buffer."
                "To use radix cache with speculative decoding, please use "
                "--mamba-scheduler-strategy extra_buffer and set SGLANG_ENABLE_SPEC_V2=1.")


def _supports_extra_buffer(args: Namespace, arch: str, rel: tuple[int, ...]) -> bool:
    return arch in extra_buffer_archs(rel) and args.linear_attn_backend == "triton"


def _new_extra_buffer(args: Namespace, arch: str, rel: tuple[int, ...]) -> None:
    """validate_mamba_extra_buffer (server_args.py 0.5.14, arg_groups/mamba_hook.py 0.5.15+)."""
    assert _supports_extra_buffer(args, arch, rel), \
        f"extra_buffer is not supported for {arch}; use no_buffer."
    draft, page = args.speculative_num_draft_tokens, args.page_size
    if draft is not None:
        if rel < (0, 5, 17, 0):
            assert args.mamba_radix_cache_strategy != "extra_buffer_lazy", \
                "extra_buffer_lazy unsupported with spec."
        assert args.mamba_track_interval >= draft
    if page is not None:
        assert args.mamba_track_interval % page == 0
        _check_chunk(page, rel)


def _new_mamba(args: Namespace, arch: str, rel: tuple[int, ...]) -> None:
    """0.5.14+: with the radix cache off the rules return early, whatever the strategy."""
    if args.disable_radix_cache:
        return
    if args.mamba_radix_cache_strategy == "auto":
        wants = not args.disable_overlap_schedule or (args.page_size or 1) > 1
        if wants and _supports_extra_buffer(args, arch, rel):
            args.mamba_radix_cache_strategy = "extra_buffer"
        else:
            args.mamba_radix_cache_strategy = "no_buffer"
            args.disable_overlap_schedule = True
    if args.mamba_radix_cache_strategy in EXTRA_BUFFERS:
        _new_extra_buffer(args, arch, rel)
        return
    assert args.page_size in (1, None), "no_buffer only supports page_size=1."
    assert args.disable_overlap_schedule, (
        "no_buffer do not support overlap schedule. Try to set disable_overlap_schedule=True.")
    assert args.attention_backend != "trtllm_mha", \
        "no_buffer do not support trtllm_mha attention backend."


def _not_mamba(args: Namespace, arch: str, rel: tuple[int, ...]) -> None:
    """0.5.21+ model_hook.handle_mamba_radix_cache: an explicit extra buffer needs mamba state."""
    strategy = getattr(args, strategy_dest(args))
    if rel >= (0, 5, 21, 0) and strategy in EXTRA_BUFFERS and not args.disable_radix_cache:
        raise ValueError(f"--mamba-radix-cache-strategy {strategy} needs mamba state, "
                         f"got {arch}.")


def is_hybrid(arch: str, rel: tuple[int, ...]) -> bool:
    return arch in _archs(rel, "radix_cache") or arch in _archs(rel, "radix_cache_disabled")


def grpc_in_place_of_http(args: Namespace) -> bool:
    """--smg-grpc-mode, or --grpc-mode (its name up to 0.5.15, then an alias)."""
    return bool(getattr(args, "smg_grpc_mode", False) or getattr(args, "grpc_mode", False))


def grpc_mode(args: Namespace) -> bool:
    """gRPC asked for: in place of HTTP or beside it (--grpc-port)."""
    return grpc_in_place_of_http(args) or getattr(args, "grpc_port", None) is not None


def _native_grpc(args: Namespace) -> None:
    """--grpc-mode as the deprecated alias of --smg-grpc-mode; --grpc-port, or SGLANG_GRPC_PORT
    in its place, refused with a key; in the SMG mode it defaults to port + 10000, and either
    way it is range-checked (0.5.16 server_args.py:3300-3381, 0.5.23
    arg_groups/serving_hook.py:339-394)."""
    if not hasattr(args, "grpc_port"):
        return  # before 0.5.16: neither the flag nor the variable
    if getattr(args, "grpc_mode", False) and not getattr(args, "smg_grpc_mode", False):
        logging.getLogger("sglang.srt.server_args").warning(
            "--grpc-mode is deprecated and will be removed in a future version. Use "
            "--smg-grpc-mode for the legacy SMG gRPC server, or --grpc-port for the native "
            "gRPC server.")
        args.smg_grpc_mode = True
    if args.grpc_port is None and os.environ.get("SGLANG_GRPC_PORT"):
        args.grpc_port = int(os.environ["SGLANG_GRPC_PORT"])
    legacy = grpc_in_place_of_http(args)
    if legacy and args.grpc_port is None:
        args.grpc_port = args.port + 10000
    if args.grpc_port is not None and not 1 <= args.grpc_port <= 65535:
        raise ValueError(f"--grpc-port / SGLANG_GRPC_PORT ({args.grpc_port}) must be between 1 "
                         "and 65535")
    if args.grpc_port is not None and not legacy and (
            args.api_key or getattr(args, "admin_api_key", None)):
        raise ValueError("--grpc-port is incompatible with --api-key/--admin-api-key: "
                         "the native gRPC listener bypasses HTTP auth middleware.")


def resolve(args: Namespace, arch: str, release: str, spec_names: dict[str, Any]) -> None:
    """Apply the release's resolution to ``args`` in place; raise as SGLang raises. The model's
    rules run before the speculative ones, as in ServerArgs.__post_init__ and the 0.5.15+
    resolution pipeline."""
    rel = release_tuple(release)
    _native_grpc(args)
    if not is_hybrid(arch, rel):
        _not_mamba(args, arch, rel)
    else:
        if args.attention_backend is None:
            args.attention_backend = "triton"  # the sm100 default for these architectures
        if rel >= NEW_STRATEGY:
            _new_mamba(args, arch, rel)
        else:
            _old_mamba(args, arch, rel)
    resolve_speculative(args, spec_names, rel)


def extra_buffer_on(args: Namespace) -> bool:
    return (not args.disable_radix_cache
            and getattr(args, strategy_dest(args)) in ("extra_buffer", "extra_buffer_lazy"))


def mamba_slots_per_request(args: Namespace) -> int:
    """_calculate_mamba_ratio (model_runner_kv_cache_mixin.py 0.5.10 - 0.5.13,
    kv_cache_configurator.py 0.5.14+): 1 with the radix cache off, else 3, plus for extra_buffer
    2 with the overlap schedule and 1 without; the lazy buffer (0.5.13+) adds 1 and needs the
    overlap schedule (asserted here, after ServerArgs accepted the arguments)."""
    if args.disable_radix_cache:
        return 1
    if not extra_buffer_on(args):
        return 3
    if getattr(args, strategy_dest(args)) == "extra_buffer_lazy":
        assert not args.disable_overlap_schedule, (
            "Lazy extra buffer requires overlap schedule (--disable-overlap-schedule is "
            "incompatible)")
        return 3 + 1
    return 3 + (1 if args.disable_overlap_schedule else 2)
