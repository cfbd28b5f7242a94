"""The gRPC servicer's RPCs as smg-grpc-servicer 0.14.1 answers them over SGLang 0.5.20+
(sglang_sim/grpc_servicer.py, grpc_info.py): load snapshots, the generation budget, reasoning
counts, aborts by prefix, cache flushes, the profiler, server-info labels, hidden states, n > 1
and the tokenizer's split."""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from conftest import (
    GRPC,
    MODEL,
    MTP,
    NO_PLANNED_WARMUP,
    Launcher,
    Sim,
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

ABORT_WARNING = ("Unknown type on tokenizer socket: "
                 "<class 'sglang.srt.managers.io_struct.AbortReq'>")


def until(check: Callable[[], Any], timeout: float = 10, what: str = "") -> Any:
    deadline = time.monotonic() + timeout
    while not (value := check()):
        assert time.monotonic() < deadline, f"timed out waiting for {what or check}"
        time.sleep(0.02)
    return value


class Stream:
    """A Generate call read in a thread, its frames kept as they arrive."""

    def __init__(self, stub: pb_grpc.SglangSchedulerStub, request: pb.GenerateRequest) -> None:
        self.call = stub.Generate(request)
        self.frames: list[pb.GenerateResponse] = []
        self.error: grpc.RpcError | None = None
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        try:
            for frame in self.call:
                self.frames.append(frame)
        except grpc.RpcError as error:
            self.error = error

    @property
    def completes(self) -> list[pb.GenerateComplete]:
        return [f.complete for f in self.frames if f.HasField("complete")]

    def done(self, timeout: float = 20) -> Stream:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the stream did not end"
        return self


def long_request(rid: str, stream: bool = True, ids: list[int] | None = None,
                 max_new: int = 2000) -> pb.GenerateRequest:
    request = generate(ids or [11, 12, 13], stream=stream, max_new=max_new)
    request.request_id = rid
    return request


def metric(sim: Sim, name: str) -> float:
    text = httpx.get(sidecar(sim) + "/metrics", timeout=5).text
    found = re.search(rf"^{re.escape(name)}\{{[^}}]*\}} (\S+)$", text, re.M)
    assert found, text
    return float(found.group(1))


@pytest.fixture(scope="module")
def tight(gpu_bin: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sim]:
    """One running request at a time, a 4096-token KV pool, MTP and long answers."""
    launcher = Launcher(gpu_bin, tmp_path_factory.mktemp("tight"))
    sim = launcher.start(*GRPC, *MTP, "--max-running-requests", "1", "--max-total-tokens",
                         "4096", wait=False, port=grpc_port(),
                         env={**NO_PLANNED_WARMUP, "SGLANG_SIM_ANSWER_TOKENS": "300",
                              "SGLANG_SIM_DECODE_STEPS_PER_SECOND": "100"})
    wait_serving(sim)
    yield sim
    sim.stop()


@pytest.fixture(scope="module")
def tight_stub(tight: Sim) -> Iterator[pb_grpc.SglangSchedulerStub]:
    with grpc.insecure_channel(target(tight)) as channel:
        yield pb_grpc.SglangSchedulerStub(channel)


def test_loads_are_the_schedulers_snapshot(tight: Sim,
                                           tight_stub: pb_grpc.SglangSchedulerStub) -> None:
    stub = tight_stub
    idle = stub.GetLoads(pb.GetLoadsRequest()).loads[0]
    assert not idle.HasField("speculative")  # no forward step yet
    assert idle.HasField("disaggregation") and idle.disaggregation.mode == "null"
    assert idle.utilization == 0.0 and idle.num_waiting_uncached_tokens == 0
    running = Stream(stub, long_request("loads-a"))
    until(lambda: running.frames, what="a first chunk")
    queued_prompt = list(range(100, 140))
    queued = Stream(stub, long_request("loads-b", ids=queued_prompt))
    load = until(lambda: next((x for x in stub.GetLoads(pb.GetLoadsRequest()).loads
                               if x.num_waiting_reqs == 1), None), what="a queued request")
    assert load.num_running_reqs == 1 and load.queues.waiting == 1
    assert load.num_waiting_uncached_tokens == len(queued_prompt)
    assert load.token_usage == metric(tight, "sglang:token_usage") > 0  # one definition
    assert load.num_used_tokens == round(load.token_usage * load.max_total_num_tokens)
    assert load.HasField("speculative") and load.speculative.accept_length > 1
    assert load.utilization == 0.0
    # a flush while requests run fails at once, or waits for idle up to its timeout
    busy = stub.FlushCache(common_pb2.FlushCacheRequest())
    assert (busy.success, busy.message) == (False, "failed")
    assert ("Cache not flushed because there are pending requests. #queue-req: 1, "
            "#running-req: 1") in tight.output()
    late = stub.FlushCache(common_pb2.FlushCacheRequest(timeout_s=0.2))
    assert (late.success, late.message) == (False, "Timed out waiting for idle state.")
    assert "Deferred flush_cache timed out while waiting for idle state." in tight.output()
    assert stub.Abort(pb.AbortRequest(request_id="loads-")).success
    running.call.cancel()
    queued.call.cancel()
    flushed = stub.FlushCache(common_pb2.FlushCacheRequest(timeout_s=20))
    assert (flushed.success, flushed.message) == (True, "Cache flushed successfully")
    assert "Cache flushed successfully!" in tight.output()
    assert not stub.GetLoads(pb.GetLoadsRequest()).loads[0].HasField("speculative")  # reset


def test_no_max_new_tokens_runs_to_the_room(tight_stub: pb_grpc.SglangSchedulerStub) -> None:
    """No 128-token default: the scheduler's room, min(context - 1, KV - 1) - prompt - 1."""
    stub = tight_stub
    unset = pb.GenerateRequest(request_id="room-a", tokenized=pb.TokenizedInput(
        input_ids=[21, 22, 23]))
    whole = list(stub.Generate(unset))[-1].complete
    assert whole.finish_reason == "stop" and whole.completion_tokens > 128
    info = stub.GetModelInfo(pb.GetModelInfoRequest())
    prompt = [7] * (info.max_req_input_len - 1)
    unset.tokenized.input_ids[:] = prompt
    near = list(stub.Generate(unset))[-1].complete
    room = info.max_context_length - 1 - len(prompt) - 1  # the KV pool is the bound here
    assert (near.finish_reason, near.completion_tokens) == ("length", room)


def test_an_abort_frees_the_slot_and_its_stream_hangs(
        tight: Sim, tight_stub: pb_grpc.SglangSchedulerStub) -> None:
    stub = tight_stub
    first = Stream(stub, long_request("hang-1"))
    until(lambda: first.frames, what="a first chunk")
    second = Stream(stub, long_request("other-2", max_new=5))
    assert stub.Abort(pb.AbortRequest(request_id="hang-1")).success
    second.done()  # hang-1 left the engine: other-2 got its slot
    assert second.completes[-1].finish_reason == "length"
    seen = len(first.frames)
    time.sleep(0.5)
    assert len(first.frames) == seen and not first.completes  # nothing more for hang-1
    first.call.cancel()
    until(lambda: "Request hang-1 cancelled by client" in tight.output())


def test_an_abort_by_prefix_ends_queued_and_running_sub_requests(
        tight: Sim, tight_stub: pb_grpc.SglangSchedulerStub) -> None:
    """n = 2 with one running slot: base-0 runs and ends with finish_reason "abort" after
    its next step; base-1 waits, leaves the queue, and the manager warns of the AbortReq."""
    stub = tight_stub
    request = long_request("base")
    request.sampling_params.n = 2
    both = Stream(stub, request)
    until(lambda: both.frames, what="a first chunk")
    warned = tight.output().count(ABORT_WARNING)
    stub.Abort(pb.AbortRequest(request_id="base"))
    until(lambda: both.completes, what="the running sub-request's end")
    assert [(c.index, c.finish_reason) for c in both.completes] == [(0, "abort")]
    assert tight.output().count(ABORT_WARNING) == warned + 1  # base-1's
    time.sleep(0.3)
    assert len(both.completes) == 1  # base-1 hangs
    assert stub.GetLoads(pb.GetLoadsRequest()).aggregate.total_reqs == 0
    both.call.cancel()


def test_reasoning_tokens_only_when_the_request_requires_reasoning(stub: Any) -> None:
    tok = Tokenizer.load(str(MODEL))
    assert tok is not None
    prompt = tok.encode("<|im_start|>user\nWhat is 2+3?<|im_end|>\n<|im_start|>assistant\n"
                        "<think>\n")
    plain = list(stub.Generate(generate(prompt, stream=True)))
    assert {f.chunk.reasoning_tokens for f in plain[:-1]} | {plain[-1].complete.reasoning_tokens
                                                            } == {0}
    request = generate(prompt, stream=True)
    request.require_reasoning = True
    frames = list(stub.Generate(request))
    ids = [i for f in frames[:-1] for i in f.chunk.token_ids]
    counts = [f.chunk.reasoning_tokens for f in frames[:-1]]
    upto = ids.index(tok.id_of("</think>")) + 1  # reasoning, "\n", then </think>
    assert counts == sorted(counts) and counts[0] > 0 and counts[-1] == upto < len(ids)
    assert frames[-1].complete.reasoning_tokens == upto


def test_zero_new_tokens_streams_an_empty_chunk_then_the_complete(stub: Any) -> None:
    frames = list(stub.Generate(generate([1, 2, 3], stream=True, max_new=0)))
    assert [f.WhichOneof("response") for f in frames] == ["chunk", "complete"]
    assert list(frames[0].chunk.token_ids) == [] == list(frames[1].complete.output_ids)
    assert frames[1].complete.finish_reason == "length"


def test_whole_n_answers_run_one_after_another(stub: Any) -> None:
    """Non-streaming n > 1 sends each sub-request after the one before (request_manager);
    streamed, they all run together. active_requests counts them as rid_to_state does."""
    for stream, most in ((False, 1), (True, 3)):
        request = generate([5, 6, 7], stream=stream, max_new=20)
        request.sampling_params.n = 3
        call = Stream(stub, request)
        seen = 0
        while call.thread.is_alive():
            seen = max(seen, stub.GetServerInfo(pb.GetServerInfoRequest()).active_requests)
            time.sleep(0.02)
        assert seen == most and len(call.completes) == 3, (stream, seen)


def test_the_profiler_rpcs(grpc_sim: Sim, stub: Any, tmp_path: Path) -> None:
    stop = stub.StopProfile(common_pb2.StopProfileRequest())
    assert (stop.success, stop.message) == (
        False, "Profiling is not in progress. Call /start_profile first.")
    start = stub.StartProfile(common_pb2.StartProfileRequest(output_dir=str(tmp_path)))
    assert (start.success, start.message) == (True, "Start profiling succeeded")
    assert f"Profiling starts. Traces will be saved to: {tmp_path}" in grpc_sim.output()
    stop = stub.StopProfile(common_pb2.StopProfileRequest())
    assert (stop.success, stop.message) == (True, "Stop profiling succeeded")
    assert f"Profiling done. Traces are saved to: {tmp_path}" in grpc_sim.output()


def test_server_info_labels_and_sampling_json(grpc_sim: Sim, stub: Any) -> None:
    server = stub.GetServerInfo(pb.GetServerInfoRequest())
    args = server.server_args
    assert args["engine_reasoning_parser"] == "qwen3"
    assert args["constrained_decoding_start"] == "after_reasoning"
    assert args["grammar_backend"] == "xgrammar" and "mm_item_limits" not in args
    assert dict(server.scheduler_info["hicache_object_layout"]) == {  # 0.5.23, the pinned
        "enabled": False, "backend": None, "page_size": 1.0,
        "hicache_object_layout": {"pools": []}, "reason": "Hierarchical cache is disabled"}
    info = stub.GetModelInfo(pb.GetModelInfoRequest())
    assert info.preferred_sampling_params == info.default_sampling_params_json == ""
    with pytest.raises(grpc.RpcError) as hidden:
        list(stub.Generate(pb.GenerateRequest(
            request_id="hs-1", tokenized=pb.TokenizedInput(input_ids=[1]),
            return_hidden_states=True)))
    assert hidden.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (hidden.value.details() or "").startswith(
        "The server is not configured to return hidden states.")
    assert "Generate invalid request hs-1: The server is not configured" in grpc_sim.output()


def test_the_other_labels_from_their_flags(sims: Launcher, tmp_path: Path) -> None:
    """0.5.22, no parser, --skip-tokenizer-init, media limits, the pairing protocol, preferred
    sampling, hidden states capped at the last token, and a tokenizer at --tokenizer-path
    apart from the model (whose directory has none)."""
    model = tmp_path / "weights"
    model.mkdir()
    (model / "config.json").write_text((MODEL / "config.json").read_text())
    sim = sims.start("--smg-grpc-mode", "--skip-tokenizer-init", "--tokenizer-path",
                     str(MODEL), "--limit-mm-data-per-request", '{"image": 2, "video": 0}',
                     "--preferred-sampling-params",
                     '{"temperature": 0.6, "top_k": 20, "max_new_tokens": 9}',
                     "--return-hidden-states-mode", "last", model=model, wait=False,
                     port=grpc_port(), env={**NO_PLANNED_WARMUP, "SGLANG_SIM_VERSION": "0.5.22",
                                            "SMG_PAIRING_PROTOCOL": " mooncake-v1 "})
    wait_serving(sim)
    with grpc.insecure_channel(target(sim)) as channel:
        stub = pb_grpc.SglangSchedulerStub(channel)
        server = stub.GetServerInfo(pb.GetServerInfoRequest())
        args = server.server_args
        assert "engine_reasoning_parser" not in args
        assert args["constrained_decoding_start"] == "first_token"
        assert args["grammar_backend"] == "none"  # no tokenizer in the scheduler
        assert args["mm_item_limits"] == "image=2"
        assert args["pairing_protocol"] == "mooncake-v1"
        assert "hicache_object_layout" not in server.scheduler_info  # before 0.5.23
        info = stub.GetModelInfo(pb.GetModelInfoRequest())
        assert info.preferred_sampling_params == (
            '{"temperature":0.6,"top_k":20,"max_new_tokens":9}')
        assert info.default_sampling_params_json == '{"temperature":0.6,"top_k":20}'
        with pytest.raises(grpc.RpcError) as hidden:
            list(stub.Generate(pb.GenerateRequest(
                request_id="hs-2", tokenized=pb.TokenizedInput(input_ids=[1]),
                return_hidden_states=True)))
        assert "exceeds the server maximum `last`" in (hidden.value.details() or "")
        done = list(stub.Generate(generate([1, 2, 3], stream=False, max_new=4)))
        ids = list(done[-1].complete.output_ids)
        tok = Tokenizer.load(str(MODEL))
        assert tok is not None and len(ids) == 4 and tok.decode(ids).split()  # words, not 0s


def test_a_prefill_server_and_a_stuck_scheduler(sims: Launcher) -> None:
    """utilization -1 on a prefill server with metrics; a health check of a stuck scheduler
    times out with the servicer's warning."""
    sim = sims.start(*GRPC, "--disaggregation-mode", "prefill", wait=False, port=grpc_port(),
                     env={**NO_PLANNED_WARMUP, "SGLANG_SIM_HANG_AFTER": "1",
                          "SGLANG_HEALTH_CHECK_TIMEOUT": "1"})
    wait_serving(sim)
    with grpc.insecure_channel(target(sim)) as channel:
        stub = pb_grpc.SglangSchedulerStub(channel)
        load = stub.GetLoads(pb.GetLoadsRequest())
        assert load.loads[0].utilization == -1.0 and load.aggregate.avg_utilization == -1.0
        assert load.loads[0].disaggregation.mode == "prefill"
        list(stub.Generate(generate([1, 2, 3], stream=False, max_new=4)))
        with pytest.raises(grpc.RpcError):
            list(stub.Generate(generate([1, 2, 3], stream=False, max_new=4), timeout=2))
        health = stub.HealthCheck(pb.HealthCheckRequest(), timeout=10)
    assert (health.healthy, health.message) == (False, "Health check timeout after 1s")
    assert "Health check timeout after 1s" in sim.output()


@pytest.mark.parametrize(("text", "ids"), [
    ("a_b", [97, 95, 98]),  # "_" is neither a letter nor a digit, but still a symbol
    ("x__y_", [120, 95, 95, 121, 95]),
    ("e\u0301", [195, 169]),  # NFC first: é
    ("0\u2000r", [48, 226, 128, 130, 114]),  # U+2000 is U+2002 after NFC
])
def test_the_tokenizer_keeps_every_character(text: str, ids: list[int]) -> None:
    """As tokenizers 0.23 encodes with the lab model's tokenizer.json (NFC, then GPT-2's
    byte-level split)."""
    tok = Tokenizer.load(str(MODEL))
    assert tok is not None and tok.encode(text) == ids


def test_the_tokenizer_round_trips_json_of_symbols() -> None:
    tok = Tokenizer.load(str(MODEL))
    assert tok is not None
    text = json.dumps({"snake_case": ["a_b", "__x__", "1_000"], "ok": True})
    assert tok.decode(tok.encode(text)) == text
