"""SGLang's argument resolution and startup checks for hybrid models with speculative decoding.

Written from SGLang's own source: ``ServerArgs._handle_mamba_radix_cache`` and
``_handle_speculative_decoding`` in ``sglang/srt/server_args.py`` (0.5.10 - 0.5.19),
``sglang/srt/arg_groups/{overrides,mamba_hook,model_hook,speculative_hook}.py`` (0.5.20+) and
``SpeculativeAlgorithm.from_string``. Failures raise the exception type SGLang raises, with its
message, so a launch dies the same way.
"""

from __future__ import annotations

import logging
from argparse import Namespace
from typing import Any

from sglang_sim.args import release_tuple

logger = logging.getLogger("sglang.srt.server_args")

NEW_STRATEGY = (0, 5, 14, 0)  # --mamba-radix-cache-strategy; auto resolves per architecture
# _handle_mamba_radix_cache(support_mamba_cache_extra_buffer=True) callers, by first release.
EXTRA_BUFFER = {
    (0, 5, 10, 0): ["Qwen3NextForCausalLM", "Qwen3_5MoeForConditionalGeneration",
                    "Qwen3_5ForConditionalGeneration"],
    (0, 5, 12, 0): ["InternS2PreviewForConditionalGeneration",
                    "MiniCPMV4_6ForConditionalGeneration"],
    (0, 5, 13, 0): ["BailingMoeV2_5ForCausalLM"],
    (0, 5, 14, 0): ["FalconH1ForCausalLM", "GraniteMoeHybridForCausalLM",
                    "NemotronHForCausalLM", "NemotronHPuzzleForCausalLM"],
    (0, 5, 20, 0): ["Qwen3_5ForCausalLM", "Qwen3_5MoeForCausalLM", "KimiLinearForCausalLM",
                    "Qwen4ExpForConditionalGeneration", "MiniCPMV4_7ForConditionalGeneration",
                    "BailingMoeV3ForCausalLM", "BailingMoeV3VLForConditionalGeneration",
                    "Glm5NextForConditionalGeneration", "NemotronH_Omni_Reasoning_V3",
                    "KimiK3ForConditionalGeneration", "InklingForConditionalGeneration",
                    "InklingForConditionalGenerationMTP"],
}
MAMBA_ONLY = ["FalconH1ForCausalLM", "JetNemotronForCausalLM", "JetVLMForConditionalGeneration",
              "GraniteMoeHybridForCausalLM", "Lfm2ForCausalLM", "NemotronHForCausalLM",
              "NemotronHPuzzleForCausalLM"]


def extra_buffer_archs(rel: tuple[int, ...]) -> set[str]:
    return {a for since, archs in EXTRA_BUFFER.items() if rel >= since for a in archs}


def strategy_dest(args: Namespace) -> str:
    return "mamba_radix_cache_strategy" if hasattr(args, "mamba_radix_cache_strategy") \
        else "mamba_scheduler_strategy"


def resolve_speculative(args: Namespace, spec_names: dict[str, list[str]]) -> None:
    """SpeculativeAlgorithm.from_string, the NEXTN alias, topk-1 draft tokens, default 48."""
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
    if args.speculative_num_steps is None:  # Qwen auto parameters
        args.speculative_num_steps, args.speculative_eagle_topk = 3, 1
        args.speculative_num_draft_tokens = 4
    if (args.speculative_eagle_topk == 1
            and args.speculative_num_draft_tokens != args.speculative_num_steps + 1):
        logger.warning("speculative_num_draft_tokens is adjusted to speculative_num_steps + 1 "
                       "when speculative_eagle_topk == 1")
        args.speculative_num_draft_tokens = args.speculative_num_steps + 1


