"""Time to ready in parts, from journal excerpts shaped as each release writes them (the lines
quoted from SGLang's source, see sglang_fleet.remote.readiness) and as ``journalctl -o json`` gives
them: systemd's own "Started" message with its job fields, then the process's lines."""

from __future__ import annotations

import json

from sglang_fleet.remote import readiness

T0 = 1_764_553_482.0  # the journal's time of the "Started" message
STARTED = {"MESSAGE": "Started sglang.service - SGLang server.", "_PID": "1",
           "MESSAGE_ID": readiness.UNIT_STARTED, "JOB_TYPE": "start", "JOB_RESULT": "done"}


def journal(*lines: tuple[float, str]) -> list[str]:
    """``journalctl -o json`` lines: "Started" at T0, then (seconds after T0, SGLang line)."""
    out = [json.dumps({**STARTED, "__REALTIME_TIMESTAMP": str(int(T0 * 1e6))})]
    for offset, text in lines:
        out.append(json.dumps({"__REALTIME_TIMESTAMP": str(int((T0 + offset) * 1e6)),
                               "MESSAGE": text, "_PID": "4242"}))
    return out


def tp0(text: str) -> str:
    return f"[2026-12-01 01:44:43 TP0] {text}"


def timing_of(lines: list[str]) -> readiness.Timing:
    return readiness.parse(readiness.entries(lines))


WARMUP = tp0("Prefill batch, #new-seq: 1, #new-token: 6, #cached-token: 0, full token usage: "
             "0.00, mamba usage: 0.00, #running-req: 0, #queue-req: 0, cuda graph: False, "
             "input throughput (token/s): 0.00")
READY = "[2026-12-01 01:45:13] The server is fired up and ready to roll!"
SMOKE = WARMUP.replace("#running-req: 0", "#running-req: 1")

# 0.5.10: model_runner.py:1247, memory_pool.py:311/696, model_runner_kv_cache_mixin.py:906,
# model_runner.py:2460 (target), eagle_worker.py:257/272 (draft), http_server.py:1929.
R0510 = journal(
    (1.8, "[2026-12-01 01:44:43] server_args=ServerArgs(model_path='/var/lib/sglang/m')"),
    (2.0, tp0("Load weight begin. avail mem=178.10 GB")),
    (6.6, tp0("Load weight end. elapsed=4.58 s, type=Qwen3_5ForConditionalGeneration, "
              "avail mem=124.30 GB, mem usage=53.80 GB.")),
    (7.2, tp0("Mamba Cache is allocated. max_mamba_cache_size: 48, conv_state size: 0.40GB, "
              "ssm_state size: 12.00GB ")),
    (7.6, tp0("KV Cache is allocated. #tokens: 880000, K size: 26.80 GB, V size: 26.80 GB")),
    (7.7, tp0("Memory pool end. avail mem=30.10 GB")),
    (7.9, tp0("Capture cuda graph begin. This can take up to several minutes. avail mem=30.10 "
              "GB")),
    (19.9, tp0("Capture cuda graph end. Time elapsed: 12.00 s. mem usage=0.40 GB. avail "
               "mem=29.70 GB.")),
    (20.2, tp0("Load weight begin. avail mem=29.70 GB")),
    (21.0, tp0("Load weight end. elapsed=0.78 s, type=Qwen3_5ForCausalLMMTP, avail mem=28.40 "
               "GB, mem usage=1.30 GB.")),
    (21.1, tp0("KV Cache is allocated. #tokens: 880000, K size: 0.42 GB, V size: 0.42 GB")),
    (21.2, tp0("Memory pool end. avail mem=27.50 GB")),
    (21.3, tp0("Capture draft cuda graph begin. This can take up to several minutes. avail "
               "mem=27.50 GB")),
    (26.3, tp0("Capture draft cuda graph end. Time elapsed: 5.00 s. mem usage=0.20 GB. avail "
               "mem=27.30 GB.")),
    (29.4, tp0("Capture draft extend cuda graph end. Time elapsed: 3.10 s. mem usage=0.10 GB. "
               "avail mem=27.20 GB.")),
    (29.6, tp0("max_total_num_tokens=880000, chunked_prefill_size=8192, max_prefill_tokens="
               "16384, max_running_requests=48, context_len=262144, available_gpu_mem=27.20 GB")),
    (30.5, "INFO:     Uvicorn running on http://0.0.0.0:30000 (Press CTRL+C to quit)"),
    (31.0, WARMUP),
    (31.5, READY),
    (31.9, SMOKE),
)


