"""Arguments and startup checks behave as the imitated release's do."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from conftest import MTP, REPO, Launcher, died_of_a_child


def test_removed_flag_exits_2_with_argparse_message(sims: Launcher) -> None:
    result = sims.run(*MTP, "--mamba-scheduler-strategy", "extra_buffer")
    assert result.returncode == 2
    assert "error: unrecognized arguments: --mamba-scheduler-strategy extra_buffer" in \
        result.stderr


def test_ambiguous_prefix_exits_2(sims: Launcher) -> None:
    result = sims.run("--cuda-graph-max-bs", "8")
    assert result.returncode == 2
    assert "ambiguous option: --cuda-graph-max-bs could match" in result.stderr


def test_mistyped_value_exits_2(sims: Launcher) -> None:
    result = sims.run("--tp-size", "two")
    assert result.returncode == 2 and "invalid int value: 'two'" in result.stderr


def test_field_error_on_0_5_12(sims: Launcher) -> None:
    result = sims.run(*MTP, "--mamba-scheduler-strategy", "no_buffer",
                      env={"SGLANG_SIM_VERSION": "0.5.12"})
    assert result.returncode == 1
    assert ("ValueError: Speculative decoding for Qwen3_5ForConditionalGeneration is not "
            "compatible with radix cache when using --mamba-scheduler-strategy no_buffer."
            "To use radix cache with speculative decoding, please use --mamba-scheduler-strategy "
            "extra_buffer and set SGLANG_ENABLE_SPEC_V2=1.") in result.stderr


def test_new_flag_unknown_to_0_5_12(sims: Launcher) -> None:
    result = sims.run("--mamba-radix-cache-strategy", "extra_buffer",
                      env={"SGLANG_SIM_VERSION": "0.5.12"})
    assert result.returncode == 2 and "unrecognized arguments" in result.stderr


def test_no_buffer_with_overlap_on_0_5_23(sims: Launcher) -> None:
    result = sims.run(*MTP, "--mamba-radix-cache-strategy", "no_buffer")
    assert result.returncode == 1
    assert "AssertionError: no_buffer do not support overlap schedule" in result.stderr


def test_unknown_speculative_algorithm(sims: Launcher) -> None:
    result = sims.run("--speculative-algorithm", "MTP")
    assert result.returncode == 1
    assert "ValueError: Unknown speculative algorithm name: MTP" in result.stderr


def test_extra_buffer_with_radix_cache_disabled_0_5_12(sims: Launcher) -> None:
    result = sims.run(*MTP, "--mamba-scheduler-strategy", "extra_buffer",
                      "--disable-radix-cache", env={"SGLANG_SIM_VERSION": "0.5.12"})
    assert result.returncode == 1
    assert "mamba extra_buffer is not compatible with --disable-radix-cache" in result.stderr


@pytest.mark.parametrize(("flags", "env"), [(("--grpc-port", "31000"), {}),
                                           ((), {"SGLANG_GRPC_PORT": "31000"})])
def test_native_grpc_with_a_key_refused_as_sglang_refuses_it(
        sims: Launcher, flags: tuple[str, ...], env: dict[str, str]) -> None:
    result = sims.run(*MTP, *flags, "--api-key", "k", env=env)
    assert result.returncode == 1
    assert ("ValueError: --grpc-port is incompatible with --api-key/--admin-api-key: the native "
            "gRPC listener bypasses HTTP auth middleware.") in result.stderr


def test_native_grpc_beside_http_is_not_imitated(sims: Launcher) -> None:
    """SGLang accepts --grpc-port (0.5.16+); the simulator says it does not serve it rather
    than serve HTTP alone (--smg-grpc-mode is served: test_grpc.py)."""
    result = sims.run(*MTP, "--grpc-port", "31000")
    assert result.returncode == 1 and "gRPC serving beside HTTP" in result.stderr
    assert "is not imitated" in result.stderr and "Traceback" not in result.stderr


def test_no_gpus(sims: Launcher) -> None:
    result = sims.run(env={"PATH": "/usr/bin:/bin"})
    assert result.returncode == 1 and "No CUDA GPUs are available" in result.stderr


def test_more_ranks_than_gpus(sims: Launcher) -> None:
    result = sims.run("--tp-size", "16")
    died_of_a_child(result.stderr, result.returncode, "Scheduler hit an exception", running=False)
    assert "invalid device ordinal" in result.stderr


def test_startup_lines_and_field_capacity(sims: Launcher) -> None:
    """The field's trap: 24 mamba slots with extra_buffer leave room for 4 requests."""
    sim = sims.start(*MTP, "--mamba-radix-cache-strategy", "extra_buffer",
                     "--max-mamba-cache-size", "24")
    log = sim.output()
    assert "Load weight end. elapsed=" in log and "type=Qwen3_5ForConditionalGeneration" in log
    assert "KV Cache is allocated. dtype: torch.bfloat16, #tokens: " in log
    assert "Mamba Cache is allocated. max_mamba_cache_size: 24, " in log
    assert "intermediate_ssm_state_cache size: " in log
    assert "max_running_requests is capped to 4 by the mamba state cache " \
           "(max_mamba_cache_size=24, 5 state slots per request)" in log
    assert ", max_running_requests=4, context_len=262144, available_gpu_mem=" in log
    assert log.index("Memory pool end.") < log.index("The server is fired up and ready to roll!")
    info = sim.client().get("/server_info").json()
    assert info["internal_states"][0]["effective_max_running_requests_per_dp"] == 4
    sim.stop()


