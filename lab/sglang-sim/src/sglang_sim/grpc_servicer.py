"""``sglang.grpc.scheduler.SglangScheduler`` as smg-grpc-servicer 0.14.1 serves it for SGLang
0.5.20 - 0.5.23 in ``--smg-grpc-mode`` (its ``sglang/servicer.py`` and ``request_manager.py``;
the messages are smg-grpc-proto 0.4.28's). The servicer's own parts that need no SGLang run as
they are: the tokenizer bundle, the load conversion, the server-info labels and the error
statuses (grpc_info.py has what it reports besides requests). Behaviour kept from its source:

- Generate: incremental ``token_ids`` in a ``chunk`` per step and, at the end, a chunk and a
  ``complete`` holding that last increment (streaming, an empty chunk when nothing was
  generated), or one ``complete`` with every token; ``max_new_tokens`` unset runs to the
  scheduler's room (``min(context - 1, KV pool - 1) - prompt - 1``); ``n`` > 1 runs a
  prefill-only ``{rid}-prefix``, then ``{rid}-0`` ... (streamed: all at once, frames carrying
  their index; whole: one after another, answered in order, each with index 0); ``spec_*``
  counts 0; a stop ends with the stop token, reported as ``matched_token_id``;
  ``reasoning_tokens`` only for ``require_reasoning``: the ids up to ``</think>`` inclusive. A
  prompt of at least ``max_req_input_len`` tokens is INVALID_ARGUMENT. Text: the prompt's ids
  through the tokenizer at ``tokenizer_path``; a prompt that opens a think block (Qwen's
  template) gets reasoning, then ``</think>``, then the answer.
- Abort (and a client's cancel) reaches the schedulers as SGLang's AbortReq, by prefix: the
  exact request's stream gets nothing more (the client ends it); another running request ends
  after its next step with ``finish_reason`` "abort"; a queued one leaves the queue, and its
  stream hangs while the manager warns of the AbortReq on its tokenizer socket (with
  ``--skip-tokenizer-init`` it ends INTERNAL "Request aborted").
- FlushCache: each scheduler flushes only when idle, or waits for idle up to ``timeout_s``.
  Start/StopProfile: the schedulers' profiler state (no trace is written).
- GetModelInfo: the raw arguments and the scheduler's ready report only, so ``vocab_size``
  128256, no ``eos_token_ids``, and ``max_context_length`` the KV pool's tokens.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from argparse import Namespace
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import grpc
from google.protobuf.struct_pb2 import Struct
from google.protobuf.timestamp_pb2 import Timestamp
from smg_grpc_proto import sglang_scheduler_pb2 as pb
from smg_grpc_proto import sglang_scheduler_pb2_grpc as pb_grpc
from smg_grpc_proto.generated import common_pb2
from smg_grpc_servicer.tokenizer_bundle import tokenizer_bundle, tokenizer_chunks

from sglang_sim import grpc_info
from sglang_sim.engine import Engine, Output
from sglang_sim.state import State, plain
from sglang_sim.tokenizer import Tokenizer

logger = logging.getLogger("smg_grpc_servicer.sglang.servicer")
manager_log = logging.getLogger("smg_grpc_servicer.sglang.request_manager")
UNBOUNDED = 1 << 30  # the scheduler's max_new_tokens when the request sets none
DEFAULT_VOCAB_SIZE = 128256  # GetModelInfo's when the ready report carries none
THINK_OPEN, THINK_CLOSE = "<think>\n", "\n</think>\n\n"
DROPPED = -1  # a queued request the scheduler took off its queue


class _Refused(Exception):
    """An output the servicer ends the stream with a status for."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class _Job:
    """What a Generate call asks of each of its scheduler requests."""

    ids: list[int]
    text: str
    max_new: int
    stream: bool
    reasoning: bool  # require_reasoning (with a parser whose end the scheduler can encode)