def test_0_5_10_parts_from_the_journals_own_time() -> None:
    timing = timing_of(R0510)
    assert timing.mamba
    assert timing.seconds == 31.5
    assert timing.parts() == [("weights", "start", 6.6), ("kv", "weights", 1.1),
                              ("graphs", "kv", 21.7), ("ready", "graphs", 2.1),
                              ("first_generation", "ready", 0.4)]
    assert readiness.describe(timing) == (
        "ready in 31.5 s: start→weights 6.6 s, →KV+mamba 1.1 s, →graphs 21.7 s, →ready 2.1 s, "
        "→first generation 0.4 s")


def test_0_5_13_dense_model_says_kv_only() -> None:
    lines = [line for line in R0510 if "Mamba Cache" not in line and "mamba usage" not in line]
    lines = [line.replace("#tokens: 880000", "dtype: torch.bfloat16, #tokens: 880000")
             for line in lines]  # memory_pool.py: "dtype: " joins the line in 0.5.13
    timing = timing_of(lines)
    assert not timing.mamba
    assert "→KV 1.1 s" in readiness.describe(timing)


# 0.5.23: cuda_graph_setup.py:759/788 (target verify), eagle_worker_v2.py:515/533/634/654
# (draft), kv_cache_configurator.py:499, metrics_reporter.py:754 (with #pending-token).
R0523 = journal(
    (2.5, "[2026-12-01 01:44:44] server_args={'model_path': '/var/lib/sglang/m'}"),
    (3.0, tp0("Load weight begin. avail mem=178.10 GB")),
    (7.6, tp0("Load weight end. elapsed=4.60 s, type=Qwen3_5ForConditionalGeneration, "
              "avail mem=124.30 GB, mem usage=53.80 GB.")),
    (8.1, tp0("KV Cache is allocated. dtype: torch.bfloat16, #tokens: 880000, K size: 26.80 "
              "GB, V size: 26.80 GB")),
    (8.5, tp0("Mamba Cache is allocated. max_mamba_cache_size: 97, conv_state size: 0.80GB, "
              "ssm_state size: 24.00GB intermediate_ssm_state_cache size: 6.00GB "
              "intermediate_conv_window_cache size: 0.20GB ")),
    (8.7, tp0("Memory pool end. avail mem=30.10 GB")),
    (8.8, tp0("Capture target verify CUDA graph begin. backend=full, num_tokens_per_req=4, "
              "avail mem=30.10 GB")),
    (20.8, tp0("Capture target verify CUDA graph end. bs=[1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, "
               "16, 18, 20, 22, 24, 26, 28, 30, 32, 40, 44, 48], elapsed=12.00 s, mem "
               "usage=0.40 GB, avail mem=29.70 GB.")),
    (22.0, tp0("Memory pool end. avail mem=27.50 GB")),
    (85.0, tp0("Capture draft decode CUDA graph end. elapsed=63.00 s, mem usage=0.20 GB, "
               "avail mem=27.30 GB.")),
    (88.0, tp0("Capture draft extend CUDA graph end. elapsed=3.00 s, mem usage=0.10 GB, "
               "avail mem=27.20 GB.")),
    (89.0, WARMUP.replace("cuda graph", "#pending-token: 0, cuda graph")),
    (90.2, READY),
    (91.0, "INFO:     127.0.0.1:40312 - \"GET /health_generate HTTP/1.1\" 200 OK"),
    (91.3, SMOKE.replace("cuda graph", "#pending-token: 0, cuda graph")),
)


def test_0_5_23_the_draft_capture_counts_in_graphs() -> None:
    timing = timing_of(R0523)
    assert [p[2] for p in timing.parts()] == [7.6, 1.1, 79.3, 2.2, 1.1]
    assert readiness.as_json(timing) == {
        "seconds": 90.2, "mamba": True,
        "parts": [{"part": "weights", "from": "start", "seconds": 7.6},
                  {"part": "kv", "from": "weights", "seconds": 1.1},
                  {"part": "graphs", "from": "kv", "seconds": 79.3},
                  {"part": "ready", "from": "graphs", "seconds": 2.2},
                  {"part": "first_generation", "from": "ready", "seconds": 1.1}]}


