"""--smg-grpc-mode: the simulator serves SglangScheduler as smg-grpc-servicer 0.14.1 does for
SGLang 0.5.20+ (sglang_sim/grpc_mode.py, grpc_servicer.py), and the real gateway (smg, the
release the product pins) routes chat to it over gRPC with the tokenizer the worker sends."""

from __future__ import annotations

import io
import os
import signal
import socket
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import grpc
import httpx
import pytest
from conftest import (
    GRPC,
    MODEL,
    NO_PLANNED_WARMUP,
    Launcher,
    Sim,
    free_port,
    generate,
    grpc_port,
    sidecar,
    target,
    wait_serving,
)
from sglang_sim.tokenizer import Tokenizer
from smg_grpc_proto import sglang_scheduler_pb2 as pb
from smg_grpc_proto import sglang_scheduler_pb2_grpc as pb_grpc
from smg_grpc_proto.generated import common_pb2


def test_start_up_is_the_servicers_and_no_http_is_served(grpc_sim: Sim) -> None:
    out = grpc_sim.output()
    order = ["Servicer implementation: python (source=default)",
             "Launching scheduler process(es)...", "GrpcRequestManager initialized with ZMQ IPC",
             "server_args=ServerArgs(", "Load weight begin.",
             "All 1 scheduler process(es) initialized successfully",
             "HTTP sidecar server started on http://127.0.0.1:",
             "Standard gRPC health service initialized", "gRPC scheduler servicer initialized",
             "gRPC server listening on 127.0.0.1:", "Sending warmup request to gRPC server...",
             "gRPC warmup request completed successfully",
             "Planned warm-up off (SMG_SGLANG_SERVICER_WARMUP=off)",
             "Health service status set to SERVING", "The server is fired up and ready to roll!"]
    at = [out.index(line) for line in order]
    assert at == sorted(at), out
    with pytest.raises(httpx.HTTPError):
        httpx.get(grpc_sim.url + "/health", timeout=3)
    assert "sglang:num_running_reqs" in httpx.get(sidecar(grpc_sim) + "/metrics").text
    assert httpx.get(sidecar(grpc_sim) + "/health").status_code == 404
    # no detokenizer in gRPC mode: the schedulers alone
    assert "sglang::detokenizer" not in subprocess.run(
        ["ps", "-o", "args=", "--ppid", str(grpc_sim.proc.pid)], capture_output=True,
        text=True).stdout


def test_model_and_server_info_are_the_raw_arguments_and_ready_report(
        stub: pb_grpc.SglangSchedulerStub) -> None:
    info = stub.GetModelInfo(pb.GetModelInfoRequest())
    server = stub.GetServerInfo(pb.GetServerInfoRequest())
    assert info.model_path == str(MODEL) and info.tokenizer_path == str(MODEL)
    assert info.vocab_size == 128256 and list(info.eos_token_ids) == []
    assert info.max_context_length == server.max_total_num_tokens  # the KV pool, not context
    assert info.max_req_input_len == server.scheduler_info["max_req_input_len"]
    assert info.architectures == ["Qwen3_5ForConditionalGeneration"]
    assert server.server_type == "grpc" and server.sglang_version
    assert server.server_args["chunked_prefill_size"] is None  # raw: not given
    assert server.server_args["max_running_requests"] > 0  # the scheduler's window


