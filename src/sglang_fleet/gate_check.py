#!/usr/bin/env python3
"""The gate's checks, run ON the host after the service stage (standard library only):

1. wait for /health_generate within the startup budget, but fail within seconds when the unit
   fails, showing the journal lines of THIS invocation only;
2. check the effective arguments from /server_info against what was rendered;
3. a smoke generation through /v1/chat/completions that copes with reasoning models;
4. the capacity report from this invocation's startup lines.

    PYTHONPATH=/opt/sglang/tools python3 -m sglang_fleet.gate_check --unit sglang.service \\
        --url http://127.0.0.1:30000 --env-file F --model NAME --expect '{"...": ...}'

Prints human lines, then one line ``GATE <json>``; exit 0 when the server passed.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from sglang_fleet import capacity  # uploaded to the host with this module

SMOKE_PROMPT = "What is 2+2? Answer with the number only."
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


META_INFO_FROM = (0, 5, 13)  # entrypoints/openai/protocol.py: return_meta_info first in 0.5.13


def meta_info_reported(version: str | None) -> bool | None:
    """Whether the release answers ``return_meta_info`` (None: release unknown).

        meta_info_reported("0.5.12")  # -> False
    """
    m = re.match(r"(\d+)\.(\d+)\.(\d+)", version or "")
    return None if not m else tuple(int(x) for x in m.groups()) >= META_INFO_FROM


def smoke(url: str, key: str | None, model: str, version: str | None = None) -> dict[str, Any]:
    """One streamed chat completion (TTFT, tokens/s) and one with meta_info (accept length).
    A reasoning model may answer with content null or "" and everything in reasoning_content.
    Releases before 0.5.13 have no ``return_meta_info``: the accept length is "not reported by
    this release" there, which is not a failure."""
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
            "accept_length": meta.get("spec_accept_length"),
            "meta_info": meta_info_reported(version) if not meta else True,
            "version": version}


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


def describe(s: dict[str, Any]) -> str:
    accept = accept_text(s)
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
    result["smoke"] = s = smoke(args.url, key, args.model, info.get("version"))
    if not s["sane"]:
        raise GateError(f"smoke answer is not sane: {s['answer']!r}")
    print(describe(s))
    cap = capacity.parse(journal(invocation, 0), info.get("version"))
    print("capacity: " + capacity.summary(cap))
    for line in capacity.advice(cap):
        print("advice: " + line)
    if args.job and cap.max_running_requests:
        n, length = (int(x) for x in args.job.split(","))
        print("job: " + capacity.job_time(n, length, s["tokens_per_s"], cap.max_running_requests))
    result["capacity"] = cap.as_json()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--unit", required=True)
    ap.add_argument("--url", required=True)
    ap.add_argument("--env-file", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--expect", default="{}", help="JSON: server_info key -> rendered value")
    ap.add_argument("--budget", type=float, default=1800)
    ap.add_argument("--job", default="", help="COMPLETIONS,TOKENS for the job estimate")
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