def test_state_cache_too_small(sims: Launcher) -> None:
    result = sims.run(*MTP, "--mamba-radix-cache-strategy", "extra_buffer",
                      "--max-mamba-cache-size", "4")
    died_of_a_child(result.stderr, result.returncode, "Scheduler hit an exception", running=False)
    assert "Hybrid (mamba/linear-attention) state cache is too small to serve any requests" in \
        result.stderr + result.stdout


def test_no_buffer_slots_without_spec(sims: Launcher) -> None:
    sim = sims.start("--mamba-radix-cache-strategy", "no_buffer", "--disable-overlap-schedule",
                     "--max-mamba-cache-size", "30")
    assert "max_running_requests is capped to 10 by the mamba state cache " \
           "(max_mamba_cache_size=30, 3 state slots per request)" in sim.output()
    sim.stop()


def test_installed_wheel_carries_its_flag_tables(tmp_path: Path, gpu_bin: Path) -> None:
    """Lab hosts install the simulator from its wheel, as B200 hosts install SGLang."""
    sim_dir = REPO / "lab" / "sglang-sim"
    subprocess.run(["uv", "build", "-q", "--wheel", "-o", str(tmp_path / "dist"), str(sim_dir)],
                   check=True, capture_output=True, timeout=300)
    venv = tmp_path / "venv"
    subprocess.run(["uv", "venv", "-q", str(venv)], check=True, capture_output=True)
    [wheel] = (tmp_path / "dist").glob("sglang_sim-*.whl")
    subprocess.run(["uv", "pip", "install", "-q", "--python", str(venv / "bin" / "python"),
                    str(wheel)], check=True, capture_output=True, timeout=300)
    result = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "sglang_sim.launch_server", "--model-path", "/m",
         "--mamba-scheduler-strategy", "extra_buffer"],
        capture_output=True, text=True, cwd=tmp_path, env={"PATH": f"{gpu_bin}:/usr/bin:/bin"})
    assert result.returncode == 2
    assert "launch_server.py: error: unrecognized arguments: --mamba-scheduler-strategy" in \
        result.stderr


def test_0_5_12_caps_silently_and_logs_kv_without_dtype(sims: Launcher) -> None:
    """Before 0.5.17 the mamba cap is applied without a word; "dtype:" arrives in 0.5.13."""
    sim = sims.start(*MTP, "--mamba-scheduler-strategy", "extra_buffer",
                     "--max-mamba-cache-size", "24", env={"SGLANG_SIM_VERSION": "0.5.12"})
    log = sim.output()
    assert "max_running_requests is capped" not in log
    assert "KV Cache is allocated. #tokens: " in log and "dtype:" not in log
    assert ", max_running_requests=4, context_len=" in log  # 24 slots // 5 per request
    assert "server_args=ServerArgs(" in log
    sim.stop()


def test_draft_worker_logs_its_own_lines_after_the_target(sims: Launcher) -> None:
    sim = sims.start(*MTP, "--mamba-radix-cache-strategy", "extra_buffer")
    log = sim.output()
    target = log.index("type=Qwen3_5ForConditionalGeneration")
    draft = log.index("type=Qwen3_5ForCausalLMMTP")
    assert target < log.index("Mamba Cache is allocated.") < draft
    assert log.count("KV Cache is allocated.") == 2 and log.count("Memory pool end.") == 2
    assert draft < log.index("max_total_num_tokens=")
    assert "server_args={" in log  # 0.5.19+ log the resolved dict
    sim.stop()


def test_lazy_buffer_without_overlap_dies_in_the_memory_pool(sims: Launcher) -> None:
    result = sims.run("--mamba-radix-cache-strategy", "extra_buffer_lazy",
                      "--disable-overlap-schedule")
    died_of_a_child(result.stderr, result.returncode, "Scheduler hit an exception", running=False)
    assert "AssertionError: Lazy extra buffer requires overlap schedule" in result.stderr


def test_drained_server_ends_as_the_release_does(sims: Launcher) -> None:
    """0.5.10 - 0.5.18 SIGKILL their own process tree after draining; 0.5.19+ exit 0."""
    for release, status in (("0.5.18", -9), ("0.5.23", 0)):
        sim = sims.start(env={"SGLANG_SIM_VERSION": release})
        assert sim.stop() == status, release
        assert "Gracefully exiting... Remaining number of requests 0." in sim.output()