def _check_extra_buffer(args: Namespace, arch: str, rel: tuple[int, ...]) -> None:
    draft, page = args.speculative_num_draft_tokens, args.page_size
    if rel < NEW_STRATEGY:
        assert arch in extra_buffer_archs(rel), \
            f"mamba extra_buffer is not supported for {arch} model"
        if draft is not None:
            assert args.mamba_track_interval >= draft, (
                f"mamba_track_interval {args.mamba_track_interval} must be greater than or "
                f"equal to speculative_num_draft_tokens {draft}")
        if page is not None:
            assert args.mamba_track_interval % page == 0, (
                f"mamba_track_interval {args.mamba_track_interval} must be divisible by "
                f"page_size {page}")
        return
    supported = arch in extra_buffer_archs(rel) and args.linear_attn_backend == "triton"
    assert supported, f"extra_buffer is not supported for {arch}; use no_buffer."
    lazy = args.mamba_radix_cache_strategy == "extra_buffer_lazy"
    if draft is not None:
        if rel < (0, 5, 20, 0):
            assert not lazy, "extra_buffer_lazy unsupported with spec."
        assert args.mamba_track_interval >= draft
    if page is not None:
        assert args.mamba_track_interval % page == 0


def _old_mamba(args: Namespace, arch: str, rel: tuple[int, ...]) -> None:
    if args.mamba_scheduler_strategy == "auto":
        args.mamba_scheduler_strategy = "no_buffer"
    if args.mamba_scheduler_strategy == "extra_buffer":
        if args.disable_radix_cache:
            raise ValueError(
                "mamba extra_buffer is not compatible with --disable-radix-cache "
                "Overlap scheduling is already supported with no_buffer + disable_radix_cache. "
                "Please use --mamba-scheduler-strategy no_buffer instead.")
        _check_extra_buffer(args, arch, rel)
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


def _new_mamba(args: Namespace, arch: str, rel: tuple[int, ...]) -> None:
    strategy = args.mamba_radix_cache_strategy
    if args.disable_radix_cache:
        if strategy in ("extra_buffer", "extra_buffer_lazy") and rel >= (0, 5, 20, 0):
            raise ValueError(f"--mamba-radix-cache-strategy {strategy} needs mamba state, "
                             f"got {arch}.")
        return
    if strategy == "auto":
        wants = not args.disable_overlap_schedule or (args.page_size or 1) > 1
        if wants and arch in extra_buffer_archs(rel) and args.linear_attn_backend == "triton":
            args.mamba_radix_cache_strategy = "extra_buffer"
        else:
            args.mamba_radix_cache_strategy = "no_buffer"
            args.disable_overlap_schedule = True
    if args.mamba_radix_cache_strategy in ("extra_buffer", "extra_buffer_lazy"):
        _check_extra_buffer(args, arch, rel)
        return
    assert args.page_size in (1, None), "no_buffer only supports page_size=1."
    assert args.disable_overlap_schedule, (
        "no_buffer do not support overlap schedule. Try to set disable_overlap_schedule=True.")
    assert args.attention_backend != "trtllm_mha", \
        "no_buffer do not support trtllm_mha attention backend."


def is_hybrid(arch: str, rel: tuple[int, ...]) -> bool:
    return arch in extra_buffer_archs(rel) or arch in MAMBA_ONLY


def resolve(args: Namespace, arch: str, release: str, spec_names: dict[str, Any]) -> None:
    """Apply the release's resolution to ``args`` in place; raise as SGLang raises."""
    rel = release_tuple(release)
    resolve_speculative(args, spec_names)
    if not is_hybrid(arch, rel):
        return
    if args.attention_backend is None:
        args.attention_backend = "triton"  # the sm100 default for these architectures
    if rel >= NEW_STRATEGY:
        _new_mamba(args, arch, rel)
    else:
        _old_mamba(args, arch, rel)


def extra_buffer_on(args: Namespace) -> bool:
    return (not args.disable_radix_cache
            and getattr(args, strategy_dest(args)) in ("extra_buffer", "extra_buffer_lazy"))


def mamba_slots_per_request(args: Namespace) -> int:
    """kv_cache_configurator._calculate_mamba_ratio: 3 base; extra_buffer +2 with overlap."""
    if args.disable_radix_cache:
        return 1
    if not extra_buffer_on(args):
        return 3
    if getattr(args, strategy_dest(args)) == "extra_buffer_lazy":
        return 3 + 1
    return 3 + (1 if args.disable_overlap_schedule else 2)
