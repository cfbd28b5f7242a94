"""The capacity reader on lines built from each supported release's own format strings (paths
inside the wheels, sglang/srt/...), for tp 1, 2 and 8, with and without a draft worker, every
rank logging its own lines in an interleaving of its own; and one field at a time on the
variants forks and older releases print."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from sglang_fleet import cli
from sglang_fleet.remote import capacity
from sglang_fleet.stages.gate.host import check_server

RELEASES = ["0.5.10", "0.5.11", "0.5.12", "0.5.13", "0.5.14", "0.5.15", "0.5.16", "0.5.17",
            "0.5.18", "0.5.19", "0.5.20", "0.5.21", "0.5.22", "0.5.23"]
TARGET, DRAFT = "Qwen3_5ForConditionalGeneration", "Qwen3_5ForCausalLMMTP"


def release(version: str) -> tuple[int, ...]:
    return tuple(int(x) for x in version.split("."))


def prefix(rank: int, tp: int, dp: int | None = None) -> str:
    """managers/scheduler.py: " DP{d}" when dp is set, " TP{t}" when tp_size > 1;
    utils/common.py configure_logger: "[%(asctime)s{prefix}] "."""
    ranks = (f" DP{dp}" if dp is not None else "") + (f" TP{rank}" if tp > 1 else "")
    return f"[2026-11-30 06:29:{rank:02d}{ranks}] "


def load_end(arch: str, usage: float) -> str:
    # model_executor/model_runner.py, 0.5.10 - 0.5.23 (quant_str only for a quantized model)
    return (f"Load weight end. elapsed={12.34:.2f} s, type={arch}, avail mem={120.5:.2f} GB, "
            f"mem usage={usage:.2f} GB.")


def kv_line(version: str, tokens: int, gb: float) -> str:
    # mem_cache/memory_pool.py: "dtype: " from 0.5.13 (_finalize_allocation_log in 0.5.19+)
    dtype = "dtype: torch.bfloat16, " if release(version) >= (0, 5, 13) else ""
    return (f"KV Cache is allocated. {dtype}#tokens: {tokens}, K size: {gb / 2:.2f} GB, "
            f"V size: {gb / 2:.2f} GB")


def mamba_line(slots: int, draft_state: bool) -> str:
    # mem_cache/memory_pool.py MambaPool: the intermediate caches with speculative decoding
    line = (f"Mamba Cache is allocated. max_mamba_cache_size: {slots}, conv_state size: "
            f"{0.10:.2f}GB, ssm_state size: {3.52:.2f}GB ")
    if draft_state:
        line += (f"intermediate_ssm_state_cache size: {2.81:.2f}GB "
                 f"intermediate_conv_window_cache size: {0.05:.2f}GB ")
    return line


def capped_line(cap: int, slots: int, per: int) -> str:
    # mem_cache/kv_cache_configurator.py (0.5.17+)
    return (f"max_running_requests is capped to {cap} by the mamba state cache "
            f"(max_mamba_cache_size={slots}, {per} state slots per request). To raise it: "
            "increase --mamba-full-memory-ratio or --max-mamba-cache-size, or halve the state "
            "size with --mamba-ssm-dtype bfloat16.")


def summary_line(tokens: int, mrr: int, free: float) -> str:
    # managers/scheduler.py, logged by tp_rank 0 only
    return (f"max_total_num_tokens={tokens}, chunked_prefill_size=8192, "
            f"max_prefill_tokens=16384, max_running_requests={mrr}, context_len=262144, "
            f"available_gpu_mem={free:.2f} GB")


def rank_lines(version: str, rank: int, tp: int, draft: bool) -> list[str]:
    """One rank's startup, in the order its process logs it."""
    per_rank = 77000  # every rank ends with the same pool (the minimum over the group)
    lines = [load_end(TARGET, 54.1 / tp)]
    if draft and release(version) >= (0, 5, 17):
        lines.append(capped_line(4, 24, 5))
    lines += [kv_line(version, per_rank, 8.4 / tp), mamba_line(24, draft),
              "Memory pool end. avail mem=31.00 GB",
              "Capture cuda graph begin. This can take up to several minutes. avail mem=30.9 GB"]
    if draft:
        lines += [load_end(DRAFT, 0.4), kv_line(version, per_rank, 0.1),
                  "Memory pool end. avail mem=30.12 GB"]
    if rank == 0:
        lines.append(summary_line(per_rank, 4 if draft else 48, 30.12))
    return [prefix(rank, tp) + line for line in lines]


def interleave(per_rank: list[list[str]], seed: int) -> list[str]:
    """The journal of several processes: each rank's own order kept, the ranks mixed."""
    rng, queues, out = random.Random(seed), [list(q) for q in per_rank], []
    while any(queues):
        queue = rng.choice([q for q in queues if q])
        out.append(queue.pop(0))
    return out


