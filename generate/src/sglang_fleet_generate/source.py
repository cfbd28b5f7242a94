"""The input: JSONL from a local path, ``s3://bucket/key`` or standard input (``-``), read in
batches of lines so that memory stays bounded whatever the input's size, and each line turned
into a chat request (the OpenAI Batch format's lines: batchformat.py).

    for batch in read_batches(open_input("prompts.jsonl", None)):
        for lineno, raw in batch: ...
    item = parse_line(7, b'{"id": "a", "messages": [...]}', "prompts.jsonl", "m")
"""

from __future__ import annotations

import hashlib
import io
import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from sglang_fleet_generate.errors import GenerateError

BATCH_LINES = 512
CONTROL_KEYS = frozenset({"id"})
STDIN = "-"


@dataclass(frozen=True)
class Item:
    """One request to send: its id, the body, and the sha256 of the body as sent."""

    id: str
    body: bytes
    sha256: str


class LineError(ValueError):
    """A line that is not a request; the message names the line and the fix."""


def split_s3(url: str) -> tuple[str, str]:
    """``s3://bucket/some/key`` -> ("bucket", "some/key")."""
    rest = url[len("s3://"):]
    bucket, _, key = rest.partition("/")
    if not bucket:
        raise GenerateError(f"{url}: no bucket; write s3://BUCKET/KEY")
    return bucket, key


def input_size(source: str, s3: Any) -> int | None:
    """Bytes in the input (for the progress bar), None if unknown (standard input: never a
    stat of a file that happens to be named ``-``)."""
    if source == STDIN:
        return None
    if source.startswith("s3://"):
        bucket, key = split_s3(source)
        return int(s3.head_object(Bucket=bucket, Key=key)["ContentLength"])
    return Path(source).stat().st_size


def open_input(source: str, s3: Any, what: str = "the input") -> IO[bytes]:
    """A binary stream over the input (or a file of the output: ``what`` in an error); S3
    objects are streamed, never loaded whole. ``-`` is standard input (fd 0, left open when
    the stream is closed); a terminal there is refused, as a job would wait on it for lines."""
    if source == STDIN:
        if os.isatty(0):
            raise GenerateError("-: standard input is a terminal; pipe the JSONL in, e.g. "
                                "sglang-fleet generate - OUTPUT --url URL < prompts.jsonl")
        return open(0, "rb", buffering=1 << 20, closefd=False)
    if source.startswith("s3://"):
        bucket, key = split_s3(source)
        try:
            body = s3.get_object(Bucket=bucket, Key=key)["Body"]
        except Exception as exc:  # botocore's errors carry the S3 code in their text
            raise GenerateError(f"{source}: cannot read {what}: {exc}") from None
        # urllib3's response under botocore's wrapper, buffered so that lines cost no
        # syscalls; auto_close off, or the buffer reads a closed stream at the end
        raw = body._raw_stream
        raw.auto_close = False
        return io.BufferedReader(raw, 1 << 20)
    try:
        return Path(source).open("rb")
    except OSError as exc:
        raise GenerateError(f"{source}: cannot read {what}: {exc.strerror}") from None


def read_batches(stream: Iterable[bytes],
                 size: int = BATCH_LINES) -> Iterator[list[tuple[int, bytes]]]:
    """(line number from 0, raw line) in batches of ``size``; blank lines are kept (numbered)."""
    batch: list[tuple[int, bytes]] = []
    for lineno, raw in enumerate(stream):
        batch.append((lineno, raw))
        if len(batch) >= size:
            yield batch
            batch = []
    if batch:
        yield batch


def is_text(value: str) -> bool:
    """False for a str no UTF-8 file can hold (a lone surrogate, which JSON's \\ud800 escape
    makes). Example: is_text("\\x00\\n$(x)") is True"""
    try:
        value.encode()
    except UnicodeEncodeError:
        return False
    return True


def line_id(lineno: int, raw: bytes, key: str = "id") -> str:
    """The id a line stands for (its own ``key``, else ``line-N`` from 1), without building a
    request.

    Example: line_id(4, b'{"messages": []}') == "line-5"
    """
    try:
        doc = json.loads(raw)
    except ValueError:
        return f"line-{lineno + 1}"
    ident = doc.get(key) if isinstance(doc, dict) else None
    if isinstance(ident, str | int) and not isinstance(ident, bool) and is_text(str(ident)):
        return str(ident)
    return f"line-{lineno + 1}"


def load_line(raw: bytes, where: str) -> Any:
    """A line's JSON value; LineError naming the line if it is not JSON."""
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise LineError(f"{where}: not JSON ({exc}); each line must be one JSON object") \
            from None


def make_item(ident: str, body: dict[str, Any], model: str | None, where: str) -> Item:
    """The request to send: ``body`` with ``model`` if it names none, never streamed, in one
    canonical JSON form (what ``request_sha256`` is over)."""
    if model and "model" not in body:
        body["model"] = model
    body.pop("stream", None)  # one JSON answer per request: the record needs the whole answer
    try:
        data = json.dumps(body, separators=(",", ":"), sort_keys=True,
                          ensure_ascii=False).encode()
    except UnicodeEncodeError:
        raise LineError(f"{where}: the request holds a lone surrogate (an escape like "
                        "\\ud800 not in a pair), which is not text") from None
    return Item(ident, data, hashlib.sha256(data).hexdigest())


def parse_line(lineno: int, raw: bytes, source: str, model: str | None) -> Item:
    """The request a line holds: ``{"messages": [...], "id"?, sampling...}``, ``{"prompt": s}``
    or a bare JSON string (a prompt).

    Example: parse_line(0, b'"hi"', "in.jsonl", "m").id == "line-1"
    """
    where = f"{source} line {lineno + 1}"
    doc = load_line(raw, where)
    if isinstance(doc, str):
        doc = {"prompt": doc}
    if not isinstance(doc, dict):
        raise LineError(f"{where}: a {type(doc).__name__}, not an object with 'messages'")
    ident = doc.get("id", f"line-{lineno + 1}")
    if not isinstance(ident, str | int) or isinstance(ident, bool):
        raise LineError(f"{where}: key 'id' must be a string or an integer")
    if not is_text(str(ident)):
        raise LineError(f"{where}: key 'id' holds a lone surrogate, which is not text")
    body = {k: v for k, v in doc.items() if k not in CONTROL_KEYS}
    if "messages" not in body:
        prompt = body.pop("prompt", None)
        if not isinstance(prompt, str):
            other = ("; it is an OpenAI Batch request, but the input's first line is a chat "
                     "request: one input holds one format") if "custom_id" in doc else ""
            raise LineError(f"{where}: no 'messages' list and no 'prompt' string; "
                            "write {\"messages\": [{\"role\": \"user\", \"content\": ...}]}"
                            + other)
        body["messages"] = [{"role": "user", "content": prompt}]
    if not isinstance(body["messages"], list) or not body["messages"]:
        raise LineError(f"{where}: key 'messages' must be a non-empty list")
    return make_item(str(ident), body, model, where)