def test_draft_state_sizing_follows_the_release(sims: Launcher) -> None:
    """0.5.10 - 0.5.12 reserve the draft's intermediate state for all 48 requested running
    requests, 0.5.13+ for the requests the mamba slots allow (24 // 5 = 4); every release
    allocates it for those 4 (+1), so on 0.5.12 the difference stays free GPU memory."""
    found = {}
    for release, flag in (("0.5.12", "--mamba-scheduler-strategy"),
                          ("0.5.13", "--mamba-scheduler-strategy")):
        sim = sims.start(*MTP, flag, "extra_buffer", "--max-mamba-cache-size", "24",
                         env={"SGLANG_SIM_VERSION": release})
        out = sim.output()
        inter = re.search(r"intermediate_ssm_state_cache size: ([\d.]+)GB "
                          r"intermediate_conv_window_cache size: ([\d.]+)GB", out)
        summary = re.search(r"max_total_num_tokens=(\d+),.* available_gpu_mem=([\d.]+) GB", out)
        assert inter and summary, out
        found[release] = (float(inter.group(1)) + float(inter.group(2)), int(summary.group(1)),
                          float(summary.group(2)))
        sim.stop()
    (inter_12, kv_12, free_12), (inter_13, kv_13, free_13) = found["0.5.12"], found["0.5.13"]
    assert inter_12 == inter_13  # allocated for the same 4 + 1 requests
    reserved_more = inter_13 * (48 - 4) / 5  # 0.5.12 reserved for 48, allocated for 4
    assert kv_12 < kv_13 and free_12 - free_13 == pytest.approx(reserved_more, rel=0.03)


def test_slot_sizing_keeps_one_back_from_0_5_17(sims: Launcher) -> None:
    slots = {}
    for release in ("0.5.16", "0.5.17"):
        sim = sims.start("--mamba-radix-cache-strategy", "no_buffer",
                         "--disable-overlap-schedule", env={"SGLANG_SIM_VERSION": release})
        m = re.search(r"max_mamba_cache_size: (\d+),", sim.output())
        assert m, sim.output()
        slots[release] = int(m.group(1))
        sim.stop()
    assert slots["0.5.16"] == slots["0.5.17"] + 1


def test_graph_capture_lines_follow_the_release(sims: Launcher) -> None:
    """Target capture after its memory pool, the draft's after the draft's pool, then ready;
    each release era in its own words (see sglang_sim.graphs)."""
    words = {"0.5.10": ["Capture cuda graph end. Time elapsed: ",
                        "Capture draft cuda graph end. Time elapsed: ",
                        "Capture draft extend cuda graph end. Time elapsed: "],
             "0.5.14": ["Capture target verify CUDA graph begin. backend=full, "
                        "num_tokens_per_bs=4, bs=[1, 2, ",
                        "Capture draft decode CUDA graph end. elapsed="],
             "0.5.23": ["Capture target verify CUDA graph begin. backend=full, "
                        "num_tokens_per_req=4, avail mem=",
                        "Capture target verify CUDA graph end. bs=[1, 2, ",
                        "Capture draft extend CUDA graph end. elapsed="]}
    for release, expected in words.items():
        sim = sims.start(*MTP, "--disable-radix-cache", env={"SGLANG_SIM_VERSION": release})
        log = sim.output()
        for text in expected:
            assert text in log, (release, text)
        assert log.count("graph end.") == 3, release
        pools = [i for i in range(len(log)) if log.startswith("Memory pool end.", i)]
        capture = log.index("graph begin.")
        assert pools[0] < capture < pools[1] < log.rindex("graph end.") < \
            log.index("max_total_num_tokens=") < log.index("fired up and ready to roll")
        sim.stop()


def test_no_graphs_with_disable_cuda_graph(sims: Launcher) -> None:
    sim = sims.start("--disable-cuda-graph", env={"SGLANG_SIM_VERSION": "0.5.13"})
    assert "Capture" not in sim.output()
    sim.stop()


def test_each_prefill_batch_is_logged_the_warmup_before_ready(sims: Launcher) -> None:
    sim = sims.start(*MTP)
    with sim.client() as c:
        assert c.post("/v1/chat/completions", json={
            "model": "m", "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 4}).status_code == 200
    sim.stop()
    log = sim.output()
    ready = log.index("fired up and ready to roll")
    batches = [i for i in range(len(log)) if log.startswith("Prefill batch, #new-seq: 1, ", i)]
    assert len(batches) == 2 and batches[0] < ready < batches[1]
    assert "full token usage: 0.00, mamba usage: 0.00, #running-req: 1, #queue-req: 0, " \
           "#pending-token: 0, cuda graph: False" in log