def startup(version: str, tp: int, draft: bool, seed: int = 0) -> list[str]:
    args = ("server_args=ServerArgs(model_path='/m', mamba_scheduler_strategy='extra_buffer', "
            "disable_radix_cache=False, disable_overlap_schedule=False, "
            "max_running_requests=None, speculative_algorithm="
            + ("'EAGLE')" if draft else "None)"))
    return [f"[2026-11-30 06:29:00] {args}", *interleave(
        [rank_lines(version, r, tp, draft) for r in range(tp)], seed),
        "[2026-11-30 06:29:40] The server is fired up and ready to roll!"]


@pytest.mark.parametrize("version", RELEASES)
@pytest.mark.parametrize("tp", [1, 2, 8])
@pytest.mark.parametrize("draft", [False, True])
def test_every_release_tp_and_draft(version: str, tp: int, draft: bool) -> None:
    cap = capacity.parse(startup(version, tp, draft, seed=tp * 31 + len(version)), version)
    assert cap.state == capacity.COMPLETE and cap.missing == [] and cap.rank_notes == []
    assert (cap.rank, len(cap.ranks)) == ("TP0" if tp > 1 else "", tp)
    assert (cap.architecture, cap.kv_tokens, cap.mamba_slots) == (TARGET, 77000, 24)
    assert cap.kv_gb == pytest.approx(8.4 / tp, abs=0.011) and cap.pool_end_gb == 31.0
    assert cap.weights_gb == pytest.approx(54.1 / tp, abs=0.006)
    if not draft:
        assert cap.draft is None and cap.max_running_requests == 48
        assert cap.mamba_intermediate_gb == 0.0 and capacity.advice(cap) == []
        return
    assert cap.draft is not None and cap.draft.architecture == DRAFT
    assert (cap.draft.kv_tokens, cap.draft.kv_gb, cap.draft.pool_end_gb) == (77000, 0.1, 30.12)
    assert cap.mamba_intermediate_gb == pytest.approx(2.86)
    assert cap.capped_by_mamba and cap.slots_per_request == 5 and cap.max_running_requests == 4
    assert cap.cap_inferred == (release(version) < (0, 5, 17))
    [line] = capacity.advice(cap)
    assert "--max-mamba-cache-size 120" in line
    assert any(x.startswith("advice: ") for x in capacity.report(cap))


@pytest.mark.parametrize("seed", range(6))
def test_any_interleaving_of_eight_ranks_reads_the_same(seed: int) -> None:
    """The order of "Load weight end" lines across ranks says nothing: TP3's draft may load
    before TP0's target has logged its KV cache."""
    cap = capacity.parse(startup("0.5.23", 8, True, seed), "0.5.23")
    assert (cap.kv_tokens, cap.mamba_slots, cap.max_running_requests) == (77000, 24, 4)
    assert cap.draft is not None and cap.draft.pool_end_gb == 30.12 and cap.pool_end_gb == 31.0


@pytest.mark.parametrize(("prefix_text", "rank"), [
    ("[2026-11-30 06:29:24 TP3] ", "TP3"),
    ("[2026-11-30 06:29:24 DP1 TP3] ", "DP1 TP3"),
    ("[2026-11-30 06:29:24 PP0 TP1 EP1] ", "PP0 TP1 EP1"),
    ("[2026-11-30 06:29:24 DP0 PP1 ATTN_CP0 MOE_DP0 TP2 EP2] ",
     "DP0 PP1 ATTN_CP0 MOE_DP0 TP2 EP2"),
    ("[2026-11-30 06:29:24.123 TP0] ", "TP0"),  # SGLANG_LOG_MS
    ("[06:29:24 TP7] ", "TP7"),  # releases before 0.4: the time alone
    ("[2026-11-30 06:29:24 NODE1 TP9] ", "NODE1 TP9"),  # a node rank, as forks print it
    ("[2026-11-30 06:29:24 encode_dp_worker[0]] ", "encode_dp_worker[0]"),
    ("Nov 30 06:29:24 b200-01 python[4242]: [2026-11-30 06:29:24 DP1 TP3] ", "DP1 TP3"),
    ("2026-11-30T06:29:24.5Z stdout F [2026-11-30 06:29:24 TP1] ", "TP1"),  # a container's
    ("[2026-11-30 06:29:24] ", ""),
])
def test_rank_prefixes(prefix_text: str, rank: str) -> None:
    assert capacity.split_prefix(prefix_text + "Memory pool end. avail mem=1.00 GB") == \
        (rank, "Memory pool end. avail mem=1.00 GB")


