"""The gate's checks for a server in gRPC mode (``--url grpc://HOST:PORT``), run by
``check_server`` with the release's Python: the steps of the HTTP gate, each through its twin
call of ``SglangScheduler`` (gate_grpc.py), and the same journal, capacity and figures.

    run_grpc(args, result)   # check_server's run() for a grpc:// URL
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from sglang_fleet.remote.terminal import printable

from .gate_grpc import CallFailed, Scheduler
from .gate_grpc_smoke import grpc_smoke, prompt_ids
from .gate_http import GateError
from .gate_smoke import describe
from .gate_soak import SOAK_PROMPT, SOAK_TOKENS, run_soak, soak_with
from .gate_unit import wait_healthy

Judge = Callable[..., None]  # check_server.judge

def target_of(url: str) -> str:
    """HOST:PORT of a ``grpc://HOST:PORT`` URL.

        >>> target_of("grpc://127.0.0.1:30000")
        '127.0.0.1:30000'
    """
    return url.removeprefix("grpc://").rstrip("/")


def run_grpc(args: argparse.Namespace, result: dict[str, Any], judge: Judge) -> None:
    """check_server's ``run`` for a grpc:// URL, its steps judged by check_server's ``judge``
    (passed in: that module imports this one)."""
    target = target_of(args.url)
    with Scheduler(target) as server:
        if args.smoke_only:
            healthy, why = server.health()
            if not healthy:
                raise GateError(f"{target} HealthCheck: {why}")
            result["smoke"] = s = grpc_smoke(server, args.model_dir, args.reasoning_parser,
                                             None)
            print(describe(s))
            return
        what = f"{target} readiness (grpc.health.v1) and HealthCheck"
        invocation = wait_healthy(args.unit, args.url, args.budget,
                                  lambda: server.ready() and server.health()[0], what)
        result["invocation"] = invocation
        print(f"health: {what}: healthy")
        info = server.server_info()
        if args.health_only:
            result["serving"] = {k: info.get(k) for k in ("version", "model_path")}
            print(printable(f"serving: GetServerInfo: SGLang {info.get('version')}, "
                            f"model {info.get('model_path')}"))
            return
        judge(args, info, invocation, result,
              lambda version: grpc_smoke(server, args.model_dir, args.reasoning_parser, version),
              lambda running: run_soak(args, invocation, running, result,
                                       lambda count: soak(server, args.model_dir, count),
                                       lambda: unhealthy(server)))


def soak(server: Scheduler, model_dir: str, count: int) -> dict[str, Any]:
    """``count`` short generations at once, each a status ("OK" or the call's) and its
    output tokens."""
    ids = prompt_ids(model_dir, SOAK_PROMPT)

    def one(i: int) -> tuple[str, int]:
        try:
            return "OK", server.generate(ids, SOAK_TOKENS).completion_tokens
        except CallFailed as err:
            return err.status, 0
        except GateError:  # a stream that ended without its complete frame
            return "INCOMPLETE", 0

    return soak_with(one, count, "OK")


def unhealthy(server: Scheduler) -> str | None:
    healthy, why = server.health()
    return None if healthy else f"{server.target} HealthCheck: {why}"
