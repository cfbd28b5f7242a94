"""Capacity report from one SGLang invocation's startup log lines (standard library only: the
gate runs it on the host).

    report = parse(journal_lines)
    for line in advice(report): print(line)
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

# SGLang's formats (sglang/srt/model_executor/model_runner.py, mem_cache/memory_pool.py,
# mem_cache/kv_cache_configurator.py, managers/scheduler.py); a line may carry a rank prefix.
LOAD = re.compile(r"Load weight end\. elapsed=(?P<elapsed>[\d.]+) s, type=(?P<arch>[\w.]+), "
                  r"(?:.*?, )?avail mem=(?P<avail>[\d.]+) GB, mem usage=(?P<weights>[\d.]+) GB")
KV = re.compile(r"KV Cache (?:is allocated|VA upper bound)\. dtype: (?P<dtype>\S+), "
                r"#tokens: (?P<tokens>\d+), (?:K size: (?P<k>[\d.]+) GB, V size: (?P<v>[\d.]+) GB"
                r"|KV size: (?P<kv>[\d.]+) GB)")
MAMBA = re.compile(r"Mamba Cache is allocated\. max_mamba_cache_size: (?P<slots>\d+), "
                   r"conv_state size: (?P<conv>[\d.]+)GB, ssm_state size: (?P<ssm>[\d.]+)GB"
                   r"(?: intermediate_ssm_state_cache size: (?P<iss>[\d.]+)GB "
                   r"intermediate_conv_window_cache size: (?P<icw>[\d.]+)GB)?")
POOL = re.compile(r"Memory pool end\. avail mem=(?P<avail>[\d.]+) GB")
SUMMARY = re.compile(r"max_total_num_tokens=(?P<tokens>\d+), "
                     r"chunked_prefill_size=(?P<chunk>-?\d+), max_prefill_tokens=(?P<prefill>\d+), "
                     r"max_running_requests=(?P<mrr>\d+), "
                     r"context_len=(?P<ctx>\d+), available_(?:gpu|cpu)_mem=(?P<free>[\d.]+) GB")
CAPPED = re.compile(r"max_running_requests is capped to (?P<cap>\d+) by the mamba state cache "
                    r"\(max_mamba_cache_size=(?P<slots>\d+), (?P<per>\d+) state slots per request")
RESERVE_GB = 4.0  # what to leave free for activations and fragmentation when advising


@dataclass
class Capacity:
    kv_tokens: int | None = None
    kv_gb: float | None = None
    weights_gb: float | None = None
    mamba_slots: int | None = None
    mamba_gb: float | None = None
    mamba_intermediate_gb: float = 0.0
    slots_per_request: int | None = None
    max_running_requests: int | None = None
    capped_by_mamba: bool = False
    available_gpu_gb: float | None = None
    context_len: int | None = None
    architecture: str | None = None
    missing: list[str] = field(default_factory=list)


def parse(lines: list[str]) -> Capacity:
    """The last startup's figures (a restart in the same journal replaces earlier ones)."""
    cap = Capacity()
    for line in lines:
        if m := LOAD.search(line):
            cap.weights_gb, cap.architecture = float(m["weights"]), m["arch"]
        elif m := KV.search(line):
            cap.kv_tokens = int(m["tokens"])
            cap.kv_gb = float(m["kv"]) if m["kv"] else float(m["k"]) + float(m["v"])
        elif m := MAMBA.search(line):
            cap.mamba_slots = int(m["slots"])
            cap.mamba_gb = float(m["conv"]) + float(m["ssm"])
            cap.mamba_intermediate_gb = float(m["iss"] or 0) + float(m["icw"] or 0)
        elif m := CAPPED.search(line):
            cap.capped_by_mamba, cap.slots_per_request = True, int(m["per"])
        elif m := SUMMARY.search(line):
            cap.max_running_requests, cap.context_len = int(m["mrr"]), int(m["ctx"])
            cap.available_gpu_gb = float(m["free"])
            cap.kv_tokens = int(m["tokens"])
    cap.missing = [name for name, value in (("KV cache", cap.kv_tokens),
                                            ("max_running_requests", cap.max_running_requests))
                   if value is None]
    return cap


def summary(cap: Capacity) -> str:
    parts = [f"KV tokens {cap.kv_tokens}"]
    if cap.mamba_slots is not None:
        parts.append(f"mamba slots {cap.mamba_slots} ({cap.mamba_gb:.2f} GB"
                     + (f" + {cap.mamba_intermediate_gb:.2f} GB draft state)"
                        if cap.mamba_intermediate_gb else ")"))
    parts += [f"max running requests {cap.max_running_requests}",
              f"GPU memory free {cap.available_gpu_gb:.2f} GB", f"context {cap.context_len}"]
    return ", ".join(parts)


def advice(cap: Capacity, target: int = 48) -> list[str]:
    """What an operator should change, in the profile's terms."""
    out = []
    if (cap.capped_by_mamba and cap.mamba_slots and cap.mamba_gb and cap.slots_per_request
            and cap.available_gpu_gb is not None and cap.max_running_requests is not None):
        # Each running request costs its state slots plus its share of the draft (speculative)
        # intermediate state, which SGLang sizes by the running requests.
        per_slot = cap.mamba_gb / (cap.mamba_slots + 1)
        per_request = (cap.slots_per_request * per_slot
                       + cap.mamba_intermediate_gb / (cap.max_running_requests + 1))
        spare = max(cap.available_gpu_gb - RESERVE_GB, 0.0)
        requests = min(cap.max_running_requests + int(spare / per_request), target)
        slots = requests * cap.slots_per_request
        extra = " with extra_buffer" if cap.slots_per_request >= 4 else ""
        line = (f"max running requests {cap.max_running_requests} is capped by the mamba cache "
                f"({cap.mamba_slots} slots, {cap.slots_per_request} per request{extra}) while "
                f"{cap.available_gpu_gb:.0f} GB is free")
        if slots > cap.mamba_slots:
            line += (f": raise --max-mamba-cache-size to {slots} (memory.max_mamba_cache_size) "
                     f"for up to {slots // cap.slots_per_request} running requests")
        else:
            line += (": lower --mem-fraction-static or raise --mamba-full-memory-ratio "
                     "to give the mamba cache more of the GPU")
        out.append(line)
    return out


def job_time(completions: int, tokens: int, per_request_tps: float, running: int) -> str:
    """How long a job of ``completions`` x ``tokens`` output tokens takes at the measured speed,
    with every slot busy (per-request speed drops as batches grow: an optimistic bound)."""
    if per_request_tps <= 0 or running <= 0:
        return "no speed measured"
    seconds = completions * tokens / (per_request_tps * running)
    return (f"{completions:,} completions of {tokens} tokens: about {seconds / 3600:.1f} h at "
            f"{per_request_tps:.0f} tok/s per request x {running} running requests")
