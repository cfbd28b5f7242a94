"""The gate's gRPC, for a server in gRPC mode (``--smg-grpc-mode``): the twins of its HTTP
requests, as calls of ``sglang.grpc.scheduler.SglangScheduler`` (smg-grpc-proto). Run with the
release's Python, whose environment holds grpcio and smg-grpc-proto. Every way of getting no
answer is a ``GateError`` saying it in one line.

    with Scheduler("127.0.0.1:30000") as server:
        server.health(25)                              # (True, 'Health check passed')
        server.server_info()["version"]                # '0.5.23'
        server.generate([9707, 11], 16).completion_tokens   # 16
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from .gate_http import GateError

SERVICE = "sglang.grpc.scheduler.SglangScheduler"


def _pb() -> Any:
    from smg_grpc_proto import sglang_scheduler_pb2 as pb

    return pb


class CallFailed(GateError):
    """A call that got no answer; ``status``: its gRPC status's name, or the exception's."""

    def __init__(self, message: str, status: str) -> None:
        super().__init__(message)
        self.status = status


def failed_call(target: str, method: str, exc: Exception) -> CallFailed:
    """One line for a call that got no answer: its status and details (``UNAVAILABLE:
    failed to connect``), or the exception's own words."""
    code, details = getattr(exc, "code", None), getattr(exc, "details", None)
    if callable(code) and callable(details):
        name, text = str(getattr(code(), "name", code())), details() or ""
    else:
        name, text = type(exc).__name__, str(exc)
    return CallFailed(f"{target} {SERVICE}/{method}: {name}: {text[:200]}", name)


def _whole(value: Any) -> Any:
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, list):
        return [_whole(v) for v in value]
    return value


@dataclass
class Generated:
    """One ``Generate`` call's answer, streamed: its tokens and when the first came."""

    output_ids: list[int] = field(default_factory=list)
    finish_reason: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    reasoning_tokens: int = 0
    first_token_s: float | None = None  # after the call began
    seconds: float = 0.0


class Scheduler:
    """One channel to a gRPC-mode server at ``target`` (HOST:PORT, no TLS, no key: the
    servicer binds ``add_insecure_port`` and reads no metadata), closed on leaving the block;
    safe to share between threads (the soak's)."""

    def __init__(self, target: str) -> None:
        import grpc  # the release's: only a gRPC gate needs it
        from smg_grpc_proto import sglang_scheduler_pb2_grpc as pb_grpc

        self.target = target
        self.channel = grpc.insecure_channel(target)
        self.stub = pb_grpc.SglangSchedulerStub(self.channel)

    def __enter__(self) -> Scheduler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.channel.close()

    def ready(self, timeout: float = 5) -> bool:
        """The readiness probe: ``grpc.health.v1.Health/Check``, SERVING only once the servicer's
    planned warm-up ran (its ``HealthCheck`` passes during the warm-up)."""
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        try:
            answer = health_pb2_grpc.HealthStub(self.channel).Check(
                health_pb2.HealthCheckRequest(service=SERVICE), timeout=timeout)
        except Exception:  # no answer yet: not ready
            return False
        return bool(answer.status == health_pb2.HealthCheckResponse.SERVING)

    def health(self, timeout: float = 25) -> tuple[bool, str]:
        """``HealthCheck``: the servicer generates one token as ``/health_generate`` does and
        says whether it came, and why not; (False, the call's status) when no answer came."""
        try:
            answer = self.stub.HealthCheck(_pb().HealthCheckRequest(), timeout=timeout)
        except Exception as exc:  # grpc.RpcError, and the channel's own errors
            return False, str(failed_call(self.target, "HealthCheck", exc))
        return bool(answer.healthy), str(answer.message)

    def _call(self, method: str, request: Any, timeout: float) -> Any:
        try:
            return getattr(self.stub, method)(request, timeout=timeout)
        except Exception as exc:  # grpc.RpcError, and the channel's own errors
            raise failed_call(self.target, method, exc) from None

    def server_info(self, timeout: float = 25) -> dict[str, Any]:
        """``GetServerInfo``: the effective server arguments, keyed as ``/server_info`` keys
        them, and ``version``. A Struct holds numbers as floats: whole ones come back as int,
        as /server_info's JSON has them."""
        from google.protobuf.json_format import MessageToDict

        answer = self._call("GetServerInfo", _pb().GetServerInfoRequest(), timeout)
        args = {k: _whole(v) for k, v in MessageToDict(answer.server_args).items()}
        return {**args, "version": answer.sglang_version}

    def generate(self, input_ids: list[int], max_new_tokens: int, timeout: float = 300,
                 stream: bool = True) -> Generated:
        """``Generate`` with a tokenized prompt, greedy: the chunks' tokens, then the complete
        frame's counts and finish reason. A call ended by a status is a ``GateError``."""
        pb = _pb()
        params = pb.SamplingParams(temperature=0.0, top_p=1.0, top_k=-1,
                                   repetition_penalty=1.0, max_new_tokens=max_new_tokens,
                                   skip_special_tokens=True,
                                   spaces_between_special_tokens=True, n=1)
        request = pb.GenerateRequest(request_id=f"gate-{uuid.uuid4().hex}",
                                     tokenized=pb.TokenizedInput(input_ids=input_ids),
                                     sampling_params=params, stream=stream)
        out = Generated()
        tic = time.monotonic()
        try:
            for frame in self.stub.Generate(request, timeout=timeout):
                kind = frame.WhichOneof("response")
                if kind == "chunk":
                    if frame.chunk.token_ids and out.first_token_s is None:
                        out.first_token_s = time.monotonic() - tic
                    out.output_ids += list(frame.chunk.token_ids)
                elif kind == "complete":
                    done = frame.complete
                    if not stream:
                        out.output_ids = list(done.output_ids)
                    out.finish_reason = done.finish_reason
                    out.prompt_tokens = done.prompt_tokens
                    out.completion_tokens = done.completion_tokens
                    out.reasoning_tokens = done.reasoning_tokens
        except Exception as exc:
            raise failed_call(self.target, "Generate", exc) from None
        out.seconds = time.monotonic() - tic
        if not out.finish_reason:
            raise GateError(f"{self.target} {SERVICE}/Generate: the stream ended without its "
                            "complete frame")
        return out

    def queued(self, timeout: float = 10) -> int:
        """``GetLoads``: requests running and waiting over every DP rank (a drain's figure)."""
        answer = self._call("GetLoads", _pb().GetLoadsRequest(include=["core"]), timeout)
        return sum(load.num_running_reqs + load.num_waiting_reqs for load in answer.loads)
