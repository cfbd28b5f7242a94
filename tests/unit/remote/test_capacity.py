"""The capacity report reads SGLang's real startup line formats (examples from the field)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from sglang_fleet import cli
from sglang_fleet.cli import server_commands
from sglang_fleet.remote import capacity

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
                           "request; logged) while 30 GB is free: for up to 24 running requests "
                           "use --max-mamba-cache-size 120 (memory.max_mamba_cache_size)")
    assert "--mamba-ssm-dtype bfloat16 (about 48 slots" in line


def test_other_formats() -> None:
    lines = ["KV Cache VA upper bound. dtype: torch.bfloat16, #tokens: 5000, KV size: 1.50 GB",
             "max_total_num_tokens=5000, chunked_prefill_size=-1, max_prefill_tokens=16384, "
             "max_running_requests=48, context_len=4096, available_cpu_mem=10.00 GB"]
    cap = capacity.parse(lines)
    assert (cap.kv_gb, cap.max_running_requests, cap.mamba_slots) == (1.5, 48, None)
    assert capacity.advice(cap) == []
    assert capacity.parse([]).missing == ["weights", "KV cache", "max_running_requests",
                                          "context_len", "available GPU memory"]


# Log lines built with each release's own format strings (paths are inside the wheel).
def load_end(arch: str, avail: float, usage: float) -> str:
    # model_executor/model_runner.py (0.5.10 - 0.5.23)
    return (f"Load weight end. elapsed={12.34:.2f} s, type={arch}, avail mem={avail:.2f} GB, "
            f"mem usage={usage:.2f} GB.")


def kv_line(version: str, tokens: int, k: float, v: float, label: str | None = None) -> str:
    # mem_cache/memory_pool.py: no dtype before 0.5.13; a label from 0.5.19
    name = f"{label} KV Cache" if label else "KV Cache"
    dtype = "dtype: torch.bfloat16, " if version >= "0.5.13" else ""
    return f"{name} is allocated. {dtype}#tokens: {tokens}, K size: {k:.2f} GB, V size: {v:.2f} GB"


def mamba_line(slots: int) -> str:
    # mem_cache/memory_pool.py, with speculative decoding
    return (f"Mamba Cache is allocated. max_mamba_cache_size: {slots}, conv_state size: "
            f"{0.10:.2f}GB, ssm_state size: {3.52:.2f}GB intermediate_ssm_state_cache size: "
            f"{2.81:.2f}GB intermediate_conv_window_cache size: {0.05:.2f}GB ")


def summary_line(tokens: int, mrr: int, free: float) -> str:
    # managers/scheduler.py
    return (f"max_total_num_tokens={tokens}, chunked_prefill_size=16384, "
            f"max_prefill_tokens=16384, max_running_requests={mrr}, context_len=262144, "
            f"available_gpu_mem={free:.2f} GB")


def journal(lines: list[str]) -> list[str]:
    """As journalctl prints them: a journal prefix, then SGLang's own '[time TP0] '."""
    return [f"Nov 30 06:29:24 b200-01 python[4242]: [2026-11-30 06:29:24 TP0] {x}" for x in lines]


SERVER_ARGS_0_5_12 = ("server_args=ServerArgs(model_path='/var/lib/sglang/models/q', "
                      "mamba_scheduler_strategy='extra_buffer', disable_radix_cache=False, "
                      "disable_overlap_schedule=False, max_running_requests=None, "
                      "mamba_ssm_dtype=None, mamba_full_memory_ratio=0.9, "
                      "speculative_algorithm='EAGLE')")


def field_0_5_12() -> list[str]:
    """The field's case: 24 mamba slots -> 4 running requests, 30 GB free, nothing said."""
    return journal([
        SERVER_ARGS_0_5_12,
        load_end("Qwen3_5ForConditionalGeneration", 120.50, 54.10),
        kv_line("0.5.12", 77000, 4.20, 4.20), mamba_line(24),
        "Memory pool end. avail mem=31.00 GB",
        load_end("Qwen3_5ForCausalLMMTP", 30.50, 0.40),
        kv_line("0.5.12", 77000, 0.05, 0.05), "Memory pool end. avail mem=30.12 GB",
        summary_line(77000, 4, 30.12)])


