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
        -m sglang_fleet.stages.gate.host.check_server --unit sglang.service \\
        --url http://127.0.0.1:30000 --env-file F --model NAME --expect '{"...": ...}'

Prints human lines, then one line ``GATE <json>``; exit 0 when the server passed.

The steps live beside it in this folder:
gate_unit.py (the unit, its journal, waiting until healthy), gate_http.py (requests, and
``GateError``), gate_smoke.py, gate_soak.py; capacity, readiness and eta come from
sglang_fleet/remote/.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sglang_fleet.remote import capacity, eta, readiness
from sglang_fleet.remote.terminal import printable

from .gate_http import GateError, answered, request
from .gate_smoke import describe, smoke
from .gate_soak import run_soak, soak
from .gate_unit import SECRETS, journal, shown, time_to_ready, wait_healthy

# What other code runs from this module (``sglang-fleet smoke`` and the lab use the smoke and
# the request helpers through it), beside the program itself.
__all__ = ["RESULT_MARK", "GateError", "answered", "api_key", "capacity_lines", "check_arguments",
           "describe", "keep", "main", "now", "request", "run", "server_info", "smoke"]


# The gate's protocol: the last line is RESULT_MARK, a space and the result as one JSON object
# (stages/gate/program.py reads it with ops.result_line).
RESULT_MARK = "GATE"
EAGLE_ALIASES = {"NEXTN": "EAGLE"}


def check_arguments(info: dict[str, Any], expect: dict[str, Any]) -> list[str]:
    wrong = []
    for key, want in expect.items():
        have = info.get(key)
        if key == "speculative_algorithm" and isinstance(want, str) and isinstance(have, str):
            have, want = EAGLE_ALIASES.get(have, have), EAGLE_ALIASES.get(want, want)
        if have != want:
            wrong.append(f"{key}: serving {have!r}, rendered {want!r}")
    return wrong


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
    if args.url.startswith("grpc://"):  # a server in gRPC mode: the same steps over its calls
        from .check_grpc import run_grpc

        run_grpc(args, result, judge)
        return
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
        print(printable(f"serving: /server_info {status or 'no answer'}: SGLang "
                        f"{info.get('version')}, model {info.get('model_path')}"))
        return
    status, raw = request(f"{args.url}/server_info", key)
    if status != 200:
        raise GateError(f"/server_info {answered(status, raw)}")
    info = server_info(status, raw)
    judge(args, info, invocation, result,
          lambda version: smoke(args.url, key, args.model, version),
          lambda running: run_soak(args, invocation, running, result,
                                   lambda count: soak(args.url, key, args.model, count)))


def judge(args: argparse.Namespace, info: dict[str, Any], invocation: str,
          result: dict[str, Any], smoke_of: Callable[[str | None], dict[str, Any]],
          soak_step: Callable[[int | None], None]) -> None:
    """The gate's steps once the server is healthy, over HTTP and gRPC alike: ``info`` (its
    effective arguments) against the rendered ones, the smoke (``smoke_of(version)``), time to
    ready, capacity, the soak (``soak_step(max running requests)``), and the figures kept."""
    wrong = check_arguments(info, json.loads(args.expect))
    if wrong:
        raise GateError("effective arguments differ from the rendered ones (a stale process or "
                        "another release is serving): " + "; ".join(wrong))
    print(printable(f"arguments: SGLang {info.get('version')}, "
                    f"{info.get('speculative_algorithm')}, model {info.get('model_path')}: "
                    "as rendered"))
    result["smoke"] = s = smoke_of(info.get("version"))
    print(describe(s))
    timing = time_to_ready(invocation)
    print(readiness.describe(timing))
    result["time_to_ready"] = readiness.as_json(timing)
    cap = capacity.parse(journal(invocation, 0), info.get("version"))
    # the server's whole limit (every DP rank's), from the log; /server_info's when not logged
    running = cap.total_running_requests or capacity.running_limit(info)
    soak_step(running)
    for line in capacity_lines(cap, args.target):
        print(printable(line))
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
    ap.add_argument("--model-dir", default="",
                    help="the model's directory (a grpc:// server: its tokenizer)")
    ap.add_argument("--reasoning-parser", default=None,
                    help="the server's reasoning parser (a grpc:// server: where the smoke's "
                    "think block ends)")
    args = ap.parse_args()
    result: dict[str, Any] = {"ok": False}
    try:
        run(args, result)
        result["ok"] = True
    except GateError as err:
        for line in err.details:
            print(f"journal: {shown(line)}")
        print(f"error: {printable(str(err))}")
        result["error"] = str(err)
    print(f"{RESULT_MARK} " + json.dumps(result))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
