"""SGLang's HTTP surface: health and readiness, server and model info, the OpenAI-compatible
chat and completion endpoints (streaming and not, with the reasoning split), /metrics, and the
API key, with SGLang's paths, status codes and JSON keys."""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from sglang_sim import metrics
from sglang_sim.args import release_tuple
from sglang_sim.engine import Engine, Output
from sglang_sim.state import State

logger = logging.getLogger("sglang.srt.entrypoints.http_server")
OPEN_PATHS = frozenset({"/health", "/health_generate", "/ready", "/metrics"})


def _json(content: Any, status: int = 200) -> Response:
    return Response(json.dumps(content, separators=(",", ":")), status,
                    media_type="application/json")


def _error(message: str, status: int = 400, kind: str = "BadRequestError") -> Response:
    return _json({"object": "error", "message": message, "type": kind, "param": None,
                  "code": status}, status)


def build_app(state: State) -> Starlette:
    engine: Engine = state.engine
    dispatch = state.dispatch
    args = state.args

    async def health(request: Request) -> Response:
        if state.draining:
            logger.info("Health check request received during shutdown. Returning 503.")
            return Response(status_code=503)
        if not state.up:
            return Response(status_code=503)
        if state.faults.health_timeout or not await state.health_generation():
            if state.faults.health_timeout:
                await state.sleep_health_timeout()
            logger.error("Health check failed. Server couldn't get a response from detokenizer "
                         f"for last {state.health_timeout:g} seconds.")
            state.unhealthy = True
            return Response(status_code=503)
        return Response(status_code=200)

    async def ready(request: Request) -> Response:
        return Response(status_code=200 if state.up and not state.draining
                        and not state.unhealthy else 503)

    async def server_info(request: Request) -> Response:
        if request.url.path == "/get_server_info":
            logger.warning("Endpoint '/get_server_info' is deprecated and will be removed in a "
                           "future version. Please use '/server_info' instead.")
        await state.internal_states_answered()
        return _json(state.server_info())

    async def model_info(request: Request) -> Response:
        if request.url.path == "/get_model_info":
            logger.warning("Endpoint '/get_model_info' is deprecated and will be removed in a "
                           "future version. Please use '/model_info' instead.")
        return _json(state.model_info())

    async def models(request: Request) -> Response:
        return _json({"object": "list", "data": [{
            "id": state.served_model_name, "object": "model", "created": int(state.startup_time),
            "owned_by": "sglang", "root": state.served_model_name, "parent": None,
            "max_model_len": state.memory.context_len}]})

    async def metrics_endpoint(request: Request) -> Response:
        if not args.enable_metrics:
            return _json({"detail": "Not Found"}, 404)
        return PlainTextResponse(metrics.render(state), media_type="text/plain; version=0.0.4")

    async def read_body(request: Request) -> dict[str, Any] | Response:
        try:
            body = json.loads(await request.body())
        except ValueError:
            return _error("Invalid JSON in request body")
        if not isinstance(body, dict):
            return _error("Request body must be a JSON object")
        return body

    def max_tokens(body: dict[str, Any]) -> int:
        value = body.get("max_completion_tokens") or body.get("max_tokens")
        return int(value) if value else min(state.memory.context_len, 32768)

    async def chat(request: Request) -> Response:
        body = await read_body(request)
        if isinstance(body, Response):
            return body
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            return _error("messages must be a non-empty list")
        prompt = "\n".join(str(m.get("content", "")) for m in messages if isinstance(m, dict))
        kwargs = body.get("chat_template_kwargs") or {}
        think = state.reasoning and kwargs.get("enable_thinking", True) is not False
        out = dispatch.compose(prompt, max_tokens(body), think, body.get("seed"))
        prompt_tokens = state.count_tokens(prompt) + 4 * len(messages)
        rid = uuid.uuid4().hex
        separate = body.get("separate_reasoning", True) and think
        if body.get("stream"):
            return StreamingResponse(
                chat_stream(rid, prompt_tokens, out, separate, body),
                media_type="text/event-stream")
        async for _ in dispatch.run(rid, prompt_tokens, out, streaming=False):
            pass
        reasoning = " ".join(out.reasoning)
        answer = " ".join(out.answer)
        if not separate and think:
            answer = f"<think>\n{reasoning}\n</think>\n\n{answer}" if reasoning else answer
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": state.content(answer),
                        "reasoning_content": (reasoning or None) if separate else None,
                        "tool_calls": None},
            "logprobs": None, "finish_reason": out.finish_reason,
            "matched_stop": state.eos_token_id if out.finish_reason == "stop" else None,
            "hidden_states": None, "prompt_token_ids": None, "response_token_ids": None,
            # return_meta_info arrived in 0.5.13 (entrypoints/openai/protocol.py); earlier
            # releases ignore the unknown field.
            "meta_info": meta_info(out) if body.get("return_meta_info") and meta_info_exists
            else None,
        }
        return _json({"id": rid, "object": "chat.completion", "created": int(time.time()),
                      "model": state.served_model_name, "choices": [choice],
                      "usage": usage(prompt_tokens, out), "metadata": {"weight_version":
                                                                       "default"},
                      "sglext": None})

    def usage(prompt_tokens: int, out: Output) -> dict[str, Any]:
        return {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens + out.tokens,
                "completion_tokens": out.tokens, "prompt_tokens_details": None,
                "reasoning_tokens": len(out.reasoning), "completion_tokens_details": None}

    meta_info_exists = release_tuple(state.release) >= (0, 5, 13, 0)

    def meta_info(out: Output) -> dict[str, Any]:
        steps = len(out.accept_lengths)
        accepted = sum(out.accept_lengths)
        draft = max(engine.draft_tokens - 1, 1)
        return {"spec_accept_length": accepted / steps if steps else 0.0,
                "spec_accept_rate": (accepted - steps) / (steps * draft) if steps else 0.0,
                "spec_verify_ct": steps, "completion_tokens": out.tokens}

    async def chat_stream(rid: str, prompt_tokens: int, out: Output, separate: bool,
                          body: dict[str, Any]) -> AsyncIterator[bytes]:
        created = int(time.time())

        def chunk(delta: dict[str, Any], finish: str | None = None,
                  use: dict[str, Any] | None = None) -> bytes:
            data = {"id": rid, "object": "chat.completion.chunk", "created": created,
                    "model": state.served_model_name,
                    "choices": [{"index": 0, "delta": {"role": None, "content": None,
                                                       "reasoning_content": None,
                                                       "tool_calls": None, **delta},
                                 "logprobs": None, "finish_reason": finish,
                                 "matched_stop": None}] if use is None else [],
                    "usage": use}
            return f"data: {json.dumps(data, separators=(',', ':'))}\n\n".encode()

        yield chunk({"role": "assistant", "content": ""})
        words = [("reasoning_content" if separate else "content", w) for w in out.reasoning]
        words += [("content", w) for w in out.answer]
        sent = 0
        async for n in dispatch.run(rid, prompt_tokens, out, streaming=True):
            piece = words[sent:sent + n]
            sent += n
            for key in ("reasoning_content", "content"):
                text = " ".join(w for k, w in piece if k == key)
                if text:
                    yield chunk({key: text + " "})
        yield chunk({}, out.finish_reason)
        if (body.get("stream_options") or {}).get("include_usage"):
            yield chunk({}, use=usage(prompt_tokens, out))
        yield b"data: [DONE]\n\n"

    async def completions(request: Request) -> Response:
        body = await read_body(request)
        if isinstance(body, Response):
            return body
        prompt = body.get("prompt")
        if not isinstance(prompt, str):
            return _error("prompt must be a string")
        out = dispatch.compose(prompt, max_tokens(body), False, body.get("seed"))
        prompt_tokens = state.count_tokens(prompt)
        rid = uuid.uuid4().hex
        if body.get("stream"):
            return StreamingResponse(completion_stream(rid, prompt_tokens, out),
                                     media_type="text/event-stream")
        async for _ in dispatch.run(rid, prompt_tokens, out, streaming=False):
            pass
        return _json({"id": rid, "object": "text_completion", "created": int(time.time()),
                      "model": state.served_model_name,
                      "choices": [{"index": 0, "text": " ".join(out.answer), "logprobs": None,
                                   "finish_reason": out.finish_reason,
                                   "matched_stop": state.eos_token_id
                                   if out.finish_reason == "stop" else None,
                                   "hidden_states": None, "token_ids": None,
                                   "prompt_token_ids": None}],
                      "usage": usage(prompt_tokens, out), "metadata": {"weight_version":
                                                                       "default"},
                      "sglext": None})

    async def completion_stream(rid: str, prompt_tokens: int, out: Output
                                ) -> AsyncIterator[bytes]:
        sent = 0
        async for n in dispatch.run(rid, prompt_tokens, out, streaming=True):
            text = " ".join(out.answer[sent:sent + n])
            sent += n
            data = {"id": rid, "object": "text_completion", "created": int(time.time()),
                    "model": state.served_model_name,
                    "choices": [{"index": 0, "text": text + " ", "logprobs": None,
                                 "finish_reason": None, "matched_stop": None}], "usage": None}
            yield f"data: {json.dumps(data, separators=(',', ':'))}\n\n".encode()
        data = {"id": rid, "object": "text_completion", "created": int(time.time()),
                "model": state.served_model_name,
                "choices": [{"index": 0, "text": "", "logprobs": None,
                             "finish_reason": out.finish_reason, "matched_stop": None}],
                "usage": None}
        yield f"data: {json.dumps(data, separators=(',', ':'))}\n\n".encode()
        yield b"data: [DONE]\n\n"

    routes = [
        Route("/health", health), Route("/health_generate", health), Route("/ready", ready),
        Route("/server_info", server_info), Route("/get_server_info", server_info),
        Route("/model_info", model_info), Route("/get_model_info", model_info),
        Route("/v1/models", models), Route("/metrics", metrics_endpoint),
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]),
    ]
    app = Starlette(routes=routes)
    if args.api_key:
        return ApiKey(app, args.api_key)  # type: ignore[return-value]
    return app


class ApiKey:
    """sglang.srt.utils.auth: a Bearer key on everything but health, readiness and metrics."""

    def __init__(self, app: Starlette, key: str) -> None:
        self.app = app
        self.expected = f"Bearer {key}".encode()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] not in OPEN_PATHS:
            headers = dict(scope["headers"])
            if headers.get(b"authorization") != self.expected:
                await _json({"error": "Unauthorized"}, 401)(scope, receive, send)
                return
        await self.app(scope, receive, send)