def test_mamba_cap_inferred_where_the_release_prints_none() -> None:
    cap = capacity.parse(field_0_5_12(), "0.5.12")
    assert (cap.kv_tokens, cap.kv_gb, cap.weights_gb) == (77000, 8.4, 54.1)  # the main worker
    assert cap.architecture == "Qwen3_5ForConditionalGeneration"
    assert cap.draft is not None and cap.draft.architecture == "Qwen3_5ForCausalLMMTP"
    assert cap.draft.kv_gb == 0.1 and cap.draft.pool_end_gb == 30.12
    assert cap.capped_by_mamba and cap.cap_inferred and cap.slots_per_request == 5
    [line] = capacity.advice(cap)
    assert "inferred: this release does not log the cap" in line
    assert "--max-mamba-cache-size 120" in line and "--mamba-ssm-dtype bfloat16" in line
    assert "lower --mem-fraction-static" not in line


def test_no_inference_without_the_strategy_when_ambiguous() -> None:
    lines = [x for x in field_0_5_12() if "server_args=" not in x]
    lines = [x.replace("max_running_requests=4", "max_running_requests=6") for x in lines]
    cap = capacity.parse(lines, "0.5.12")  # 24 // 4 == 6: only lazy/no-overlap fits
    assert cap.capped_by_mamba and cap.slots_per_request == 4
    lines = [x.replace("max_running_requests=6", "max_running_requests=7") for x in lines]
    assert not capacity.parse(lines, "0.5.12").capped_by_mamba  # no ratio gives 7


def test_asked_for_limit_is_not_a_cap() -> None:
    lines = [x.replace("max_running_requests=None", "max_running_requests=4")
             for x in field_0_5_12()]
    assert not capacity.parse(lines, "0.5.12").capped_by_mamba


def test_kv_line_without_dtype_gives_the_size() -> None:
    cap = capacity.parse(journal([kv_line("0.5.10", 5000, 0.75, 0.75),
                                  summary_line(5000, 48, 10.0)]), "0.5.10")
    assert cap.kv_gb == 1.5 and cap.kv_tokens == 5000


def test_0_5_23_labelled_kv_and_logged_cap() -> None:
    lines = journal([
        "server_args={'model_path': '/m', 'mamba_radix_cache_strategy': 'extra_buffer', "
        "'disable_overlap_schedule': False, 'disable_radix_cache': False, "
        "'max_running_requests': None, 'mamba_full_memory_ratio': 0.9}",
        load_end("Qwen3_5ForConditionalGeneration", 120.5, 54.1),
        "max_running_requests is capped to 4 by the mamba state cache (max_mamba_cache_size=24, "
        "5 state slots per request). To raise it: increase --mamba-full-memory-ratio or "
        "--max-mamba-cache-size, or halve the state size with --mamba-ssm-dtype bfloat16.",
        kv_line("0.5.23", 77000, 4.2, 4.2, label="Target"), mamba_line(24),
        "Memory pool end. avail mem=31.00 GB", summary_line(77000, 4, 30.12)])
    cap = capacity.parse(lines, "0.5.23")
    assert cap.kv_gb == 8.4 and cap.capped_by_mamba and not cap.cap_inferred
    assert cap.server_args["mamba_radix_cache_strategy"] == "extra_buffer"


def test_kv_capped_limit_is_named() -> None:
    lines = journal([
        load_end("LlamaForCausalLM", 120.5, 14.1), kv_line("0.5.19", 9000, 0.5, 0.5),
        "max_running_requests was reduced from the requested 256 to 64 (per dp worker) due to "
        "the available KV cache capacity.",
        summary_line(9000, 64, 20.0)])
    cap = capacity.parse(lines, "0.5.19")
    assert cap.capped_by_kv and cap.requested_running_requests == 256
    [line] = capacity.advice(cap, target=128)
    assert line.startswith("max running requests 64 is capped by the KV cache (requested 256")
    assert capacity.advice(cap, target=64) == []  # the target is met: nothing to raise


def test_a_restart_replaces_the_earlier_startup() -> None:
    first = field_0_5_12()
    second = [x.replace("77000", "90000") for x in field_0_5_12()]
    cap = capacity.parse(first + second, "0.5.12")
    assert cap.kv_tokens == 90000 and cap.draft is not None and cap.draft.kv_tokens == 90000


