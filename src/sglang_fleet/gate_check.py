#!/usr/bin/env python3
"""The gate's checks, run ON the host after the service stage (standard library only):

1. wait for /health_generate within the startup budget, but fail within seconds when the unit
   fails, showing the journal lines of THIS invocation only;
2. check the effective arguments from /server_info against what was rendered;
3. a smoke generation through /v1/chat/completions that copes with reasoning models;
4. a soak: twice max running requests (or ``--soak-requests``) at once, every one answered,
   the server still the same invocation and healthy after them;
5. the capacity report from this invocation's startup lines.

    PYTHONPATH=/opt/sglang/tools python3 -m sglang_fleet.gate_check --unit sglang.service \\
        --url http://127.0.0.1:30000 --env-file F --model NAME --expect '{"...": ...}'

Prints human lines, then one line ``GATE <json>``; exit 0 when the server passed.
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from sglang_fleet import capacity  # uploaded to the host with this module

SMOKE_PROMPT = "What is 2+2? Answer with the number only."
SOAK_PROMPT = "Name a colour."
SOAK_DEFAULT_BATCH = 8  # when the server's max running requests is unknown
EAGLE_ALIASES = {"NEXTN": "EAGLE"}


class GateError(Exception):
    def __init__(self, message: str, details: list[str] | None = None) -> None:
        super().__init__(message)
        self.details = details or []


SECRETS: list[str] = []  # values never to print (the API key)


def shown(line: str, width: int = 240) -> str:
    """A journal line fit for the deploy's output: secrets masked, long lines cut."""
    for secret in SECRETS:
        line = line.replace(secret, "***")
    return line if len(line) <= width else line[:width] + " …"


def unit_state(unit: str) -> dict[str, str]:
    out = subprocess.run(["systemctl", "show", unit, "-p", "ActiveState,SubState,Result,"
                          "InvocationID,ExecMainStatus"], capture_output=True, text=True).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def journal(invocation: str, lines: int = 40) -> list[str]:
    """The journal of one invocation of the unit: never an earlier launch's lines."""
    out = subprocess.run(["journalctl", f"_SYSTEMD_INVOCATION_ID={invocation}", "-o", "cat",
                          "--no-pager"], capture_output=True, text=True).stdout
    return out.splitlines()[-lines:] if lines else out.splitlines()


def request(url: str, key: str | None, body: dict[str, Any] | None = None,
            timeout: float = 30) -> tuple[int, bytes]:
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()
    except (urllib.error.URLError, OSError, TimeoutError):
        return 0, b""


def wait_healthy(unit: str, url: str, budget: float) -> str:
    invocation = unit_state(unit).get("InvocationID", "")
    deadline = time.monotonic() + budget
    while time.monotonic() < deadline:
        state = unit_state(unit)
        restarted = state.get("InvocationID") != invocation
        if state.get("ActiveState") == "failed" or restarted or \
                state.get("SubState") == "auto-restart":
            tail = [line for line in journal(invocation) if line.strip()]
            last = tail[-1].strip() if tail else f"{state.get('Result')}, no output"
            raise GateError(f"{unit} failed to start: {shown(last, 160)}",
                            [f"invocation {invocation}:", *tail[-15:]])
        status, _ = request(f"{url}/health_generate", None, timeout=25)
        if status == 200:
            return invocation
        time.sleep(1)
    raise GateError(f"{url}/health_generate not healthy within {budget:.0f} s")


def check_arguments(info: dict[str, Any], expect: dict[str, Any]) -> list[str]:
    wrong = []
    for key, want in expect.items():
        have = info.get(key)
        if key == "speculative_algorithm" and isinstance(want, str) and isinstance(have, str):
            have, want = EAGLE_ALIASES.get(have, have), EAGLE_ALIASES.get(want, want)
        if have != want:
            wrong.append(f"{key}: serving {have!r}, rendered {want!r}")
    return wrong