def test_dp_attention_ranks_take_dp0_tp0() -> None:
    lines = [prefix(t, 2, dp=d) + x for d in (1, 0) for t in (1, 0)
             for x in (load_end("DeepseekV3ForCausalLM", 80.0), kv_line("0.5.23", 9000, 2.0),
                       "Memory pool end. avail mem=10.00 GB")]
    lines.append(prefix(0, 2, dp=0) + summary_line(9000, 64, 10.0))
    cap = capacity.parse(lines, "0.5.23")
    assert cap.rank == "DP0 TP0" and len(cap.ranks) == 4 and cap.draft is None
    assert (cap.kv_tokens, cap.max_running_requests, cap.rank_notes) == (9000, 64, [])


def test_ranks_that_differ_are_named() -> None:
    lines = startup("0.5.23", 2, False)
    lines = [x.replace("#tokens: 77000", "#tokens: 76000") if " TP1]" in x else x
             for x in lines]
    cap = capacity.parse(lines, "0.5.23")
    assert cap.kv_tokens == 77000  # TP0's summary
    assert cap.rank_notes == ["KV tokens differ between ranks (TP0 77000, TP1 76000): the "
                              "report shows TP0's"]
    assert "ranks: KV tokens differ" in "\n".join(capacity.report(cap))


# ---- one field at a time ------------------------------------------------------------------
def test_summary_of_a_fork_without_prefill_and_running_fields() -> None:
    cap = capacity.parse(["[2026-11-30 06:29:24 TP0] max_total_num_tokens=5000, "
                          "chunked_prefill_size=8192, context_len=4096, "
                          "available_gpu_mem=10.00 GB"])
    assert (cap.kv_tokens, cap.context_len, cap.available_gpu_gb) == (5000, 4096, 10.0)
    assert cap.max_running_requests is None and cap.chunked_prefill_size == 8192
    assert "max_running_requests" in cap.missing and "KV cache" not in cap.missing


def test_summary_of_an_old_release_without_available_gpu_mem() -> None:
    cap = capacity.parse(["[2024-10-22 06:31:49 TP0] max_total_num_tokens=409600, "
                          "max_prefill_tokens=16384, max_running_requests=2049, "
                          "context_len=131072"])
    assert (cap.kv_tokens, cap.max_running_requests, cap.max_prefill_tokens) == \
        (409600, 2049, 16384)
    assert cap.available_gpu_gb is None and cap.missing == ["weights", "available GPU memory"]


def test_bench_one_batch_prints_the_tokens_alone() -> None:
    cap = capacity.parse(["max_total_num_tokens=123456"])
    assert cap.kv_tokens == 123456 and cap.state == capacity.COMPLETE


def test_tokens_named_inside_another_message_are_not_the_summary() -> None:
    # mem_cache/kv_cache_configurator.py 0.5.23 asserts with this text
    cap = capacity.parse(["AssertionError: unified allocator virtual space smaller than the "
                          "token budget: virtual_id_space=10 < max_total_num_tokens=20"])
    assert cap.kv_tokens is None and cap.state == capacity.NOT_A_LOG


def test_load_weight_end_without_elapsed_and_a_draft_by_its_class() -> None:
    """The form older releases and NPU builds print; the draft told apart by its class, even
    when its "Load weight end" comes first on a rank."""
    lines = ["[2026-01-04 03:36:55 TP0] Load weight end. type=Qwen3NextForCausalLMMTP, "
             "dtype=torch.bfloat16, avail mem=60.00 GB, mem usage=1.20 GB.",
             "[2026-01-04 03:36:55 TP1] Load weight end. type=Qwen3NextForCausalLM, "
             "dtype=torch.bfloat16, avail mem=29.60 GB, mem usage=31.01 GB.",
             "[2026-01-04 03:36:56 TP1] KV Cache is allocated. #tokens: 143104, K size: 8.74 GB, "
             "V size: 8.74 GB"]
    cap = capacity.parse(lines)
    assert (cap.rank, cap.architecture, cap.weights_gb) == ("TP0", "Qwen3NextForCausalLM", 31.01)
    assert cap.kv_tokens == 143104  # TP0 logged no KV line before the cut: TP1's
    assert cap.draft is not None and cap.draft.architecture == "Qwen3NextForCausalLMMTP"


def test_load_weight_end_without_mem_usage() -> None:
    cap = capacity.parse(["[23:17:01 TP7] Load weight end. type=DeepseekV2ForCausalLM, "
                          "dtype=torch.bfloat16, avail mem=22.01 GB"])
    assert (cap.architecture, cap.weights_gb, cap.rank) == ("DeepseekV2ForCausalLM", None, "TP7")


