"""The two input formats and what each writes: a job's first request line sets its format.

- ``chat`` (sglang-fleet's own): a chat request per line (``messages``, optional ``id``), a
  ``{"prompt": ...}`` or a bare JSON string (source.parse_line); records
  ``{id, request_sha256, reasoning_content, content, ...}`` (completion.to_record).
- ``openai-batch``: the OpenAI Batch API's input file, which ``vllm run-batch`` reads too:
  ``{"custom_id", "method": "POST", "url": "/v1/chat/completions", "body": {chat request}}``;
  records and failures in its output and error files' form.

The batch forms follow OpenAI's OpenAPI description (openai/openai-openapi, openapi.yaml at
498c71dd, lines 17413-17486: ``BatchRequestInput``, ``BatchRequestOutput``; ``Batch.errors``,
lines 17273-17298, is where ``line`` is OpenAI's own name for the input line number), vLLM's
``vllm/entrypoints/openai/run_batch.py`` (vllm-project/vllm at 0056ae7b: ``BatchRequestInput``,
``BatchResponseData``, ``BatchRequestOutput``, ``run_request``) and SGLang's own batch endpoint
while it had one (sglang 0.4.6.post5, srt/openai_api/adapter.py:369 and :380, ``"id":
f"batch_req_{uuid}"``; :1387-1388, ``"request_id"`` is the request's rid, the completion's
``id`` — the name SGLang's logs give the request). A record:

    {"id": "batch_req_<32 hex>", "custom_id": "request-1",
     "response": {"status_code": 200, "request_id": "<the completion's id>",
                  "body": <the server's whole chat completion>},
     "error": null, "request_sha256": "<sha256 of the body sent>"}

A failure: ``response`` null, or the last answer's status, ``request_id`` null (an error
answer names no request) and body; ``error`` ``{"code", "message"}`` (OpenAI sets ``error`` only
for failures other than an HTTP one; here every failure has it, so ``error`` is null exactly
when the line has its record); and ``line`` (from 1) and ``tries``, which ``--retry-failures``
and a resumed job read back.

    fmt = detect(0, b'{"custom_id": "a", "method": "POST", ...}', "in.jsonl")  # OPENAI_BATCH
    item = fmt.parse(0, raw, "in.jsonl", "qwen3.6-27b")
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import IO, Any

from sglang_fleet_generate.completion import Build, Outcome, to_record
from sglang_fleet_generate.errors import GenerateError
from sglang_fleet_generate.source import (
    Item,
    LineError,
    is_text,
    line_id,
    load_line,
    make_item,
    open_input,
    parse_line,
)

CHAT_URL = "/v1/chat/completions"
CHAT_SHAPE = '{"messages": [...]}, {"prompt": "..."} or a JSON string'
BATCH_SHAPE = ('{"custom_id": "...", "method": "POST", "url": "/v1/chat/completions", '
               '"body": {"messages": [...]}}')
FORMAT_KEY = "format"
Failure = Callable[[str, int, str | None, Outcome], dict[str, Any]]


@dataclass(frozen=True)
class Format:
    """How a format's lines are read (``parse``, ``line_id``) and its records and failures
    written (``record``, ``failure``): one function each, so a key is added in one place."""

    name: str
    parse: Callable[[int, bytes, str, str | None], Item]
    line_id: Callable[[int, bytes], str]
    record: Build
    failure: Failure


def shown(value: Any) -> str:
    """A value of the input in a message: its repr (control characters escaped), cut short."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def describe(doc: Any) -> str:
    """What a line holds, for a message. Example: describe([1]) == "a list"."""
    if isinstance(doc, dict):
        keys = ", ".join(shown(k) for k in list(doc)[:6]) + (", ..." if len(doc) > 6 else "")
        return f"an object with keys {keys}" if doc else "an empty object"
    names = {list: "a list", str: "a string", bool: "a boolean", type(None): "null"}
    return names.get(type(doc), "a number")


# ---- chat ------------------------------------------------------------------------------------
def chat_failure(ident: str, lineno: int, sha: str | None, outcome: Outcome) -> dict[str, Any]:
    """A chat line without a record: its id, line number (from 1), error and tries."""
    return {"id": ident, "line": lineno + 1, "request_sha256": sha, "error": outcome.error,
            "tries": outcome.tries}


# ---- OpenAI Batch ----------------------------------------------------------------------------
def batch_request(doc: Any, where: str) -> tuple[str, dict[str, Any]]:
    """(custom_id, body) of a batch line's JSON, or LineError naming the field and the fix."""
    if not isinstance(doc, dict):
        raise LineError(f"{where}: {describe(doc)}, not an OpenAI Batch request; write "
                        + BATCH_SHAPE)
    if "custom_id" not in doc:
        chat = ("; it is a chat request, but the input's first line is an OpenAI Batch "
                "request: one input holds one format") if "messages" in doc else ""
        raise LineError(f"{where}: no key 'custom_id'; write {BATCH_SHAPE}{chat}")
    ident = doc["custom_id"]
    if not isinstance(ident, str) or not ident:
        raise LineError(f"{where}: key 'custom_id' must be a non-empty string, not "
                        f"{shown(ident)}")
    if not is_text(ident):
        raise LineError(f"{where}: key 'custom_id' holds a lone surrogate, which is not text")
    if doc.get("method") != "POST":
        raise LineError(f"{where}: key 'method' is {shown(doc.get('method'))}; write "
                        '"method": "POST" (a batch request is a POST)')
    if doc.get("url") != CHAT_URL:
        raise LineError(f"{where}: key 'url' is {shown(doc.get('url'))}; write \"url\": "
                        f'"{CHAT_URL}" (the one endpoint a job sends to)')
    body = doc.get("body")
    if not isinstance(body, dict):
        raise LineError(f"{where}: key 'body' must be an object (the chat request), not "
                        f"{describe(body)}")
    if not isinstance(body.get("messages"), list) or not body["messages"]:
        raise LineError(f"{where}: key 'body.messages' must be a non-empty list")
    return ident, body