def smoke(url: str, key: str | None, model: str) -> dict[str, Any]:
    """One streamed chat completion (TTFT, tokens/s) and one with meta_info (accept length).
    A reasoning model may answer with content null or "" and everything in reasoning_content."""
    body = {"model": model, "messages": [{"role": "user", "content": SMOKE_PROMPT}],
            "max_tokens": 512, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {key or ''}"}
    req = urllib.request.Request(f"{url}/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers=headers)
    tic = time.monotonic()
    first = None
    content: list[str] = []
    reasoning: list[str] = []
    usage: dict[str, Any] = {}
    with urllib.request.urlopen(req, timeout=300) as resp:
        for raw in resp:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            usage = chunk.get("usage") or usage
            for choice in chunk.get("choices") or []:
                delta = choice.get("delta") or {}
                text, think = delta.get("content"), delta.get("reasoning_content")
                if (text or think) and first is None:
                    first = time.monotonic()
                content.append(text or "")
                reasoning.append(think or "")
    end = time.monotonic()
    answer, thought = "".join(content).strip(), "".join(reasoning).strip()
    if not answer and not thought:
        raise GateError("smoke generation returned nothing")
    tokens = int(usage.get("completion_tokens") or 0)
    status, raw = request(f"{url}/v1/chat/completions", key, {
        "model": model, "messages": [{"role": "user", "content": SMOKE_PROMPT}],
        "max_tokens": 64, "temperature": 0, "return_meta_info": True}, timeout=300)
    meta: dict[str, Any] = {}
    if status == 200:
        meta = json.loads(raw)["choices"][0].get("meta_info") or {}
    return {"answer": answer[:80], "reasoning_chars": len(thought),
            "sane": "4" in answer or (not answer and bool(thought)),
            "ttft_s": round((first or end) - tic, 3), "tokens": tokens,
            "tokens_per_s": round(tokens / max(end - (first or tic), 1e-3), 1),
            "accept_length": meta.get("spec_accept_length")}


def soak(url: str, key: str | None, model: str, count: int,
         timeout: float = 300) -> dict[str, Any]:
    """``count`` short chat completions at once: the server's first real batch (and a queue
    behind it), so a server that dies under load fails the gate instead of the first users.

        soak("http://127.0.0.1:30000", key, "qwen", 32)
        # {'requests': 32, 'failed': 0, 'statuses': {'200': 32}, 'seconds': 1.4}
    """
    def one(i: int) -> int:
        body = {"model": model, "max_tokens": 16, "temperature": 0,
                "messages": [{"role": "user", "content": f"{SOAK_PROMPT} ({i})"}]}
        return request(f"{url}/v1/chat/completions", key, body, timeout=timeout)[0]

    tic = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(max(1, min(count, 512))) as pool:
        statuses = collections.Counter(str(code) for code in pool.map(one, range(count)))
    return {"requests": count, "failed": count - statuses.get("200", 0),
            "statuses": dict(statuses), "seconds": round(time.monotonic() - tic, 2)}


def soak_count(requested: int | None, max_running: int | None) -> int:
    """Requests the soak sends: as asked (0 disables it), else twice max running requests.

        >>> soak_count(None, 48), soak_count(0, 48), soak_count(None, None)
        (96, 0, 16)
    """
    if requested is not None:
        return requested
    return 2 * (max_running or SOAK_DEFAULT_BATCH)


def survived(unit: str, invocation: str, url: str) -> None:
    """After the soak: the same invocation of the unit, active, healthy; else why not."""
    state = unit_state(unit)
    if state.get("InvocationID") != invocation or state.get("ActiveState") != "active" or \
            state.get("SubState") == "auto-restart":
        tail = [line for line in journal(invocation) if line.strip()]
        last = tail[-1].strip() if tail else f"{state.get('Result')}, no output"
        raise GateError(f"{unit} died under the soak: {shown(last, 160)}",
                        [f"invocation {invocation}:", *tail[-15:]])
    status, _ = request(f"{url}/health_generate", None, timeout=25)
    if status != 200:
        raise GateError(f"{url}/health_generate answered {status or 'nothing'} after the soak")


def run_soak(args: argparse.Namespace, key: str | None, invocation: str,
             max_running: int | None, result: dict[str, Any]) -> None:
    """The gate's soak step: print one line, fail the gate when a request or the server did."""
    count = soak_count(args.soak_requests, max_running)
    if count <= 0:
        print("soak: disabled (gate_soak_requests = 0)")
        return
    result["soak"] = s = soak(args.url, key, args.model, count)
    time.sleep(1)  # a server that dies at the end of the batch does so within a second
    if s["failed"]:
        try:
            survived(args.unit, invocation, args.url)
        except GateError as err:
            raise GateError(f"soak: {s['failed']} of {count} concurrent requests failed "
                            f"(statuses {s['statuses']}); {err}", err.details) from None
        raise GateError(f"soak: {s['failed']} of {count} concurrent requests failed "
                        f"(statuses {s['statuses']})")
    survived(args.unit, invocation, args.url)
    print(f"soak: {count} concurrent requests, all answered in {s['seconds']:.1f} s; "
          f"{args.unit} still serving")


def describe(s: dict[str, Any]) -> str:
    accept = f", accept length {s['accept_length']:.2f}" if s["accept_length"] else ""
    return (f"smoke: {s['answer'] or '(reasoning only)'!r}, TTFT {s['ttft_s'] * 1000:.0f} ms, "
            f"{s['tokens_per_s']:.0f} tok/s{accept}")


def api_key(env_file: str) -> str | None:
    for line in Path(env_file).read_text().splitlines():
        if line.startswith("SGLANG_API_KEY="):
            return line.split("=", 1)[1].strip().strip("'\"")
    return None


def run(args: argparse.Namespace, result: dict[str, Any]) -> None:
    key = api_key(args.env_file)
    if key:
        SECRETS.append(key)
    if args.smoke_only:  # a running server, changed by nothing
        status, _ = request(f"{args.url}/health_generate", None, timeout=25)
        if status != 200:
            raise GateError(f"{args.url}/health_generate answered {status or 'nothing'}")
        result["smoke"] = s = smoke(args.url, key, args.model)
        print(describe(s))
        if not s["sane"]:
            raise GateError(f"smoke answer is not sane: {s['answer']!r}")
        return
    invocation = wait_healthy(args.unit, args.url, args.budget)
    result["invocation"] = invocation
    print("health: /health_generate 200")
    if args.health_only:
        return
    status, raw = request(f"{args.url}/server_info", key)
    if status != 200:
        raise GateError(f"/server_info answered {status}")
    info = json.loads(raw)
    wrong = check_arguments(info, json.loads(args.expect))
    if wrong:
        raise GateError("effective arguments differ from the rendered ones (a stale process or "
                        "another release is serving): " + "; ".join(wrong))
    print(f"arguments: SGLang {info.get('version')}, {info.get('speculative_algorithm')}, "
          f"model {info.get('model_path')}: as rendered")
    result["smoke"] = s = smoke(args.url, key, args.model)
    if not s["sane"]:
        raise GateError(f"smoke answer is not sane: {s['answer']!r}")
    print(describe(s))
    cap = capacity.parse(journal(invocation, 0))
    mrr = info.get("max_running_requests")
    run_soak(args, key, invocation, cap.max_running_requests
             or (mrr if isinstance(mrr, int) else None), result)
    print("capacity: " + capacity.summary(cap))
    for line in capacity.advice(cap):
        print("advice: " + line)
    if args.job and cap.max_running_requests:
        n, length = (int(x) for x in args.job.split(","))
        print("job: " + capacity.job_time(n, length, s["tokens_per_s"], cap.max_running_requests))
    result["capacity"] = cap.__dict__


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--unit", required=True)
    ap.add_argument("--url", required=True)
    ap.add_argument("--env-file", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--expect", default="{}", help="JSON: server_info key -> rendered value")
    ap.add_argument("--budget", type=float, default=1800)
    ap.add_argument("--job", default="", help="COMPLETIONS,TOKENS for the job estimate")
    ap.add_argument("--soak-requests", type=int, default=None,
                    help="concurrent requests after the smoke (default: 2 x max running "
                    "requests; 0: no soak)")
    ap.add_argument("--health-only", action="store_true", help="only wait until healthy")
    ap.add_argument("--smoke-only", action="store_true",
                    help="only a smoke generation against the running server")
    args = ap.parse_args()
    result: dict[str, Any] = {"ok": False}
    try:
        run(args, result)
        result["ok"] = True
    except GateError as err:
        for line in err.details:
            print(f"journal: {shown(line)}")
        print(f"error: {err}")
        result["error"] = str(err)
    print("GATE " + json.dumps(result))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
