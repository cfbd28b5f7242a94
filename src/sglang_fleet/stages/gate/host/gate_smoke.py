"""The gate's smoke generation: one streamed chat completion (time to first token, tokens/s)
and one with ``return_meta_info`` (the speculative accept length), coping with reasoning
models; ``sglang-fleet smoke`` runs the same against any server.

    s = smoke("http://127.0.0.1:30000", key, "qwen", version="0.5.23")
    describe(s)       # "smoke: '4', TTFT 38 ms, 112 tok/s, accept length 2.71"
"""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request
from typing import Any

from .gate_http import NO_ANSWER, OPENER, GateError, answered, error_answer, no_answer, request

SMOKE_PROMPT = "What is 2+2? Answer with the number only."
META_INFO_FROM = (0, 5, 13)  # entrypoints/openai/protocol.py: return_meta_info first in 0.5.13


def meta_info_reported(version: str | None) -> bool | None:
    """Whether the release answers ``return_meta_info`` (None: release unknown).

        meta_info_reported("0.5.12")  # -> False
    """
    m = re.match(r"(\d+)\.(\d+)\.(\d+)", version or "")
    return None if not m else tuple(int(x) for x in m.groups()) >= META_INFO_FROM


def smoke(url: str, key: str | None, model: str, version: str | None = None) -> dict[str, Any]:
    """One streamed chat completion (TTFT, tokens/s) and one with meta_info (accept length).
    A reasoning model may answer with content null or "" and everything in reasoning_content."""
    body = {"model": model, "messages": [{"role": "user", "content": SMOKE_PROMPT}],
            "max_tokens": 512, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {key or ''}"}
    tic = time.monotonic()
    first = None
    content: list[str] = []
    reasoning: list[str] = []
    usage: dict[str, Any] = {}
    where = f"{url}/v1/chat/completions"
    try:
        req = urllib.request.Request(where, data=json.dumps(body).encode(), headers=headers)
        with OPENER.open(req, timeout=300) as resp:
            for raw in resp:
                chunk = _chunk(raw, where)
                if chunk is None:
                    continue
                usage = chunk.get("usage") or usage
                for choice in chunk.get("choices") or []:
                    delta = (choice.get("delta") if isinstance(choice, dict) else None) or {}
                    text, think = delta.get("content"), delta.get("reasoning_content")
                    if (text or think) and first is None:
                        first = time.monotonic()
                    content.append(text if isinstance(text, str) else "")
                    reasoning.append(think if isinstance(think, str) else "")
    except urllib.error.HTTPError as err:
        raise GateError(f"{where} {answered(*error_answer(err))}") from None
    except NO_ANSWER as exc:
        raise GateError(f"{where} {answered(0, no_answer(exc).encode())}") from None
    except (AttributeError, TypeError):  # a chunk, choice or delta of the wrong JSON type
        raise GateError(f"{where}: the stream is not OpenAI chat completion chunks") from None
    end = time.monotonic()
    answer, thought = "".join(content).strip(), "".join(reasoning).strip()
    if not answer and not thought:
        raise GateError(f"smoke generation returned nothing: {where} streamed no content "
                        "and no reasoning")
    sane = "4" in answer or (not answer and bool(thought))
    if not sane:  # before the second request: the first answer is already wrong
        raise GateError(f"smoke answer is not sane: {answer[:80]!r}")
    count = usage.get("completion_tokens") if isinstance(usage, dict) else None
    tokens = count if isinstance(count, int) and not isinstance(count, bool) else 0
    status, raw = request(f"{url}/v1/chat/completions", key, {
        "model": model, "messages": [{"role": "user", "content": SMOKE_PROMPT}],
        "max_tokens": 64, "temperature": 0, "return_meta_info": True}, timeout=300)
    meta = meta_info(status, raw, where)
    return {"answer": answer[:80], "reasoning_chars": len(thought),
            "sane": sane,
            "ttft_s": round((first or end) - tic, 3), "tokens": tokens,
            "tokens_per_s": round(tokens / max(end - (first or tic), 1e-3), 1),
            "accept_length": meta.get("spec_accept_length"),
            "meta_info": meta_info_reported(version) if not meta else True,
            "version": version}


def meta_info(status: int, raw: bytes, where: str) -> dict[str, Any]:
    """The meta_info of the answer to the smoke's ``return_meta_info`` request: {} for a chat
    completion without one ("not reported"); a GateError for a broken answer, which is not a
    missing feature.

        meta_info(200, b'{"choices": [{"message": {}}]}', "u")   # {}
        meta_info(200, b'<html>', "u")                           # GateError
    """
    what = f"{where} (return_meta_info)"
    if status != 200:
        raise GateError(f"{what} {answered(status, raw)}")
    try:
        body = json.loads(raw)
    except ValueError:
        body = None
    choices = body.get("choices") if isinstance(body, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise GateError(f"{what} answered 200 but not a chat completion: {raw[:80]!r}")
    meta = choices[0].get("meta_info")
    if meta is None:
        return {}
    if not isinstance(meta, dict):
        raise GateError(f"{what}: meta_info is {type(meta).__name__}, not an object")
    accept = meta.get("spec_accept_length")
    if accept is not None and (isinstance(accept, bool) or not isinstance(accept, int | float)):
        raise GateError(f"{what}: spec_accept_length is {accept!r}, not a number")
    return meta


def accept_text(s: dict[str, Any]) -> str:
    """The accept length, or why there is none."""
    if s.get("accept_length"):
        return f", accept length {s['accept_length']:.2f}"
    if s.get("meta_info") is False:
        return (f", accept length not reported by this release (SGLang {s.get('version')}: "
                "return_meta_info arrived in 0.5.13)")
    if s.get("meta_info") is None:
        return ", accept length not reported by this server (no meta_info)"
    return ""


def _chunk(raw: bytes, where: str) -> dict[str, Any] | None:
    """One server-sent event line of a chat completion stream (None for other lines)."""
    try:
        line = raw.decode().strip()
    except UnicodeDecodeError:
        raise GateError(f"{where}: the stream is not UTF-8 text") from None
    if not line.startswith("data: ") or line == "data: [DONE]":
        return None
    try:
        chunk = json.loads(line[6:])
    except ValueError:
        raise GateError(f"{where}: a stream line is not JSON: {line[6:86]!r}") from None
    if not isinstance(chunk, dict):
        raise GateError(f"{where}: a stream chunk is {type(chunk).__name__}, not an object")
    return chunk


def describe(s: dict[str, Any]) -> str:
    accept = accept_text(s)
    return (f"smoke: {s['answer'] or '(reasoning only)'!r}, TTFT {s['ttft_s'] * 1000:.0f} ms, "
            f"{s['tokens_per_s']:.0f} tok/s{accept}")