def parse_batch_line(lineno: int, raw: bytes, source: str, model: str | None) -> Item:
    """The request a batch line holds: its ``body``, ``custom_id`` its id.

    Example: parse_batch_line(0, b'{"custom_id": "a", "method": "POST", "url":
    "/v1/chat/completions", "body": {"messages": [{"role": "user", "content": "hi"}]}}',
    "in.jsonl", "m").body == b'{"messages":[{"content":"hi","role":"user"}],"model":"m"}'
    """
    where = f"{source} line {lineno + 1}"
    ident, body = batch_request(load_line(raw, where), where)
    return make_item(ident, dict(body), model, where)


def batch_line_id(lineno: int, raw: bytes) -> str:
    """A batch line's ``custom_id``, else ``line-N`` (from 1)."""
    return line_id(lineno, raw, "custom_id")


def new_id() -> str:
    """An output line's own id, as OpenAI's and SGLang's: ``batch_req_`` and 32 hex digits."""
    return f"batch_req_{uuid.uuid4().hex}"


def batch_record(item: Item, answer: Any, latency: float, server: str) -> dict[str, Any]:
    """The output line of a 200 answer: the whole completion is the body. (``latency`` and
    ``server``: the chat record's, not in OpenAI's form.)"""
    if not isinstance(answer, dict) or not isinstance(answer.get("choices"), list) \
            or not answer["choices"]:
        raise TypeError("a chat completion has a non-empty 'choices' list")
    request_id = answer.get("id")
    return {"id": new_id(), "custom_id": item.id,
            "response": {"status_code": 200,
                         "request_id": request_id if isinstance(request_id, str) else None,
                         "body": answer},
            "error": None, "request_sha256": item.sha256}


def batch_failure(ident: str, lineno: int, sha: str | None, outcome: Outcome) -> dict[str, Any]:
    """The error file's line for a request without a record (see the module docstring)."""
    response = None if outcome.status is None else {
        "status_code": outcome.status, "request_id": None, "body": outcome.body}
    return {"id": new_id(), "custom_id": ident, "response": response,
            "error": {"code": outcome.code or "failed", "message": outcome.error},
            "line": lineno + 1, "tries": outcome.tries, "request_sha256": sha}


CHAT = Format("chat", parse_line, line_id, to_record, chat_failure)
OPENAI_BATCH = Format("openai-batch", parse_batch_line, batch_line_id, batch_record,
                      batch_failure)
FORMATS = {f.name: f for f in (CHAT, OPENAI_BATCH)}


# ---- the input's format ----------------------------------------------------------------------
def detect(lineno: int, raw: bytes, source: str) -> Format:
    """The format of a job from its first non-blank line, or GenerateError (one line: what the
    line is and what each format looks like).

    Example: detect(0, b'"a prompt"', "in.jsonl") is CHAT
    """
    try:
        doc = json.loads(raw)
    except ValueError as exc:
        what = f"not JSON ({exc})"
    else:
        if isinstance(doc, dict) and "custom_id" in doc and "body" in doc:
            return OPENAI_BATCH
        if isinstance(doc, str) or (isinstance(doc, dict) and ("messages" in doc
                                                               or "prompt" in doc)):
            return CHAT
        what = describe(doc)
    raise GenerateError(f"{source} line {lineno + 1}: {what}; the first line sets the input's "
                        f"format: a chat request ({CHAT_SHAPE}) or an OpenAI Batch request "
                        f"({BATCH_SHAPE})")


@dataclass
class Input:
    """The input, opened, its format read from its first non-blank line (None: it has none),
    and its lines from the first (the lines read to find it are given again)."""

    stream: IO[bytes]
    lines: Iterator[bytes]
    format: Format | None

    def close(self) -> None:
        self.stream.close()


def open_detected(source: str, s3: Any) -> Input:
    """Open the input and read as far as its first non-blank line: a line of no format is
    refused here, before a request is sent or the output is touched."""
    stream = open_input(source, s3)
    head: list[bytes] = []
    try:
        for raw in stream:
            head.append(raw)
            if raw.strip():
                fmt = detect(len(head) - 1, raw, source)
                return Input(stream, _chain(head, stream), fmt)
    except BaseException:
        stream.close()
        raise
    return Input(stream, iter(head), None)


def _chain(head: list[bytes], stream: IO[bytes]) -> Iterator[bytes]:
    yield from head
    yield from stream


def job_format(manifest: dict[str, Any], found: Format | None, where: str,
               source: str) -> Format:
    """The format of a job: the input's, which must be the one its manifest names (a manifest
    without one is a chat job's, written before there were two); an empty input's is the
    manifest's."""
    if not manifest:
        return found or CHAT
    recorded = FORMATS.get(manifest.get(FORMAT_KEY, CHAT.name))
    if recorded is None:
        raise GenerateError(f"{where}: format {shown(manifest.get(FORMAT_KEY))} is none this "
                            f"sglang-fleet knows ({', '.join(FORMATS)}); use the sglang-fleet "
                            "that wrote this job, or write to another output")
    if found is not None and found is not recorded:
        raise GenerateError(
            f"{source}: its lines are in the {found.name} format, but the job at {where} was "
            f"started with input in the {recorded.name} format\n    fix: give the job's own "
            "input (the same lines), or write this input to another output")
    return recorded
