"""The capacity report reads SGLang's real startup line formats (examples from the field)."""

from __future__ import annotations

from sglang_fleet import capacity

FIELD = [
    "[2026-11-30 06:29:24 TP0] Load weight end. elapsed=12.34 s, "
    "type=Qwen3_5ForConditionalGeneration, avail mem=120.50 GB, mem usage=54.10 GB.",
    "[2026-11-30 06:29:24 TP0] max_running_requests is capped to 4 by the mamba state cache "
    "(max_mamba_cache_size=24, 5 state slots per request). To raise it: increase "
    "--mamba-full-memory-ratio or --max-mamba-cache-size, or halve the state size with "
    "--mamba-ssm-dtype bfloat16.",
    "[2026-11-30 06:29:24 TP0] KV Cache is allocated. dtype: torch.bfloat16, #tokens: 77000, "
    "K size: 4.20 GB, V size: 4.20 GB",
    "[2026-11-30 06:29:24 TP0] Mamba Cache is allocated. max_mamba_cache_size: 24, conv_state "
    "size: 0.10GB, ssm_state size: 3.52GB intermediate_ssm_state_cache size: 2.81GB "
    "intermediate_conv_window_cache size: 0.05GB ",
    "[2026-11-30 06:29:24 TP0] Memory pool end. avail mem=30.12 GB",
    "[2026-11-30 06:29:24 TP0] max_total_num_tokens=77000, chunked_prefill_size=8192, "
    "max_prefill_tokens=16384, max_running_requests=4, context_len=262144, "
    "available_gpu_mem=30.12 GB",
]


def test_parse_field_lines() -> None:
    cap = capacity.parse(FIELD)
    assert (cap.kv_tokens, cap.kv_gb, cap.mamba_slots, cap.max_running_requests) == \
        (77000, 8.4, 24, 4)
    assert cap.capped_by_mamba and cap.slots_per_request == 5
    assert cap.available_gpu_gb == 30.12 and cap.context_len == 262144
    assert abs((cap.mamba_gb or 0) - 3.62) < 1e-9 and cap.missing == []


def test_advice_names_the_flag_and_a_size() -> None:
    [line] = capacity.advice(capacity.parse(FIELD))
    assert line.startswith("max running requests 4 is capped by the mamba cache (24 slots, 5 per "
                           "request with extra_buffer) while 30 GB is free: raise "
                           "--max-mamba-cache-size to 120")
    assert "for up to 24 running requests" in line


def test_other_formats() -> None:
    lines = ["KV Cache VA upper bound. dtype: torch.bfloat16, #tokens: 5000, KV size: 1.50 GB",
             "max_total_num_tokens=5000, chunked_prefill_size=-1, max_prefill_tokens=16384, "
             "max_running_requests=48, context_len=4096, available_cpu_mem=10.00 GB"]
    cap = capacity.parse(lines)
    assert (cap.kv_gb, cap.max_running_requests, cap.mamba_slots) == (1.5, 48, None)
    assert capacity.advice(cap) == []
    assert capacity.parse([]).missing == ["KV cache", "max_running_requests"]


def test_job_time() -> None:
    line = capacity.job_time(900_000, 1000, 150.0, 48)
    assert line.startswith("900,000 completions of 1000 tokens: about 34.7 h")
