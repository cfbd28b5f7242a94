"""``sglang.grpc.scheduler.SglangScheduler`` as smg-grpc-servicer 0.14.1 serves it for SGLang
0.5.20 - 0.5.23 in ``--smg-grpc-mode`` (its ``sglang/servicer.py``; the messages are
smg-grpc-proto 0.4.28's). The servicer's own parts that need no SGLang run as they are: the
tokenizer bundle, the load conversion and the error statuses. Behaviour kept from its source:

- Generate: incremental ``token_ids`` in a ``chunk`` per step and, at the end, a chunk and a
  ``complete`` holding that last increment (streaming), or one ``complete`` with every token;
  ``n`` > 1 runs a prefill-only ``{rid}-prefix``, then ``{rid}-0`` ... (streamed frames carry
  their index; whole answers come in order, each with index 0); ``spec_*`` counts 0; a stop
  ends with the stop token, reported as ``matched_token_id``. A prompt of at least
  ``max_req_input_len`` tokens is INVALID_ARGUMENT. Text: the prompt's ids through the model's
  tokenizer; a prompt that opens a think block (Qwen's template) gets reasoning, then
  ``</think>``, then the answer.
- Abort: ``success`` for any id; the open stream gets nothing more (the client ends it).
- GetModelInfo: the raw arguments and the scheduler's ready report only, so ``vocab_size``
  128256, no ``eos_token_ids``, and ``max_context_length`` the KV pool's tokens.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from argparse import Namespace
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import grpc
from google.protobuf.struct_pb2 import Struct
from google.protobuf.timestamp_pb2 import Timestamp
from smg_grpc_proto import sglang_scheduler_pb2 as pb
from smg_grpc_proto import sglang_scheduler_pb2_grpc as pb_grpc
from smg_grpc_proto.generated import common_pb2
from smg_grpc_servicer.sglang.loads import convert_loads_to_protobuf
from smg_grpc_servicer.tokenizer_bundle import tokenizer_bundle, tokenizer_chunks

from sglang_sim.engine import Output
from sglang_sim.state import State
from sglang_sim.tokenizer import Tokenizer

logger = logging.getLogger("smg_grpc_servicer.sglang.servicer")
DEFAULT_MAX_NEW_TOKENS = 128  # SGLang's SamplingParams default
DEFAULT_VOCAB_SIZE = 128256  # GetModelInfo's when the ready report carries none
LOAD_SECTIONS = ("all", "core", "disagg", "lora", "memory", "queues", "spec")
THINK_OPEN, THINK_CLOSE = "<think>\n", "\n</think>\n\n"


@dataclass(frozen=True)
class _Job:
    """What a Generate call asks of each of its scheduler requests."""

    ids: list[int]
    text: str
    max_new: int
    stream: bool


class Servicer(pb_grpc.SglangSchedulerServicer):  # type: ignore[misc]
    """The simulator's scheduler behind the servicer's RPCs.

        server.add_generic_rpc_handlers(...)  # pb_grpc.add_SglangSchedulerServicer_to_server
    """

    def __init__(self, state: State, raw: Namespace) -> None:
        self.state = state
        self.raw = raw  # the arguments as given (the servicer reads the sealed record's raw view)
        self.tokenizer = Tokenizer.load(raw.model_path)
        self.config = json.loads((Path(raw.model_path) / "config.json").read_text())
        self.aborted: set[str] = set()
        self.in_flight = 0
        self.started = time.time()
        self.last_receive = time.time()
        self.shutting_down = False
        self._window_logged = False

    @property
    def max_req_input_len(self) -> int:
        plan = self.state.memory
        return min(plan.context_len - 1, plan.kv_tokens - 1) - 5

    def ready_report(self) -> dict[str, Any]:
        return {"status": "ready", "max_total_num_tokens": self.state.memory.kv_tokens,
                "max_req_input_len": self.max_req_input_len,
                "startup_time": self.state.startup_time}

    async def Generate(self, request: pb.GenerateRequest, context: Any
                       ) -> AsyncIterator[pb.GenerateResponse]:
        rid = request.request_id
        logger.info(f"Receive generation request: {rid}")
        if not request.HasField("tokenized"):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                "Tokenized input must be provided")
        if request.return_hidden_states:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, (
                "The server is not configured to return hidden states. Please launch with "
                "`--return-hidden-states-mode full` to allow return_hidden_states=True."))
        ids = list(request.tokenized.input_ids)
        if len(ids) >= self.max_req_input_len:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, (
                f"Input length ({len(ids)} tokens) exceeds the maximum allowed length "
                f"({self.max_req_input_len} tokens). Use a shorter input or enable "
                "--allow-auto-truncate."))
        text = self.tokenizer.decode(ids) if self.tokenizer else request.tokenized.original_text
        sp = request.sampling_params
        room = self.state.memory.context_len - len(ids) - 1
        wanted = sp.max_new_tokens if sp.HasField("max_new_tokens") else DEFAULT_MAX_NEW_TOKENS
        job = _Job(ids, text, max(min(wanted, room), 0), request.stream)
        self.in_flight += 1
        try:
            if sp.n <= 1:
                async for frame in self._one(rid, job, 0, None):
                    yield frame
                return
            # n > 1 (request_manager.py): a prefill-only "{rid}-prefix", then n sub-requests;
            # streamed frames carry their index, whole answers all come with index 0
            async for _ in self._one(f"{rid}-prefix", _Job(ids, text, 0, False), 0, None):
                pass
            frames: asyncio.Queue[tuple[int, pb.GenerateResponse | None]] = asyncio.Queue()

            async def sub(i: int) -> None:
                try:
                    async for frame in self._one(f"{rid}-{i}", job, i if job.stream else 0, i):
                        frame.request_id = rid
                        await frames.put((i, frame))
                finally:
                    await frames.put((i, None))

            tasks = [asyncio.create_task(sub(i)) for i in range(sp.n)]
            try:
                done = 0
                whole: dict[int, pb.GenerateResponse] = {}
                while done < len(tasks):
                    i, frame = await frames.get()
                    if frame is None:
                        done += 1
                    elif job.stream:
                        yield frame
                    else:
                        whole[i] = frame
                for i in sorted(whole):  # in sub-request order
                    yield whole[i]
            finally:
                for task in tasks:
                    task.cancel()
        except asyncio.CancelledError:
            logger.info(f"Request {rid} cancelled by client")
            raise
        finally:
            self.in_flight -= 1

    async def _one(self, rid: str, job: _Job, index: int, seed: int | None
                   ) -> AsyncIterator[pb.GenerateResponse]:
        """One scheduler request: chunks as it decodes (streaming), then its complete."""
        think = job.text.endswith(THINK_OPEN)
        out = self.state.dispatch.compose(job.text, job.max_new, think, seed)
        groups = self._token_groups(out, think)
        sent: list[int] = []
        new: list[int] = []
        words = 0
        try:
            async for n in self.state.dispatch.run(rid, len(job.ids), out, job.stream):
                self.last_receive = time.time()
                if rid in self.aborted:
                    await asyncio.Event().wait()  # nothing more for this stream: the client ends it
                new = [i for group in groups[words:words + n] for i in group]
                words += n
                if words >= len(groups) and out.finish_reason == "stop" and self._eos is not None:
                    new.append(self._eos)
                sent += new
                if job.stream:
                    yield pb.GenerateResponse(request_id=rid, chunk=self._chunk(
                        new, len(job.ids), len(sent), len(out.reasoning), index))
            if rid in self.aborted:
                await asyncio.Event().wait()
            yield pb.GenerateResponse(request_id=rid, complete=self._complete(
                new if job.stream else sent, out, len(job.ids), len(sent), index))
        finally:
            self.aborted.discard(rid)

    @property
    def _eos(self) -> int | None:
        return self.state.eos_token_id if self.tokenizer else None

    def _token_groups(self, out: Output, think: bool) -> list[list[int]]:
        """Each generated word's ids (one step's tokens are that many words)."""
        words = [*out.reasoning, *out.answer]
        groups: list[list[int]] = []
        for i, word in enumerate(words):
            piece = word if i in (0, len(out.reasoning)) else " " + word
            if think and i == len(out.reasoning):
                piece = THINK_CLOSE + piece
            groups.append(self.tokenizer.encode(piece) if self.tokenizer else [0])
        return groups

    @staticmethod
    def _chunk(ids: list[int], prompt: int, completion: int, reasoning: int, index: int
               ) -> pb.GenerateStreamChunk:
        return pb.GenerateStreamChunk(token_ids=ids, prompt_tokens=prompt,
                                      completion_tokens=completion, cached_tokens=0,
                                      reasoning_tokens=reasoning, index=index)

    def _complete(self, ids: list[int], out: Output, prompt: int, completion: int,
                  index: int) -> pb.GenerateComplete:
        done = pb.GenerateComplete(output_ids=ids, finish_reason=out.finish_reason,
                                   prompt_tokens=prompt, completion_tokens=completion,
                                   cached_tokens=0, reasoning_tokens=len(out.reasoning),
                                   index=index)
        if out.finish_reason == "stop" and self._eos is not None:
            done.matched_token_id = self._eos
        return done

    async def HealthCheck(self, request: pb.HealthCheckRequest, context: Any
                          ) -> pb.HealthCheckResponse:
        rid = f"HEALTH_CHECK_{time.time()}"
        logger.info(f"Receive health check request: {rid}")
        if self.shutting_down:
            return pb.HealthCheckResponse(healthy=False, message="Server is shutting down")
        await asyncio.sleep(0.5)  # the probe's first poll
        if await self.state.health_generation():
            return pb.HealthCheckResponse(healthy=True, message="Health check passed")
        return pb.HealthCheckResponse(
            healthy=False, message=f"Health check timeout after {self.state.health_timeout:g}s")

    async def Abort(self, request: pb.AbortRequest, context: Any) -> pb.AbortResponse:
        rid = request.request_id
        logger.info(f"Receive abort request: {rid}")
        if rid.startswith("HEALTH_CHECK"):
            return pb.AbortResponse(success=False, message=f"Request {rid} not found")
        # the scheduler aborts by prefix: X ends X-0, X10, ...
        self.aborted.update(r for r in self.state.dispatch.rids if r.startswith(rid))
        return pb.AbortResponse(success=True, message=f"Request {rid} aborted")

    async def GetModelInfo(self, request: pb.GetModelInfoRequest, context: Any
                           ) -> pb.GetModelInfoResponse:
        raw = self.raw
        preferred = raw.preferred_sampling_params
        return pb.GetModelInfoResponse(
            model_path=raw.model_path, tokenizer_path=raw.tokenizer_path or "",
            is_generation=not getattr(raw, "is_embedding", False),
            preferred_sampling_params=preferred if isinstance(preferred, str) else "",
            weight_version=getattr(raw, "weight_version", None) or "default",
            served_model_name=raw.served_model_name or "",
            max_context_length=self.state.memory.kv_tokens, vocab_size=DEFAULT_VOCAB_SIZE,
            model_type=str(self.config.get("model_type", "")),
            architectures=list(self.config.get("architectures", [])),
            pad_token_id=0, bos_token_id=1, max_req_input_len=self.max_req_input_len)

    async def GetServerInfo(self, request: pb.GetServerInfoRequest, context: Any
                            ) -> pb.GetServerInfoResponse:
        args = {k: _plain(v) for k, v in vars(self.raw).items()}
        args["grammar_backend"] = args.get("grammar_backend") or "xgrammar"
        if not args.get("max_running_requests"):
            window = min(plan.max_running_requests for plan in self.state.memories)
            if not self._window_logged:
                logging.getLogger("smg_grpc_servicer.sglang.servicer").info(
                    f"max_running_requests is unset: reporting the scheduler's computed window "
                    f"{window}")
                self._window_logged = True
            args["max_running_requests"] = window
        server_args, scheduler_info = Struct(), Struct()
        server_args.update(args)
        scheduler_info.update(self.ready_report())
        start = Timestamp(seconds=int(self.started))
        return pb.GetServerInfoResponse(
            server_args=server_args, scheduler_info=scheduler_info,
            active_requests=self.in_flight, is_paused=False,
            last_receive_timestamp=self.last_receive, uptime_seconds=time.time() - self.started,
            sglang_version=self.state.release, server_type="grpc", start_time=start,
            max_total_num_tokens=self.state.memory.kv_tokens)

    async def GetLoads(self, request: pb.GetLoadsRequest, context: Any) -> pb.GetLoadsResponse:
        include = list(request.include) or ["all"]
        invalid = [s for s in include if s not in LOAD_SECTIONS]
        if invalid:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, (
                f"Invalid include sections: {invalid}. Valid options: {list(LOAD_SECTIONS)}"))
        loads = [convert_loads_to_protobuf(self._snapshot(rank))
                 for rank in range(len(self.state.dispatch.engines))
                 if not request.HasField("dp_rank") or rank == request.dp_rank]
        if "all" not in include:
            for load in loads:
                for section, name in (("memory", "memory"), ("spec", "speculative"),
                                      ("lora", "lora"), ("disagg", "disaggregation"),
                                      ("queues", "queues")):
                    if section not in include:
                        load.ClearField(name)
        aggregate = pb.AggregateMetrics()
        if loads:
            aggregate = pb.AggregateMetrics(
                total_running_reqs=sum(x.num_running_reqs for x in loads),
                total_waiting_reqs=sum(x.num_waiting_reqs for x in loads),
                total_reqs=sum(x.num_total_reqs for x in loads),
                avg_token_usage=round(sum(x.token_usage for x in loads) / len(loads), 4),
                avg_throughput=round(sum(x.gen_throughput for x in loads) / len(loads), 2),
                avg_utilization=round(sum(x.utilization for x in loads) / len(loads), 4))
        return pb.GetLoadsResponse(timestamp=datetime.now(UTC).isoformat(),
                                   version=self.state.release, dp_rank_count=len(loads),
                                   loads=loads, aggregate=aggregate)

    def _snapshot(self, rank: int) -> SimpleNamespace:
        """What a scheduler publishes (SGLang's LoadSnapshot), from its engine."""
        engine, plan = self.state.dispatch.engines[rank], self.state.memories[rank]
        used = self.state.dispatch.tokens[rank]
        usage = used / plan.kv_tokens if plan.kv_tokens else 0.0
        spec = None
        if engine.speculative:
            accept = engine.stats.avg_accept_length
            spec = SimpleNamespace(accept_length=accept, accept_rate=(accept - 1) / max(
                engine.draft_tokens - 1, 1) if accept else 0.0)
        return SimpleNamespace(
            dp_rank=rank, num_running_reqs=engine.running, num_waiting_reqs=engine.queued,
            num_used_tokens=used, max_total_num_tokens=plan.kv_tokens, token_usage=usage,
            gen_throughput=engine.stats.throughput(), cache_hit_rate=0.0, utilization=usage,
            max_running_requests=plan.max_running_requests, num_waiting_uncached_tokens=0,
            memory=SimpleNamespace(weight_gb=plan.weight_gb, kv_cache_gb=plan.kv_k_gb
                                   + plan.kv_v_gb, graph_gb=0.0, token_capacity=plan.kv_tokens),
            speculative=spec, lora=None, disaggregation=None,
            queues=SimpleNamespace(waiting=engine.queued, grammar=0, paused=0, retracted=0))

    async def GetTokenizer(self, request: common_pb2.GetTokenizerRequest, context: Any
                           ) -> AsyncIterator[common_pb2.GetTokenizerChunk]:
        logger.info("Receive GetTokenizer request")
        if not self.raw.tokenizer_path:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                                "Tokenizer path is not configured on this server.")
        try:
            data, digest = await tokenizer_bundle(self.raw.tokenizer_path)
        except Exception as error:
            logger.error(f"Failed to build tokenizer ZIP: {error}")
            await context.abort(grpc.StatusCode.INTERNAL, str(error))
        logger.info(f"Streaming tokenizer bundle: {len(data)} bytes, sha256={digest}")
        for chunk in tokenizer_chunks(data, digest):
            yield chunk

    async def FlushCache(self, request: common_pb2.FlushCacheRequest, context: Any
                         ) -> common_pb2.FlushCacheResponse:
        return common_pb2.FlushCacheResponse(success=True, message="Cache flushed successfully")

    async def SubscribeKvEvents(self, request: Any, context: Any) -> AsyncIterator[Any]:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, (
            "KV cache events not enabled. Start SGLang with --kv-events-config "
            "'{\"publisher\": \"zmq\"}'"))
        yield  # an async generator, as the stream RPC is


def _plain(value: Any) -> Any:
    """A value a protobuf Struct holds (the servicer turns unknown types to str)."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return str(value)