def test_generate_streams_increments_then_a_complete(stub: pb_grpc.SglangSchedulerStub) -> None:
    tok = Tokenizer.load(str(MODEL))
    assert tok is not None
    prompt = tok.encode("<|im_start|>user\nWhat is 2+3?<|im_end|>\n<|im_start|>assistant\n"
                        "<think>\n")
    frames = list(stub.Generate(generate(prompt, stream=True)))
    chunks = [f.chunk for f in frames if f.HasField("chunk")]
    complete = frames[-1].complete
    assert frames[-1].HasField("complete") and len(chunks) == len(frames) - 1
    ids = [i for c in chunks for i in c.token_ids]
    assert list(complete.output_ids) == list(chunks[-1].token_ids)  # the last increment only
    assert complete.finish_reason == "stop" and complete.matched_token_id == ids[-1]
    assert complete.completion_tokens == len(ids) and complete.prompt_tokens == len(prompt)
    text = tok.decode(ids)
    assert "\n</think>\n\n5." in text
    assert complete.reasoning_tokens == 0  # counted only with require_reasoning (test_grpc_rpcs)
    whole = list(stub.Generate(generate(prompt, stream=False)))
    assert len(whole) == 1 and list(whole[0].complete.output_ids) == ids


def test_refusals_are_statuses(stub: pb_grpc.SglangSchedulerStub) -> None:
    info = stub.GetModelInfo(pb.GetModelInfoRequest())
    with pytest.raises(grpc.RpcError) as too_long:
        list(stub.Generate(generate([7] * info.max_req_input_len, stream=False)))
    assert too_long.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "exceeds the maximum allowed length" in str(too_long.value.details())
    with pytest.raises(grpc.RpcError) as untokenized:
        list(stub.Generate(pb.GenerateRequest(request_id="x")))
    assert untokenized.value.details() == "Tokenized input must be provided"
    with pytest.raises(grpc.RpcError) as section:
        stub.GetLoads(pb.GetLoadsRequest(include=["bogus"]))
    assert section.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert stub.Abort(pb.AbortRequest(request_id="nobody")).success  # any id


def test_health_loads_and_tokenizer(stub: pb_grpc.SglangSchedulerStub) -> None:
    health = stub.HealthCheck(pb.HealthCheckRequest())
    assert health.healthy and health.message == "Health check passed"
    loads = stub.GetLoads(pb.GetLoadsRequest(include=["core"]))
    assert loads.dp_rank_count == 1 and loads.loads[0].max_running_requests > 0
    assert not loads.loads[0].HasField("memory")
    data = b""
    chunks = list(stub.GetTokenizer(common_pb2.GetTokenizerRequest()))
    data = b"".join(c.data for c in chunks)
    assert chunks[-1].sha256 and all(not c.sha256 for c in chunks[:-1])
    names = zipfile.ZipFile(io.BytesIO(data)).namelist()
    assert names[:3] == ["tokenizer.json", "tokenizer_config.json", "config.json"]


def test_smg_routes_chat_to_it_over_grpc(sims: Launcher, tmp_path: Path) -> None:
    """As across hosts: the worker's model path (relative to its own directory) is nothing
    at the gateway, which fetches the tokenizer from the worker (GetTokenizer)."""
    from sglang_fleet_lab import gateways

    grpc_sim = sims.start(*GRPC, env=NO_PLANNED_WARMUP, wait=False, cwd=MODEL.parent,
                          model=Path(MODEL.name), port=grpc_port())
    wait_serving(grpc_sim)
    port = free_port()
    log = (tmp_path / "smg.log").open("w")
    proc = subprocess.Popen(gateways.smg_in_front_of(f"grpc://{target(grpc_sim)}", port),
                            stdout=log, stderr=log, cwd=tmp_path)
    try:
        url = f"http://127.0.0.1:{port}"
        body = {"model": MODEL.name, "max_tokens": 200,
                "messages": [{"role": "user", "content": "What is 2+3?"}]}
        deadline = time.monotonic() + 60
        while True:
            try:
                answer = httpx.post(url + "/v1/chat/completions", json=body, timeout=30)
                if answer.status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, (tmp_path / "smg.log").read_text()[-3000:]
            time.sleep(0.5)
        message = answer.json()["choices"][0]["message"]
        assert "5." in message["content"] and message["reasoning_content"]
        assert "</think>" not in message["content"] + message["reasoning_content"]
        with httpx.stream("POST", url + "/v1/chat/completions", timeout=30, json={
                **body, "stream": True,
                "chat_template_kwargs": {"enable_thinking": False}}) as stream:
            lines = [line for line in stream.iter_lines() if line.startswith("data: ")]
        assert lines[-1] == "data: [DONE]" and len(lines) > 3
        assert "Receive GetTokenizer request" in grpc_sim.output()
        assert "Fetching tokenizer from worker" in (tmp_path / "smg.log").read_text()
    finally:
        proc.terminate()
        proc.wait(20)