@dataclass
class _Live:
    """A request the manager holds (its rid_to_state entry) and what an abort did to it."""

    prompt: int
    started: bool = False  # its first step came: no longer queued
    finished: bool = False  # marked finished here (Abort of this id): its outputs are skipped
    finish: bool = False  # the scheduler ends it with FINISH_ABORT after its next step
    cancelled: bool = False
    dropped: asyncio.Event = field(default_factory=asyncio.Event)  # off the waiting queue


class Servicer(pb_grpc.SglangSchedulerServicer):  # type: ignore[misc]
    """The simulator's scheduler behind the servicer's RPCs.

        server.add_generic_rpc_handlers(...)  # pb_grpc.add_SglangSchedulerServicer_to_server
    """

    def __init__(self, state: State, raw: Namespace) -> None:
        self.state = state
        self.raw = raw  # the arguments as given (the servicer reads the sealed record's raw view)
        self.tokenizer = Tokenizer.load(raw.tokenizer_path or raw.model_path)
        self._skip_tokenizer = bool(getattr(raw, "skip_tokenizer_init", False))
        self.config = json.loads((Path(raw.model_path) / "config.json").read_text())
        # the scheduler's think_end_ids: its reasoning parser's end, through its tokenizer
        self.think_end = (self.tokenizer.encode("</think>") if self.tokenizer and
                          raw.reasoning_parser and not self._skip_tokenizer else [])
        self.live: dict[str, _Live] = {}
        self.probes: set[str] = set()  # health checks' requests, also in rid_to_state
        self.controls = grpc_info.Controls(state.dispatch.engines)  # flush and profiler
        self.started = time.time()
        # what the request manager holds, which its health service reads (the servicer plays
        # the manager's part here): its shutdown, the schedulers' last output, its requests
        self.gracefully_exit = False
        self.last_receive_tstamp = time.time()
        self._window_logged = False

    @property
    def rid_to_state(self) -> list[str]:
        return [*self.live, *self.probes]

    @property
    def max_req_len(self) -> int:
        """The scheduler's bound on prompt plus output (tp_worker.py)."""
        plan = self.state.memory
        return min(plan.context_len - 1, plan.kv_tokens - 1)

    @property
    def max_req_input_len(self) -> int:
        return self.max_req_len - 5

    def ready_report(self) -> dict[str, Any]:
        return grpc_info.scheduler_info(self.state.args, self.state.release,
                                        self.state.memory.kv_tokens, self.max_req_input_len,
                                        self.state.startup_time)

    async def Generate(self, request: pb.GenerateRequest, context: Any
                       ) -> AsyncIterator[pb.GenerateResponse]:
        rid = request.request_id
        logger.info(f"Receive generation request: {rid}")
        try:
            if not request.HasField("tokenized"):
                raise ValueError("Tokenized input must be provided")
            if request.return_hidden_states:
                raise ValueError(grpc_info.hidden_states_refusal(self.raw))
        except ValueError as error:
            logger.warning(f"Generate invalid request {rid}: {error}")
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(error))
        ids = list(request.tokenized.input_ids)
        if len(ids) >= self.max_req_input_len:  # the scheduler's abort, status 400
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, (
                f"Input length ({len(ids)} tokens) exceeds the maximum allowed length "
                f"({self.max_req_input_len} tokens). Use a shorter input or enable "
                "--allow-auto-truncate."))
        text = self.tokenizer.decode(ids) if self.tokenizer else request.tokenized.original_text
        sp = request.sampling_params
        room = self.max_req_len - len(ids) - 1
        wanted = sp.max_new_tokens if sp.HasField("max_new_tokens") else UNBOUNDED
        job = _Job(ids, text, max(min(wanted, room), 0), request.stream,
                   request.require_reasoning and bool(self.think_end))
        try:
            async for frame in self._frames(rid, job, sp.n):
                yield frame
        except _Refused as refused:
            await context.abort(refused.code, str(refused))

    async def _frames(self, rid: str, job: _Job, n: int) -> AsyncIterator[pb.GenerateResponse]:
        """generate_request: one scheduler request, or n > 1 after a prefill-only prefix."""
        if n <= 1:
            async for frame in self._one(rid, job, 0, None):
                yield frame
            return
        async for _ in self._one(f"{rid}-prefix", _Job(job.ids, job.text, 0, False, False),
                                 0, None):
            pass
        if not job.stream:  # each sub-request after the one before; the answers in order
            answers: list[pb.GenerateResponse | _Refused] = []
            for i in range(n):
                try:
                    answers += [frame async for frame in self._one(f"{rid}-{i}", job, 0, i)]
                except _Refused as refused:
                    answers.append(refused)
            for answer in answers:
                if isinstance(answer, _Refused):
                    raise answer
                answer.request_id = rid
                yield answer
            return
        frames: asyncio.Queue[tuple[int, pb.GenerateResponse | Exception | None]] = (
            asyncio.Queue())

        async def sub(i: int) -> None:
            try:
                async for frame in self._one(f"{rid}-{i}", job, i, i):
                    frame.request_id = rid
                    await frames.put((i, frame))
            except _Refused as refused:
                await frames.put((i, refused))
            finally:
                await frames.put((i, None))

        tasks = [asyncio.create_task(sub(i)) for i in range(n)]
        try:
            done = 0
            while done < n:
                _, item = await frames.get()
                if item is None:
                    done += 1
                elif isinstance(item, Exception):
                    raise item
                else:
                    yield item
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _one(self, rid: str, job: _Job, index: int, seed: int | None
                   ) -> AsyncIterator[pb.GenerateResponse]:
        """One scheduler request: chunks as it decodes (streaming), then its complete."""
        live = self.live[rid] = _Live(len(job.ids))
        think = job.text.endswith(THINK_OPEN)
        out = self.state.dispatch.compose(job.text, job.max_new, think, seed)
        groups = self._token_groups(out, think)
        sent: list[int] = []
        new: list[int] = []
        words = 0
        chunked = False
        finish = out.finish_reason
        run = cast(AsyncGenerator[int, None],
                   self.state.dispatch.run(rid, len(job.ids), out, job.stream))
        try:
            async with contextlib.aclosing(run) as steps:
                while (n := await self._step(rid, steps, live)) is not None and n != DROPPED:
                    self.last_receive_tstamp = time.time()
                    new = [i for group in groups[words:words + n] for i in group]
                    words += n
                    if (words >= len(groups) and out.finish_reason == "stop"
                            and self._eos is not None):
                        new.append(self._eos)
                    sent += new
                    if live.finished:
                        break  # outputs of a request aborted here are skipped
                    if live.finish or live.dropped.is_set():
                        finish = "abort"  # FINISH_ABORT after this step
                    if job.stream:
                        chunked = True
                        yield pb.GenerateResponse(request_id=rid, chunk=self._chunk(
                            new, len(job.ids), len(sent), self._reasoning(job, sent), index))
                    if finish == "abort":
                        break
            if n == DROPPED:
                if self._skip_tokenizer:  # the AbortReq reaches the output loop
                    raise _Refused(grpc.StatusCode.INTERNAL, "Request aborted")
                live.finished = True
            elif n is None and live.finish and not sent:  # aborted in its prefill-only pass
                finish = "abort"
            if live.finished:
                await asyncio.Event().wait()  # nothing more for this stream: the client ends it
            if job.stream and not chunked:  # the finished output is a chunk too
                yield pb.GenerateResponse(request_id=rid, chunk=self._chunk(
                    [], len(job.ids), 0, 0, index))
            yield pb.GenerateResponse(request_id=rid, complete=self._complete(
                new if job.stream else sent, finish, job, sent, index))
        except asyncio.CancelledError:
            if not live.cancelled:
                self._client_cancelled(rid, live)
            raise
        finally:
            if self.live.get(rid) is live:
                del self.live[rid]

    async def _step(self, rid: str, steps: AsyncIterator[int], live: _Live) -> int | None:
        """The request's next step (tokens made), None at its end; while it may still be
        queued, DROPPED when an abort takes it off the queue first."""
        if live.started:
            return await anext(steps, None)
        step = asyncio.ensure_future(anext(steps, None))
        dropped = asyncio.ensure_future(live.dropped.wait())
        try:
            await asyncio.wait((step, dropped), return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            self._client_cancelled(rid, live)  # while it is still where it was
            raise
        finally:
            dropped.cancel()
            if not step.done():
                step.cancel()  # the engine lets it go: out of the queue, its slot released
                await asyncio.gather(step, return_exceptions=True)
        if step.cancelled():
            return DROPPED
        live.started = True
        return step.result()

    def _client_cancelled(self, rid: str, live: _Live) -> None:
        """_handle_single_request on a cancel: the line, and the request aborted."""
        live.cancelled = True
        manager_log.info(f"Request {rid} cancelled by client")
        self._abort_at_schedulers(rid)

    def _abort_at_schedulers(self, prefix: str) -> None:
        """Scheduler.abort_request for AbortReq(rid=prefix): every request whose id starts
        with it. A queued one is popped and an AbortReq sent back, which the manager's
        tokenizer socket does not know (with --skip-tokenizer-init its output loop does); a
        running one gets to_finish = FINISH_ABORT() (its next step is its last)."""
        queued = self._queued_rids()
        for rid, live in list(self.live.items()):
            if not rid.startswith(prefix):
                continue
            if rid in queued:
                live.dropped.set()
                if not self._skip_tokenizer:
                    manager_log.warning("Unknown type on tokenizer socket: "
                                        "<class 'sglang.srt.managers.io_struct.AbortReq'>")
            else:
                live.finish = True

    def _queued_rids(self, engines: list[Engine] | None = None) -> list[str]:
        """The requests in the waiting queues: an engine admits in arrival order (its slots are
        a fair semaphore), so they are the last ``queued`` of its unfinished requests."""
        return [rid for engine in engines or self.state.dispatch.engines
                for rid in (engine.rids[len(engine.rids) - engine.queued:]
                            if engine.queued else [])]

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

    def _reasoning(self, job: _Job, sent: list[int]) -> int:
        """Req.reasoning_tokens: with require_reasoning, the ids up to and including the
        parser's think end (every id while it has not come); else 0."""
        if not job.reasoning:
            return 0
        end = self.think_end
        for i in range(len(sent) - len(end) + 1):
            if sent[i:i + len(end)] == end:
                return i + len(end)
        return len(sent)

    @staticmethod
    def _chunk(ids: list[int], prompt: int, completion: int, reasoning: int, index: int
               ) -> pb.GenerateStreamChunk:
        return pb.GenerateStreamChunk(token_ids=ids, prompt_tokens=prompt,
                                      completion_tokens=completion, cached_tokens=0,
                                      reasoning_tokens=reasoning, index=index)

    def _complete(self, ids: list[int], finish: str, job: _Job, sent: list[int], index: int
                  ) -> pb.GenerateComplete:
        done = pb.GenerateComplete(output_ids=ids, finish_reason=finish,
                                   prompt_tokens=len(job.ids), completion_tokens=len(sent),
                                   cached_tokens=0, reasoning_tokens=self._reasoning(job, sent),
                                   index=index)
        if finish == "stop" and self._eos is not None:
            done.matched_token_id = self._eos
        return done

    async def HealthCheck(self, request: pb.HealthCheckRequest, context: Any
                          ) -> pb.HealthCheckResponse:
        rid = f"HEALTH_CHECK_{time.time()}"
        logger.info(f"Receive health check request: {rid}")
        if self.gracefully_exit:
            logger.info("Health check request received during shutdown. Returning unhealthy.")
            return pb.HealthCheckResponse(healthy=False, message="Server is shutting down")
        self.probes.add(rid)
        try:
            await asyncio.sleep(0.5)  # the probe's first poll
            if await self.state.health_generation():
                return pb.HealthCheckResponse(healthy=True, message="Health check passed")
        finally:
            self.probes.discard(rid)
        timeout = f"Health check timeout after {self.state.health_timeout:g}s"
        logger.warning(timeout)
        return pb.HealthCheckResponse(healthy=False, message=timeout)

    async def Abort(self, request: pb.AbortRequest, context: Any) -> pb.AbortResponse:
        rid = request.request_id
        logger.info(f"Receive abort request: {rid}")
        if rid.startswith("HEALTH_CHECK"):
            return pb.AbortResponse(success=False, message=f"Request {rid} not found")
        if rid in self.live:
            self.live[rid].finished = True
        self._abort_at_schedulers(rid)
        return pb.AbortResponse(success=True, message=f"Request {rid} aborted")

    async def GetModelInfo(self, request: pb.GetModelInfoRequest, context: Any
                           ) -> pb.GetModelInfoResponse:
        raw = self.raw
        return pb.GetModelInfoResponse(
            model_path=raw.model_path, tokenizer_path=raw.tokenizer_path or "",
            is_generation=not getattr(raw, "is_embedding", False),
            preferred_sampling_params=grpc_info.preferred_sampling_params_json(raw),
            default_sampling_params_json=grpc_info.default_sampling_params_json(raw),
            weight_version=getattr(raw, "weight_version", None) or "default",
            served_model_name=raw.served_model_name or "",
            max_context_length=self.state.memory.kv_tokens, vocab_size=DEFAULT_VOCAB_SIZE,
            model_type=str(self.config.get("model_type", "")),
            architectures=list(self.config.get("architectures", [])),
            pad_token_id=0, bos_token_id=1, max_req_input_len=self.max_req_input_len)

    async def GetServerInfo(self, request: pb.GetServerInfoRequest, context: Any
                            ) -> pb.GetServerInfoResponse:
        args = {k: plain(v) for k, v in vars(self.raw).items()}
        grpc_info.server_args_labels(self.raw, args)
        if not args.get("max_running_requests"):
            window = min(plan.max_running_requests for plan in self.state.memories)
            if not self._window_logged:
                logger.info(f"max_running_requests is unset: reporting the scheduler's "
                            f"computed window {window}")
                self._window_logged = True
            args["max_running_requests"] = window
        server_args, scheduler_info = Struct(), Struct()
        server_args.update(args)
        scheduler_info.update(self.ready_report())
        return pb.GetServerInfoResponse(
            server_args=server_args, scheduler_info=scheduler_info,
            active_requests=len(self.rid_to_state), is_paused=False,
            last_receive_timestamp=self.last_receive_tstamp,
            uptime_seconds=time.time() - self.started,
            sglang_version=self.state.release, server_type="grpc",
            start_time=Timestamp(seconds=int(self.started)),
            max_total_num_tokens=self.state.memory.kv_tokens)

    async def GetLoads(self, request: pb.GetLoadsRequest, context: Any) -> pb.GetLoadsResponse:
        def waiting(engine: Engine) -> int:  # its waiting queue's prompt tokens
            return sum(self.live[rid].prompt for rid in self._queued_rids([engine])
                       if rid in self.live)

        try:
            return grpc_info.loads(self.state, list(request.include) or ["all"],
                                   request.dp_rank if request.HasField("dp_rank") else None,
                                   waiting, self.controls.spec_base)
        except ValueError as error:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(error))
            raise

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
        return await self.controls.flush(request.timeout_s, context)

    async def StartProfile(self, request: common_pb2.StartProfileRequest, context: Any
                           ) -> common_pb2.ProfileResponse:
        return self.controls.start_profile(
            request.output_dir if request.HasField("output_dir") else None)

    async def StopProfile(self, request: common_pb2.StopProfileRequest, context: Any
                          ) -> common_pb2.ProfileResponse:
        return self.controls.stop_profile()

    async def SubscribeKvEvents(self, request: Any, context: Any) -> AsyncIterator[Any]:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, (
            "KV cache events not enabled. Start SGLang with --kv-events-config "
            "'{\"publisher\": \"zmq\"}'"))
        yield  # an async generator, as the stream RPC is
