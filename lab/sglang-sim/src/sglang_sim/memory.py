"""GPU memory the way SGLang plans it, to the degree that matters to an operator.

Follows ``ServerArgs._handle_gpu_memory_settings`` (mem_fraction_static, chunked prefill),
``ModelRunner.load_model`` (weights), ``KVCacheConfigurator._handle_max_mamba_cache`` and
``resolve_max_num_reqs`` (mamba slots, KV tokens, max running requests). Sizes are GiB, as
SGLang's ``get_available_gpu_memory`` reports them ("GB" in its log lines).
"""

from __future__ import annotations

from argparse import Namespace
from dataclasses import dataclass

from sglang_sim import rules
from sglang_sim.args import release_tuple
from sglang_sim.model import ModelShape

GB = 1 << 30
CONTEXT_OVERHEAD_GB = 0.56  # CUDA context and NCCL buffers before the weights
CUDA_GRAPH_GB = 1.83  # captured graphs after the memory pool



@dataclass(frozen=True)
class MemoryPlan:
    total_gb: float
    mem_fraction_static: float
    chunked_prefill_size: int
    avail_before_load_gb: float
    weight_gb: float
    kv_tokens: int
    kv_k_gb: float
    kv_v_gb: float
    mamba_slots: int
    mamba_conv_gb: float
    mamba_ssm_gb: float
    intermediate_ssm_gb: float
    intermediate_conv_gb: float
    slots_per_request: int
    max_running_requests: int
    capped_by_mamba: bool
    pool_end_avail_gb: float
    available_gpu_mem_gb: float
    context_len: int
    max_prefill_tokens: int

    @property
    def avail_after_load_gb(self) -> float:
        return self.avail_before_load_gb - self.weight_gb


def default_memory_settings(args: Namespace, gpu_mem_mib: int) -> None:
    """_handle_gpu_memory_settings for a large (> 160 GB) GPU, in MiB like SGLang."""
    if args.mamba_full_memory_ratio is None:  # 0.5.20+ resolve it late; earlier default 0.9
        args.mamba_full_memory_ratio = 0.9
    if args.max_prefill_tokens is None:
        args.max_prefill_tokens = 16384
    if args.chunked_prefill_size is None:
        args.chunked_prefill_size = 16384 if gpu_mem_mib >= 160 * 1024 else 8192
    if args.mem_fraction_static is not None:
        return
    reserved = 512 + max(args.chunked_prefill_size, 2048) * 1.5 + 512 * 2
    reserved += args.tp_size * getattr(args, "pp_size", 1) / 8 * 1024
    if gpu_mem_mib > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    if args.speculative_algorithm is not None:
        reserved += 6 * 1024 if args.speculative_algorithm == "STANDALONE" else 4 * 1024
    args.mem_fraction_static = round((gpu_mem_mib - reserved) / gpu_mem_mib, 3)


