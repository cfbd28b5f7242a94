#!/usr/bin/env python3
"""The batch loop a user would write with the official ``openai`` package instead of
``sglang-fleet generate``: every request of a JSONL file through ``AsyncOpenAI`` (as its README
calls ``chat.completions.create``) with an ``asyncio.Semaphore`` holding the concurrency, each
answer written as one JSONL line as it comes. bench/generate_vs_openai.py runs it beside
``sglang-fleet generate``; it has none of the latter's resuming, retry rounds or shards.

    uv run python bench/openai_client.py prompts.jsonl answers.jsonl \\
        --url http://127.0.0.1:30000 --concurrency 64

A request line is ``{"id": ..., "max_tokens": N, "messages": [...]}``; an answer line is
``{"id", "content", "reasoning_content", "finish_reason", "usage"}``, ``content`` ``null`` when
the server answered none (an all-reasoning answer from SGLang up to 0.5.12).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import IO, Any

from openai import AsyncOpenAI


async def answer(client: AsyncOpenAI, model: str, request: dict[str, Any],
                 limit: asyncio.Semaphore, out: IO[str]) -> None:
    async with limit:
        response = await client.chat.completions.create(
            model=model, messages=request["messages"], max_tokens=request["max_tokens"])
    choice = response.choices[0]
    out.write(json.dumps({
        "id": request["id"],
        "content": choice.message.content,  # None stays null: never .strip() it
        # SGLang's reasoning parser adds this field; the openai package keeps extra fields.
        "reasoning_content": getattr(choice.message, "reasoning_content", None),
        "finish_reason": choice.finish_reason,
        "usage": response.usage.model_dump() if response.usage else None,
    }) + "\n")


async def run(inp: str, outp: str, url: str, concurrency: int) -> int:
    """Answer every request of ``inp`` into ``outp``; the number of answers."""
    with open(inp) as f:
        requests = [json.loads(line) for line in f]
    async with AsyncOpenAI(base_url=f"{url}/v1", api_key="none") as client:
        model = (await client.models.list()).data[0].id
        limit = asyncio.Semaphore(concurrency)
        with open(outp, "w") as out:
            await asyncio.gather(*(answer(client, model, r, limit, out) for r in requests))
    return len(requests)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("input")
    ap.add_argument("output")
    ap.add_argument("--url", required=True, help="the server, http://HOST:PORT")
    ap.add_argument("--concurrency", type=int, default=64)
    args = ap.parse_args()
    n = asyncio.run(run(args.input, args.output, args.url, args.concurrency))
    print(json.dumps({"answers": n}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
