"""The gate's checks, run ON the host after the service stage (standard library only):

1. wait for /health_generate within the startup budget, but fail within seconds when the unit
   fails, showing the journal lines of THIS invocation only;
2. check the effective arguments from /server_info against what was rendered;
3. a smoke generation through /v1/chat/completions that copes with reasoning models;
4. a soak: twice the server's max running requests (every DP rank's; or ``--soak-requests``)
   at once, every one answered,
   the server still the same invocation and healthy after them;
5. the capacity report from this invocation's startup lines, and its time to ready in parts
   (process start, weights, KV and mamba, graphs, ready, first generation; see readiness);
6. what it measured (effective max running requests, the soak's output tok/s, the smoke's
   per-request tok/s; see eta), kept in ``--record`` when the gate passed.

    /usr/bin/env PYTHONPATH=/opt/sglang/tools/pythonpath python3 \\
        -m sglang_fleet_remote.check_server --unit sglang.service \\
        --url http://127.0.0.1:30000 --env-file F --model NAME --expect '{"...": ...}'

Prints human lines, then one line ``GATE <json>``; exit 0 when the server passed.
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import http.client
import json
import re
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from . import capacity, crash, eta, readiness  # uploaded to the host with this module

# The gate's protocol: the last line is RESULT_MARK, a space and the result as one JSON object
# (stages/gate_program.py reads it with ops.result_line).
RESULT_MARK = "GATE"
SMOKE_PROMPT = "What is 2+2? Answer with the number only."
SOAK_PROMPT = "Name a colour."
SOAK_DEFAULT_BATCH = 8  # when the server's max running requests is unknown
SOAK_TOKENS = 16  # output tokens per soak request: a batch's worth of work, quickly
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


def time_to_ready(invocation: str, tries: int = 5) -> readiness.Timing:
    """This invocation's time to ready, in parts, from its journal at journald's own time:
    the unit's lines and systemd's "Started" message for it (PID 1 logs that with the
    invocation as INVOCATION_ID). Read again for a moment while the first generation's line
    (the smoke's, just answered) is not in the journal yet."""
    argv = ["journalctl", "-o", "json", "--no-pager", f"_SYSTEMD_INVOCATION_ID={invocation}",
            "+", f"INVOCATION_ID={invocation}"]
    timing = readiness.Timing()
    for _ in range(tries):
        out = subprocess.run(argv, capture_output=True, text=True).stdout
        timing = readiness.parse(readiness.entries(out.splitlines()))
        if "first_generation" in timing.marks or "ready" not in timing.marks:
            break
        time.sleep(0.5)
    return timing


# What urllib raises when a peer is not an HTTP server (an SSH banner, a closed connection, a
# malformed status line or headers), when nothing answers, or when the URL is unusable.
NO_ANSWER = (urllib.error.URLError, OSError, TimeoutError, http.client.HTTPException,
             ValueError, UnicodeError)


def no_answer(exc: BaseException) -> str:
    """One line saying why a request got no HTTP answer."""
    if isinstance(exc, urllib.error.URLError) and not isinstance(exc, urllib.error.HTTPError):
        exc = exc.reason if isinstance(exc.reason, BaseException) else exc
    if isinstance(exc, http.client.BadStatusLine | http.client.LineTooLong):
        return "it did not answer HTTP (not an HTTP server on that port?)"
    if isinstance(exc, TimeoutError):
        return "no answer in time"
    text = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
    return text[:200]


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A 3xx stays the answer: urllib would follow it and send the Authorization header again
    to wherever Location names (another host, or plain http)."""

    def redirect_request(self, req: urllib.request.Request, fp: Any, code: int, msg: str,
                         headers: Any, newurl: str) -> None:
        return None


OPENER = urllib.request.build_opener(_NoRedirect)


def origin(url: str) -> str:
    """scheme://host:port of a URL, never its userinfo, path or query.

        origin("http://u:p@10.0.0.9:8080/x?y")   # 'http://10.0.0.9:8080'
    """
    try:
        parts = urllib.parse.urlsplit(url)
        host, port = parts.hostname or "?", parts.port
    except ValueError:
        return "an unusable URL"
    host = f"[{host}]" if ":" in host else host
    return f"{parts.scheme}://{host}" + (f":{port}" if port else "")


def error_answer(err: urllib.error.HTTPError) -> tuple[int, bytes]:
    """(status, body) of an HTTP error; for a 3xx, where it pointed, as it was not followed."""
    if 300 <= err.code < 400:
        where = err.headers.get("Location") if err.headers else None
        to = origin(urllib.parse.urljoin(err.filename or "", where)) if where else "nowhere"
        return err.code, (f"a redirect to {to}, not followed (the key goes only to the URL "
                          "given: give the URL it serves on)").encode()
    try:
        return err.code, err.read()
    except NO_ANSWER:
        return err.code, b""


def request(url: str, key: str | None, body: dict[str, Any] | None = None,
            timeout: float = 30) -> tuple[int, bytes]:
    """(status, body); status 0 when nothing answered HTTP, with the reason as the body."""
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    data = json.dumps(body).encode() if body is not None else None
    try:
        req = urllib.request.Request(url, data=data, headers=headers)
        with OPENER.open(req, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return error_answer(err)
    except NO_ANSWER as exc:
        return 0, no_answer(exc).encode()


def answered(status: int, raw: bytes) -> str:
    """How a request went, in words: "answered 500: <body>" or "did not answer: <why>"."""
    if status == 0:
        return f"did not answer: {raw.decode(errors='replace')}"
    body = raw[:160].decode(errors="replace").strip().replace("\n", " ")
    return f"answered {status}" + (f": {body}" if body else "")


def unit_down(unit: str, invocation: str, state: dict[str, str], what: str) -> GateError:
    """The error for a unit that went down: why (its crash's cause, else its last line), and
    that invocation's journal."""
    lines = journal(invocation, lines=0)
    tail = [line for line in lines[-40:] if line.strip()]
    last = crash.cause(lines) or (tail[-1].strip() if tail else
                                  f"{state.get('Result')}, no output")
    return GateError(f"{unit} {what}: {shown(last, 160)}",
                     [f"invocation {invocation}:", *tail[-15:]])


def wait_healthy(unit: str, url: str, budget: float) -> str:
    invocation = unit_state(unit).get("InvocationID", "")
    deadline = time.monotonic() + budget
    while time.monotonic() < deadline:
        state = unit_state(unit)
        restarted = state.get("InvocationID") != invocation
        if state.get("ActiveState") == "failed" or restarted or \
                state.get("SubState") == "auto-restart":
            raise unit_down(unit, invocation, state, "failed to start")
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
    this release" there, which is not a failure; an answer that is not a chat completion is
    (meta_info)."""
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
    completion without one (a release or server that does not report it: "not reported"); a
    GateError for an answer that is not a chat completion, or a meta_info that is not one, since
    a broken answer is not a missing feature.

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


def soak(url: str, key: str | None, model: str, count: int,
         timeout: float = 300) -> dict[str, Any]:
    """``count`` short chat completions at once: the server's first real batch (and a queue
    behind it), so a server that dies under load fails the gate instead of the first users.

        soak("http://127.0.0.1:30000", key, "qwen", 32)
        # {'requests': 32, 'failed': 0, 'statuses': {'200': 32}, 'seconds': 1.4,
        #  'output_tokens': 512, 'tokens_per_s': 365.7}
    """
    def one(i: int) -> tuple[int, int]:
        body = {"model": model, "max_tokens": SOAK_TOKENS, "temperature": 0,
                "messages": [{"role": "user", "content": f"{SOAK_PROMPT} ({i})"}]}
        status, raw = request(f"{url}/v1/chat/completions", key, body, timeout=timeout)
        return status, completion_tokens(raw) if status == 200 else 0

    tic = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(max(1, min(count, 512))) as pool:
        answers = list(pool.map(one, range(count)))
    seconds = time.monotonic() - tic
    statuses = collections.Counter(str(code) for code, _ in answers)
    tokens = sum(n for _, n in answers)
    return {"requests": count, "failed": count - statuses.get("200", 0),
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


def survived(unit: str, invocation: str, url: str) -> None:
    """After the soak: the same invocation of the unit, active, healthy; else why not."""
    state = unit_state(unit)
    if state.get("InvocationID") != invocation or state.get("ActiveState") != "active" or \
            state.get("SubState") == "auto-restart":
        raise unit_down(unit, invocation, state, "died under the soak")
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
    rate = (f"{s['output_tokens']} output tokens, {s['tokens_per_s']:,.0f} tok/s"
            if s["tokens_per_s"] else "no output tokens reported (usage), no throughput")
    print(f"soak: {count} concurrent requests, all answered in {s['seconds']:.1f} s; "
          f"{args.unit} still serving; {rate}")


def describe(s: dict[str, Any]) -> str:
    accept = accept_text(s)
    return (f"smoke: {s['answer'] or '(reasoning only)'!r}, TTFT {s['ttft_s'] * 1000:.0f} ms, "
            f"{s['tokens_per_s']:.0f} tok/s{accept}")


def server_info(status: int, raw: bytes) -> dict[str, Any]:
    """/server_info's answer; a 200 that is not a JSON object is a broken server (GateError)."""
    try:
        info = json.loads(raw)
    except ValueError:
        info = None
    if not isinstance(info, dict):
        raise GateError(f"/server_info answered {status} but not a JSON object: {raw[:80]!r}")
    return info


def api_key(env_file: str) -> str | None:
    for line in Path(env_file).read_text().splitlines():
        if line.startswith("SGLANG_API_KEY="):
            return line.split("=", 1)[1].strip().strip("'\"")
    return None


def capacity_lines(cap: capacity.Capacity, target: int = 48) -> list[str]:
    """The capacity report's lines, as ``sglang-fleet capacity`` prints them for the same log
    (one reader, one report: the two never disagree); advice for ``target`` running requests."""
    return capacity.report(cap, target) or \
        ["capacity: no startup line in this invocation's journal"]


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
        return
    invocation = wait_healthy(args.unit, args.url, args.budget)
    result["invocation"] = invocation
    print("health: /health_generate 200")
    if args.health_only:
        status, raw = request(f"{args.url}/server_info", key)
        info = server_info(status, raw) if status == 200 else {}
        result["serving"] = {k: info.get(k) for k in ("version", "model_path")}
        print(f"serving: /server_info {status or 'no answer'}: SGLang {info.get('version')}, "
              f"model {info.get('model_path')}")
        return
    status, raw = request(f"{args.url}/server_info", key)
    if status != 200:
        raise GateError(f"/server_info {answered(status, raw)}")
    info = server_info(status, raw)
    wrong = check_arguments(info, json.loads(args.expect))
    if wrong:
        raise GateError("effective arguments differ from the rendered ones (a stale process or "
                        "another release is serving): " + "; ".join(wrong))
    print(f"arguments: SGLang {info.get('version')}, {info.get('speculative_algorithm')}, "
          f"model {info.get('model_path')}: as rendered")
    result["smoke"] = s = smoke(args.url, key, args.model, info.get("version"))
    print(describe(s))
    timing = time_to_ready(invocation)
    print(readiness.describe(timing))
    result["time_to_ready"] = readiness.as_json(timing)
    cap = capacity.parse(journal(invocation, 0), info.get("version"))
    # the server's whole limit (every DP rank's), from the log; /server_info's when not logged
    running = cap.total_running_requests or capacity.running_limit(info)
    run_soak(args, key, invocation, running, result)
    for line in capacity_lines(cap, args.target):
        print(line)
    result["capacity"] = cap.as_json()
    result["measured"] = measured = eta.record(
        args.unit, invocation, info.get("version"), now(), running, result.get("soak"), s)
    job = eta.job_line(eta.estimate([eta.from_record(args.unit, measured)],
                                    eta.parse_job(args.job)))
    if job:
        print(job)
    if args.record:
        keep(args.record, measured)


def now() -> str:
    """The time of a measurement, as every host's record gives it (UTC, to the second)."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def keep(path: str, measured: dict[str, Any]) -> None:
    """The passed gate's figures for ``sglang-fleet status`` and the end of a roll: one line of
    JSON, written whole (a reader sees the old record or the new one), root's, readable by all
    (it holds figures, no secret)."""
    target = Path(path)
    partial = target.with_name(f".{target.name}.partial")
    try:
        target.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        partial.write_text(json.dumps(measured) + "\n")
        partial.chmod(0o644)
        partial.replace(target)
    except OSError as exc:  # the server passed: a record not kept costs status its figures
        print(f"record: not kept in {path}: {exc.strerror or exc}")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--unit", required=True)
    ap.add_argument("--url", required=True)
    ap.add_argument("--env-file", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--expect", default="{}", help="JSON: server_info key -> rendered value")
    ap.add_argument("--budget", type=float, default=1800)
    ap.add_argument("--job", default="", help="COMPLETIONS,TOKENS for the job estimate")
    ap.add_argument("--record", default="", help="where a passed gate keeps what it measured "
                    "(JSON, for sglang-fleet status)")
    ap.add_argument("--soak-requests", type=int, default=None,
                    help="concurrent requests after the smoke (default: 2 x max running "
                    "requests; 0: no soak)")
    ap.add_argument("--target", type=int, default=48,
                    help="running requests the capacity advice aims at "
                    "(memory.target_running_requests)")
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
    print(f"{RESULT_MARK} " + json.dumps(result))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