def test_capacity_command(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                          monkeypatch: pytest.MonkeyPatch) -> None:
    log = tmp_path / "journal.txt"
    log.write_text("\n".join(field_0_5_12()) + "\n")
    assert cli.main(["capacity", str(log), "--sglang-version", "0.5.12"]) == 0
    out = capsys.readouterr().out
    assert "capacity: KV tokens 77000" in out and "advice: max running requests 4" in out
    monkeypatch.setattr("sys.stdin", io.StringIO(log.read_text()))
    assert cli.main(["capacity", "-", "--json", "--sglang-version", "0.5.12"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["capped_by_mamba"] and report["draft"]["architecture"].endswith("MTP")
    assert cli.main(["capacity", str(tmp_path / "missing")]) == 1
    assert "cannot read" in capsys.readouterr().err
    (tmp_path / "empty").write_text("hello\n")
    assert cli.main(["capacity", str(tmp_path / "empty")]) == 1


def test_ratio_lever_when_a_ratio_can_reach_it() -> None:
    """With 6 GB free, one more request fits: 25 slots, a mamba share of 0.9/1.9 * 25/24 of the
    pool, i.e. --mamba-full-memory-ratio 0.97 (0.9 gives 24)."""
    lines = [x.replace("30.12 GB", "6.00 GB") for x in field_0_5_12()]
    [line] = capacity.advice(capacity.parse(lines, "0.5.12"))
    assert "for up to 5 running requests use --max-mamba-cache-size 25" in line
    assert "--mamba-full-memory-ratio 0.97 (mamba.full_memory_ratio; now 0.9" in line


def cut_in_capture() -> list[str]:
    """A tp 2 start that died while capturing CUDA graphs: pools logged, no summary."""
    lines = []
    for rank in (0, 1):
        lines += [f"[2026-11-30 06:29:24 TP{rank}] {x}" for x in (
            load_end("Qwen3_5ForConditionalGeneration", 120.50, 27.05),
            kv_line("0.5.12", 77000, 2.10, 2.10), mamba_line(24),
            "Memory pool end. avail mem=31.00 GB",
            "Capture cuda graph begin. This can take up to several minutes. avail mem=30.9 GB")]
    return [*lines, "[2026-11-30 06:29:30 TP1] Scheduler hit an exception: Traceback (most "
            "recent call last):", '  File "/sglang/srt/model_executor/cuda_graph_runner.py", '
            "line 310, in capture", "torch.OutOfMemoryError: CUDA out of memory. Tried to "
            "allocate 2.00 GiB", "[2026-11-30 06:29:31] Received sigquit from a child process. "
            "It usually means the child failed."]


def test_partial_report_of_a_log_cut_in_capture() -> None:
    cap = capacity.parse(cut_in_capture(), "0.5.12")
    assert cap.state == capacity.PARTIAL and (cap.kv_tokens, cap.mamba_slots) == (77000, 24)
    assert cap.pool_end_gb == 31.0 and cap.kv_gb == 4.2 and cap.weights_gb == 27.05
    assert cap.missing == ["max_running_requests", "context_len", "available GPU memory"]
    assert cap.error == ("Scheduler hit an exception: torch.OutOfMemoryError: CUDA out of "
                         "memory. Tried to allocate 2.00 GiB")
    lines = capacity.report(cap)
    assert lines[0].startswith("capacity (partial: the log ends before the server was up): "
                               "KV tokens 77000, mamba slots 24 (3.62 GB + 2.86 GB draft state),"
                               " max running requests not logged")
    assert lines[1:] == ["missing: max_running_requests, context_len, available GPU memory",
                         "last error: " + cap.error]


def test_capacity_command_statuses(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "cut.log"
    log.write_text("\n".join(cut_in_capture()) + "\n")
    assert cli.main(["capacity", str(log)]) == server_commands.CAPACITY_PARTIAL == 4
    out = capsys.readouterr().out
    assert out.startswith("capacity (partial") and "last error: Scheduler hit" in out
    assert cli.main(["capacity", str(log), "--json"]) == 4
    assert json.loads(capsys.readouterr().out)["state"] == "partial"
    (tmp_path / "empty").write_text("hello\n")
    assert cli.main(["capacity", str(tmp_path / "empty"), "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["state"] == "not a startup log"
    assert cli.main(["capacity", str(log), "--sglang-version", "0.4.9"]) == 2  # usage
    err = capsys.readouterr().err
    assert err.startswith("usage: sglang-fleet capacity")
    assert "--sglang-version: SGLang 0.4.9 is not a supported release" in err