def test_parts_the_journal_does_not_show_say_so() -> None:
    """--disable-cuda-graph: no capture; no request yet: no first generation."""
    lines = [line for line in R0523[:-1] if "CUDA graph" not in line]
    timing = timing_of(lines)
    assert readiness.describe(timing) == (
        "ready in 90.2 s: start→weights 7.6 s, →KV+mamba 1.1 s, graphs not logged, "
        "KV+mamba→ready 81.5 s, first generation not logged")
    assert readiness.as_json(timing)["parts"][2] == {"part": "graphs", "from": None,
                                                     "seconds": None}


def test_0_5_23_overlapped_weight_loading_is_not_the_weights_mark() -> None:
    """startup_weight_load.py:538 commits the weights after the capture: no weights part."""
    lines = [line.replace("Load weight end. elapsed=4.60 s, type=Qwen3_5ForConditionalGeneration"
                          ", avail mem=124.30 GB, mem usage=53.80 GB.",
                          "Load weight end. Committed real weights after CUDA graph capture in "
                          "0.90 s (capture overlap window 11.10 s, startup overlap total 18.00 s)")
             for line in R0523]
    timing = timing_of(lines)
    assert "weights" not in timing.marks
    assert readiness.describe(timing).startswith(
        "ready in 90.2 s: weights not logged, start→KV+mamba 8.7 s, →graphs 79.3 s")


def test_no_started_message_no_invented_total() -> None:
    timing = timing_of(R0510[1:])
    assert timing.seconds is None
    text = readiness.describe(timing)
    assert text.startswith("ready, start not logged: →weights (no start to measure from), "
                           "→KV+mamba 1.1 s")


def test_a_quiet_log_level_shows_nothing_to_time() -> None:
    timing = timing_of(journal((2.0, "[2026-12-01 01:44:43] a warning")))
    assert readiness.describe(timing).startswith("time to ready not logged: weights not logged")
    assert readiness.as_json(timing)["seconds"] is None


def test_journal_quirks() -> None:
    """MESSAGE as a byte list (not UTF-8), a line that is not JSON, entries out of order."""
    ready = json.dumps({"__REALTIME_TIMESTAMP": str(int((T0 + 5) * 1e6)),
                        "MESSAGE": [*READY.encode(), 0xff]})
    lines = [ready, "-- No entries --", *journal((1.0, tp0(
        "Load weight end. elapsed=0.90 s, type=X, avail mem=1.00 GB, mem usage=1.00 GB.")))]
    timing = timing_of(lines)
    assert timing.marks == {"start": T0, "weights": T0 + 1.0, "ready": T0 + 5}


def tp(rank: int, text: str) -> str:
    return f"[2026-12-01 01:44:43 TP{rank}] {text}"


def test_marks_of_a_tp8_start_are_tp0s() -> None:
    """Eight ranks log their own lines; the marks are TP0's (the rank the capacity report
    shows), not whichever rank logged first, and the old "Load weight end" form counts."""
    lines: list[tuple[float, str]] = []
    for rank in (3, 5, 0, 1, 2, 4, 6, 7):  # TP3 finishes first, TP0 third
        lines.append((4.0 + rank / 10 + (1.0 if rank == 0 else 0.0), tp(
            rank, "Load weight end. type=DeepseekV3ForCausalLM, dtype=torch.bfloat16, avail "
            "mem=80.00 GB, mem usage=90.00 GB.")))
    for rank in range(8):
        lines.append((7.0 + (0.5 if rank == 0 else 0.0), tp(
            rank, "KV Cache is allocated. #tokens: 9000, KV size: 2.00 GB")))
        lines.append((7.1 + (0.5 if rank == 0 else 0.0), tp(
            rank, "Memory pool end. avail mem=10.00 GB")))
    lines.sort()
    lines.append((20.0, "[2026-12-01 01:45:13] The server is fired up and ready to roll!"))
    timing = timing_of(journal(*lines))
    assert timing.marks["weights"] == T0 + 5.0 and timing.marks["kv"] == T0 + 7.6
    assert not timing.mamba
