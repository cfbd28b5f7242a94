"""The gate's soak: twice the server's max running requests (every DP rank's; or
``--soak-requests``) at once, every one answered, and the same invocation of the unit still
active and healthy after them: a server that dies under load fails the gate, not its users.

    soak_count(None, 48)                       # 96 requests
    run_soak(args, invocation, 48, result, lambda n: soak(url, key, model, n))
    # prints "soak: 96 concurrent requests, ..."
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import json
import time
from collections.abc import Callable
from typing import Any

from .gate_http import GateError, request
from .gate_unit import unit_down, unit_state

SOAK_PROMPT = "Name a colour."
SOAK_DEFAULT_BATCH = 8  # when the server's max running requests is unknown
SOAK_TOKENS = 16  # output tokens per soak request: a batch's worth of work, quickly


def soak(url: str, key: str | None, model: str, count: int,
         timeout: float = 300) -> dict[str, Any]:
    """``count`` short chat completions at once: the server's first real batch (and a queue
    behind it), so a server that dies under load fails the gate instead of the first users.

        soak("http://127.0.0.1:30000", key, "qwen", 32)
        # {'requests': 32, 'failed': 0, 'statuses': {'200': 32}, 'seconds': 1.4,
        #  'output_tokens': 512, 'tokens_per_s': 365.7}
    """
    def one(i: int) -> tuple[str, int]:
        body = {"model": model, "max_tokens": SOAK_TOKENS, "temperature": 0,
                "messages": [{"role": "user", "content": f"{SOAK_PROMPT} ({i})"}]}
        status, raw = request(f"{url}/v1/chat/completions", key, body, timeout=timeout)
        return str(status), completion_tokens(raw) if status == 200 else 0

    return soak_with(one, count, "200")


def soak_with(one: Callable[[int], tuple[str, int]], count: int, ok: str) -> dict[str, Any]:
    """``count`` calls of ``one`` at once (its status, its output tokens); not ``ok``: failed."""
    tic = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(max(1, min(count, 512))) as pool:
        answers = list(pool.map(one, range(count)))
    seconds = time.monotonic() - tic
    statuses = collections.Counter(code for code, _ in answers)
    tokens = sum(n for _, n in answers)
    return {"requests": count, "failed": count - statuses.get(ok, 0),
            "statuses": dict(statuses), "seconds": round(seconds, 2), "output_tokens": tokens,
            "tokens_per_s": round(tokens / seconds, 1) if tokens and seconds > 0 else None}


def completion_tokens(raw: bytes) -> int:
    """``usage.completion_tokens`` of a chat completion (0 when it reports none).

        >>> completion_tokens(b'{"usage": {"completion_tokens": 16}}')
        16
    """
    try:
        body = json.loads(raw)
    except ValueError:
        return 0
    usage = body.get("usage") if isinstance(body, dict) else None
    n = usage.get("completion_tokens") if isinstance(usage, dict) else None
    return n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else 0


def soak_count(requested: int | None, max_running: int | None) -> int:
    """Requests the soak sends: as asked (0 disables it), else twice max running requests.

        >>> soak_count(None, 48), soak_count(0, 48), soak_count(None, None)
        (96, 0, 16)
    """
    if requested is not None:
        return requested
    return 2 * (max_running or SOAK_DEFAULT_BATCH)


def survived(unit: str, invocation: str, url: str,
             probe: Callable[[], str | None] | None = None) -> None:
    """After the soak: the same invocation of the unit, active, healthy (``url``'s
    /health_generate, or ``probe``: None when healthy, else why not); else why not."""
    state = unit_state(unit)
    if state.get("InvocationID") != invocation or state.get("ActiveState") != "active" or \
            state.get("SubState") == "auto-restart":
        raise unit_down(unit, invocation, state, "died under the soak")
    if probe:
        why = probe()
        if why:
            raise GateError(f"{why} after the soak")
        return
    status, _ = request(f"{url}/health_generate", None, timeout=25)
    if status != 200:
        raise GateError(f"{url}/health_generate answered {status or 'nothing'} after the soak")


def run_soak(args: argparse.Namespace, invocation: str, max_running: int | None,
             result: dict[str, Any], soak_of: Callable[[int], dict[str, Any]],
             probe: Callable[[], str | None] | None = None) -> None:
    """The gate's soak step: ``soak_of(count)`` (``soak`` over HTTP), print one line, fail the
    gate when a request or the server did (``probe``: see ``survived``)."""
    count = soak_count(args.soak_requests, max_running)
    if count <= 0:
        print("soak: disabled (gate_soak_requests = 0)")
        return
    result["soak"] = s = soak_of(count)
    time.sleep(1)  # a server that dies at the end of the batch does so within a second
    if s["failed"]:
        try:
            survived(args.unit, invocation, args.url, probe)
        except GateError as err:
            raise GateError(f"soak: {s['failed']} of {count} concurrent requests failed "
                            f"(statuses {s['statuses']}); {err}", err.details) from None
        raise GateError(f"soak: {s['failed']} of {count} concurrent requests failed "
                        f"(statuses {s['statuses']})")
    survived(args.unit, invocation, args.url, probe)
    rate = (f"{s['output_tokens']} output tokens, {s['tokens_per_s']:,.0f} tok/s"
            if s["tokens_per_s"] else "no output tokens reported (usage), no throughput")
    print(f"soak: {count} concurrent requests, all answered in {s['seconds']:.1f} s; "
          f"{args.unit} still serving; {rate}")