def plan(args: Namespace, shape: ModelShape, gpu_mem_mib: int,
         release: str = "0.5.23") -> MemoryPlan:
    """Everything SGLang prints about memory at startup; RuntimeError as SGLang raises. The
    slots follow the release: 0.5.10 - 0.5.12 reserve the draft state for all requested running
    requests first; 0.5.13+ size slots and draft state together; 0.5.17+ keep one slot back."""
    tp = args.tp_size
    total = gpu_mem_mib / 1024
    before = total - CONTEXT_OVERHEAD_GB
    weight = shape.weight_bytes(tp) / GB
    after = before - weight
    rest = after - total * (1 - args.mem_fraction_static)
    if rest <= 0:
        minimum = 1 - after / before
        raise ValueError(
            f"Loaded weights leave no GPU memory for the KV cache under "
            f"--mem-fraction-static={args.mem_fraction_static}. Raise --mem-fraction-static "
            f"above {minimum:.3f}.")
    spec = args.speculative_algorithm is not None
    draft = args.speculative_num_draft_tokens or 0
    ratio = rules.mamba_slots_per_request(args)
    slots = conv_gb = ssm_gb = inter_ssm = inter_conv = 0.0
    conv_b, ssm_b = shape.conv_bytes_per_slot(tp), shape.ssm_bytes_per_slot(tp)
    per_slot = conv_b + ssm_b
    requested = args.max_running_requests
    up_front = spec and release_tuple(release) < (0, 5, 13, 0)
    if shape.is_hybrid and up_front:
        # 0.5.10 - 0.5.12 handle_max_mamba_cache: the draft's intermediate state is reserved
        # for every requested running request before the slots are sized (0.5.12
        # model_runner_kv_cache_mixin.py:83-98).
        rest -= per_slot * max(1, requested or 48) * draft / GB
    if shape.is_hybrid:
        if args.max_mamba_cache_size is not None:
            slots = args.max_mamba_cache_size
        elif args.disable_radix_cache and requested is not None:
            slots = max(1, requested)
        else:
            budget = rest * args.mamba_full_memory_ratio / (1 + args.mamba_full_memory_ratio) * GB
            # 0.5.13+ solve slots and intermediate state together; 0.5.17+ keep one slot (and
            # its draft state) back (kv_cache_configurator._handle_max_mamba_cache).
            spare = release_tuple(release) >= (0, 5, 17, 0)
            if spec and not up_front:
                slots = int((budget - (per_slot * (1 + draft) if spare else 0))
                            // (per_slot * (1 + draft / ratio)))
            else:
                slots = int((budget - (per_slot if spare else 0)) // per_slot)
        slots = int(slots)
        if slots <= 0:
            raise RuntimeError(
                "Not enough GPU memory for hybrid (mamba/linear-attention) state cache. "
                f"Computed max_mamba_cache_size={slots} (total_rest_memory={rest:.2f} GB, "
                f"mamba_cache_per_req={per_slot / (1 << 20):.2f} MB). Try: (1) reduce "
                "--max-running-requests, (2) increase --mem-fraction-static, (3) reduce "
                "--speculative-num-draft-tokens, or (4) use GPUs with more memory.")
        conv_gb, ssm_gb = conv_b * (slots + 1) / GB, ssm_b * (slots + 1) / GB
        # What comes out of the KV budget: the slots (and from 0.5.17 the padding slot, as
        # allocated), and from 0.5.13 the draft state of the requests the slots allow
        # (0.5.13 model_runner_kv_cache_mixin.py handle_max_mamba_cache; 0.5.23
        # kv_cache_configurator.py:3303-3345, :3404-3408).
        padded = 1 if release_tuple(release) >= (0, 5, 17, 0) else 0
        if spec and not up_front:
            reqs = min(max(1, requested or 48), slots // ratio) + padded
            rest -= per_slot * reqs * draft / GB
        rest -= per_slot * (slots + padded) / GB
    kv_per_token = shape.kv_bytes_per_token(tp)
    page = args.page_size or 1
    tokens = int(rest * GB // kv_per_token) // page * page
    if args.max_total_tokens is not None:
        tokens = min(tokens, args.max_total_tokens)
    context_len = args.context_length or shape.context_length
    estimated = max(min(int(tokens / context_len * 512), 4096), 2048)
    max_reqs = min(requested, tokens // 2) if requested is not None else min(estimated,
                                                                               tokens // 2)
    capped_by_mamba = False
    if shape.is_hybrid:
        cap = int(slots) // ratio
        if cap < max_reqs:
            capped_by_mamba = True
            max_reqs = cap
        if max_reqs <= 0:
            raise RuntimeError(
                "Hybrid (mamba/linear-attention) state cache is too small to serve any requests. "
                f"max_mamba_cache_size={slots}, mamba_ratio={ratio}, resulting "
                f"max_num_reqs={max_reqs}. Try: (1) reduce --max-running-requests, (2) increase "
                "--mem-fraction-static, or (3) use GPUs with more memory.")
    if shape.is_hybrid and spec:
        # Every release allocates the draft state for the resolved requests, plus the padding
        # slot (mamba_spec_state_size=max_num_reqs: 0.5.12 model_runner_kv_cache_mixin.py:297,
        # 0.5.23 kv_cache_configurator.py:1721; spec_state_size + 1: 0.5.12 memory_pool.py:296,
        # 0.5.23 :886): up to 0.5.12 less than was reserved, and the rest stays free.
        inter_ssm = ssm_b * (max_reqs + 1) * draft / GB
        inter_conv = conv_b * (max_reqs + 1) * draft / GB
    kv_gb = tokens * kv_per_token / GB
    pool_end = after - kv_gb - conv_gb - ssm_gb - inter_ssm - inter_conv
    return MemoryPlan(
        total_gb=total, mem_fraction_static=args.mem_fraction_static,
        chunked_prefill_size=args.chunked_prefill_size, avail_before_load_gb=before,
        weight_gb=weight, kv_tokens=tokens, kv_k_gb=kv_gb / 2, kv_v_gb=kv_gb / 2,
        mamba_slots=int(slots), mamba_conv_gb=conv_gb, mamba_ssm_gb=ssm_gb,
        intermediate_ssm_gb=inter_ssm, intermediate_conv_gb=inter_conv,
        slots_per_request=ratio, max_running_requests=max_reqs, capped_by_mamba=capped_by_mamba,
        pool_end_avail_gb=pool_end, available_gpu_mem_gb=pool_end - CUDA_GRAPH_GB,
        context_len=context_len, max_prefill_tokens=args.max_prefill_tokens,
    )