def test_sigterm_stops_the_servicer_and_exits_0(sims: Launcher) -> None:
    sim = sims.start(*GRPC, env=NO_PLANNED_WARMUP, wait=False, port=grpc_port())
    wait_serving(sim)
    sim.proc.send_signal(signal.SIGTERM)
    assert sim.proc.wait(30) == 0
    out = sim.output()
    order = ["Received shutdown signal", "Shutting down gRPC server",
             "Health service status set to NOT_SERVING", "Shutting down GrpcRequestManager",
             "Terminating scheduler process 0...", "All scheduler processes terminated",
             "kill_process_tree called: parent_pid="]
    at = [out.index(line) for line in order]
    assert at == sorted(at), out


def test_a_scheduler_exception_kills_the_tree_and_itself(sims: Launcher) -> None:
    sim = sims.start(*GRPC, env={**NO_PLANNED_WARMUP, "SGLANG_SIM_CRASH_AFTER": "1"}, wait=False,
                     port=grpc_port())
    wait_serving(sim)
    with grpc.insecure_channel(target(sim)) as channel:
        stub = pb_grpc.SglangSchedulerStub(channel)
        list(stub.Generate(generate([1, 2, 3], stream=False, max_new=4)))
        with pytest.raises(grpc.RpcError):
            list(stub.Generate(generate([1, 2, 3], stream=False, max_new=4), timeout=20))
    assert sim.proc.wait(30) == -signal.SIGKILL
    out = sim.output()
    assert "Scheduler hit an exception" in out
    assert ("Received SIGQUIT from scheduler process. Scheduler failed, shutting down gRPC "
            "server.") in out


def test_the_planned_warm_up_is_the_servicers_own(sims: Launcher) -> None:
    sim = sims.start(*GRPC, "--max-running-requests", "4", "--chunked-prefill-size", "512",
                     env={"SMG_SGLANG_SERVICER_WARMUP": "fast:60"}, wait=False,
                     port=grpc_port())
    wait_serving(sim, timeout=90)
    out = sim.output()
    assert "Planned warm-up starts (level fast:" in out
    assert "Warm-up step 1/" in out and "decode batch 4 down to 1 (4 requests)" in out
    assert "Planned warm-up over:" in out and "(0 failed requests)" in out
    assert out.index("Planned warm-up over:") < out.index("Health service status set to SERVING")


@pytest.mark.parametrize(("release", "ending"), [
    ("0.5.18", "gRPC mode requires the smg-grpc-servicer package."),
    ("0.5.19", "gRPC serving is imitated from 0.5.20 on"),
])
def test_releases_the_servicer_does_not_serve(sims: Launcher, release: str,
                                              ending: str) -> None:
    done = sims.run(*GRPC, env={"SGLANG_SIM_VERSION": release})
    assert done.returncode == 1 and ending in done.stderr, done.stderr[-2000:]