def test_committed_weights_line_is_no_worker() -> None:
    # model_runner_components/startup_weight_load.py (0.5.18+): no type, no figures
    lines = [load_end(TARGET, 54.1), "Load weight end. Committed real weights after CUDA graph "
             "capture in 3.10 s (capture overlap window 2.00 s, startup overlap total 9.00 s)"]
    cap = capacity.parse(lines)
    assert cap.architecture == TARGET and cap.draft is None


def test_cap_line_alone_gives_the_slots_and_the_advice() -> None:
    lines = [prefix(0, 2) + x for x in (load_end(TARGET, 27.0), capped_line(4, 24, 5),
                                        kv_line("0.5.17", 77000, 4.2),
                                        "Memory pool end. avail mem=31.00 GB",
                                        summary_line(77000, 4, 30.12))]
    cap = capacity.parse(lines, "0.5.17")
    assert (cap.mamba_slots, cap.slots_per_request, cap.mamba_gb) == (24, 5, None)
    [line] = capacity.advice(cap)
    assert line.startswith("max running requests 4 is capped by the mamba cache (24 slots, 5 per "
                           "request; logged): for 48 running requests use "
                           "--max-mamba-cache-size 240")


def test_no_advice_when_the_target_is_met() -> None:
    lines = startup("0.5.17", 1, True)
    cap = capacity.parse(lines, "0.5.17")
    assert capacity.advice(cap, target=4) == [] and len(capacity.advice(cap, target=48)) == 1
    spare = capacity.parse([x.replace("30.12 GB", "4.00 GB") for x in lines], "0.5.17")
    [line] = capacity.advice(spare, target=8)
    assert "no spare memory" in line  # below the target, no memory: the fraction is the lever


def test_swa_pools_add_up() -> None:
    # 0.5.19+ labels the pools of a hybrid SWA model "Full" and "SWA"
    lines = ["Full KV Cache is allocated. dtype: torch.bfloat16, #tokens: 1496958, K size: 4.82 "
             "GB, V size: 3.21 GB", "SWA KV Cache is allocated. dtype: torch.bfloat16, #tokens: "
             "2993916, K size: 41.76 GB, V size: 27.84 GB", "Memory pool end. avail mem=22.56 GB"]
    cap = capacity.parse(lines)
    assert cap.kv_tokens == 1496958 and cap.kv_gb == pytest.approx(77.63)


def test_post_capture_resize_replaces_the_pools() -> None:
    # model_runner_components/kv_pool_runtime.py (0.5.17+)
    lines = [load_end(TARGET, 54.1),
             "KV Cache VA upper bound. dtype: torch.bfloat16, #tokens: 90000, KV size: 9.00 GB",
             "Memory pool end. avail mem=40.00 GB", load_end(DRAFT, 0.4),
             "KV Cache VA upper bound. dtype: torch.bfloat16, #tokens: 90000, KV size: 0.20 GB",
             "Memory pool end. avail mem=39.00 GB",
             "Post-capture KV sizing: KV cache allocated. dtype: torch.bfloat16, #tokens: 80000, "
             "KV size: 8.00 GB, avail mem=31.00 GB",
             "Post-capture KV sizing: draft KV cache allocated. dtype: torch.bfloat16, "
             "#tokens: 80000, KV size: 0.10 GB"]
    cap = capacity.parse(lines)
    assert (cap.kv_tokens, cap.kv_gb) == (80000, 8.0)
    assert cap.draft is not None and (cap.draft.kv_tokens, cap.draft.kv_gb) == (80000, 0.1)


def test_restart_without_server_args_line() -> None:
    first = startup("0.5.23", 2, False)[1:]
    second = [x.replace("77000", "90000") for x in first]
    cap = capacity.parse(first + second, "0.5.23")
    assert cap.kv_tokens == 90000 and len(cap.ranks) == 2 and cap.draft is None


def test_gate_and_command_print_the_same_report_for_tp8(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The gate reads the live journal (journalctl -o cat) with the same reader and report:
    a tp 8 server gets its capacity line and its advice, the same as the command's."""
    lines = startup("0.5.12", 8, True, seed=3)
    log = tmp_path / "journal.txt"
    log.write_text("\n".join(lines) + "\n")
    assert cli.main(["capacity", str(log), "--sglang-version", "0.5.12"]) == 0
    printed = capsys.readouterr().out.splitlines()
    gate = check_server.capacity_lines(capacity.parse(lines, "0.5.12"))
    assert printed == gate
    assert gate[0].startswith("capacity: KV tokens 77000, mamba slots 24 (3.62 GB + 2.86 GB "
                              "draft state), max running requests 4")
    assert gate[0].endswith("figures of TP0 (8 ranks logged)")
    assert gate[1].startswith("advice: max running requests 4 is capped by the mamba cache")
    assert check_server.capacity_lines(capacity.parse([])) == [
        "capacity: no startup line in this invocation's journal"]