def test_the_lab_models_tokenizer_is_what_its_script_writes() -> None:
    """lab/models/qwen3.6-27b/tokenizer*.json are generated (scripts/lab_tokenizer.py) from the
    simulator's words: a change to either shows here."""
    script = Path(__file__).resolve().parents[3] / "scripts" / "lab_tokenizer.py"
    done = subprocess.run([sys.executable, str(script), "--check"], capture_output=True,
                          text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_tokenizer_round_trip_and_one_token_per_word() -> None:
    tok = Tokenizer.load(str(MODEL))
    assert tok is not None
    for text in ["the model serves tokens", "5. héllo\n\n<think>\nx</think>", "  a  b\t\n"]:
        assert tok.decode(tok.encode(text)) == text
    assert len(tok.encode("the model serves tokens quickly")) == 5
    assert tok.encode("<|im_end|>") == [tok.id_of("<|im_end|>")] == [248046]


def test_n_samples_as_the_servicer_splits_them(stub: pb_grpc.SglangSchedulerStub) -> None:
    """n > 1: sub-requests; whole answers all carry index 0, streamed frames their own."""
    request = generate([5, 6, 7], stream=False, max_new=6)
    request.sampling_params.n = 3
    whole = list(stub.Generate(request))
    assert [f.HasField("complete") for f in whole] == [True] * 3
    assert {f.complete.index for f in whole} == {0}
    request.stream = True
    frames = list(stub.Generate(request))
    completes = [f.complete for f in frames if f.HasField("complete")]
    assert sorted(c.index for c in completes) == [0, 1, 2]


def test_a_busy_sidecar_port_is_logged_and_grpc_serves(sims: Launcher) -> None:
    port = grpc_port()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", port + 1))
        taken.listen()
        sim = sims.start(*GRPC, env=NO_PLANNED_WARMUP, wait=False, port=port)
        wait_serving(sim)
    assert "Failed to start HTTP sidecar server:" in sim.output()
    assert "Continuing without metrics/profile endpoints." in sim.output()


def test_grpc_port_follows_the_smg_mode(sims: Launcher) -> None:
    """SGLang derives port + 10000 in the SMG mode and range-checks it; --grpc-mode is its
    deprecated alias (0.5.16+), and --grpc-port beside the SMG mode is not served."""
    high = sims.run(*GRPC, "--port", "60000")
    assert high.returncode == 1
    assert "ValueError: --grpc-port / SGLANG_GRPC_PORT (70000) must be between 1 and 65535" in (
        high.stderr)
    sim = sims.start("--grpc-mode", "--grpc-port", "31000", env=NO_PLANNED_WARMUP, wait=False,
                     port=grpc_port())
    wait_serving(sim)
    assert "--grpc-mode is deprecated and will be removed in a future version." in sim.output()


def test_a_scheduler_gone_without_sigquit_ends_the_servicer_with_1(sims: Launcher) -> None:
    sim = sims.start(*GRPC, env=NO_PLANNED_WARMUP, wait=False, port=grpc_port())
    wait_serving(sim)
    scheduler = subprocess.run(["pgrep", "-P", str(sim.proc.pid)], capture_output=True,
                               text=True).stdout.split()
    assert len(scheduler) == 1  # the scheduler alone: no detokenizer in gRPC mode
    os.kill(int(scheduler[0]), signal.SIGKILL)
    assert sim.proc.wait(30) == 1
    out = sim.output()
    assert ("A scheduler process exited; non-zero exit codes detected: [-9]. Shutting down "
            "gRPC server") in out
    assert "Terminating scheduler process" not in out  # it is gone already
    assert "A scheduler process exited on its own; the servicer exits with code 1" in out


def test_ctrl_c_on_the_group_reaches_the_server_alone(sims: Launcher) -> None:
    """The servicer's schedulers ignore SIGINT: the server shuts down and exits 0."""
    sim = sims.start(*GRPC, env=NO_PLANNED_WARMUP, wait=False, port=grpc_port(), session=True)
    wait_serving(sim)
    os.killpg(sim.proc.pid, signal.SIGINT)
    assert sim.proc.wait(30) == 0
    assert "KeyboardInterrupt" not in sim.output()
    assert "Terminating scheduler process 0..." in sim.output()


def test_an_unknown_servicer_implementation_is_a_configuration_error(sims: Launcher) -> None:
    done = sims.run(*GRPC, env={"SMG_SGLANG_SERVICER_IMPL": "java"})
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "servicer configuration error: SMG_SGLANG_SERVICER_IMPL must be one of" in done.stderr
