"""``--smg-grpc-mode`` (``--grpc-mode`` up to 0.5.15, then its alias): SGLang serves
``sglang.grpc.scheduler.SglangScheduler`` on ``--host:--port`` in place of HTTP, through the
smg-grpc-servicer package every release depends on (its ``sglang/server.py``, read at 0.14.1;
SGLang's side: ``launch_server.py`` and ``srt/entrypoints/grpc_server.py``).

- Which releases serve: servicer 0.14.1 imports names SGLang has only from 0.5.19
  (``srt/arg_groups/model_override_base`` and others), so 0.5.10 - 0.5.18 end in SGLang's
  ImportError (exit 1); 0.5.19 imports it, but its ServerArgs (a dataclass, no msgspec struct)
  breaks the servicer's GetServerInfo and it seeds no tokenizer path: not imitated;
  0.5.20 - 0.5.23 serve.
- Start: the servicer's lines around the schedulers' own, no detokenizer; the HTTP sidecar on
  ``--smg-http-sidecar-port`` (port + 1) with ``/metrics`` (``--enable-metrics``) and the
  profile endpoints, no auth; the gRPC port with ``add_insecure_port`` and no key; the warm-up
  request and the servicer's own planned warm-up (``SMG_SGLANG_SERVICER_WARMUP``), then the
  health service turns SERVING and "The server is fired up and ready to roll!".
- End: SIGTERM/SIGINT: NOT_SERVING, ``server.stop(5.0)`` (in-flight calls get 5 s), the
  schedulers terminated, exit 0. A scheduler's exception (its SIGQUIT): the tree SIGKILLed,
  the server too (137). A scheduler gone without one: the same shutdown, exit 1.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
import tempfile
import threading
import time
import uuid
from argparse import Namespace
from collections.abc import Iterator
from typing import Any

import uvicorn

from sglang_sim import args as args_mod
from sglang_sim import metrics
from sglang_sim.state import State

server_log = logging.getLogger("smg_grpc_servicer.sglang.server")
launcher_log = logging.getLogger("smg_grpc_servicer.sglang.scheduler_launcher")
manager_log = logging.getLogger("smg_grpc_servicer.sglang.request_manager")
sidecar_log = logging.getLogger("sglang.srt.entrypoints.grpc_server")
SERVES_FROM = (0, 5, 20, 0)
IMPORTS_FROM = (0, 5, 19, 0)
IMPORT_ERROR = (
    "gRPC mode requires the smg-grpc-servicer package. If not installed, run: pip install "
    "smg-grpc-servicer[sglang]. If already installed, there may be a broken import due to a "
    "version mismatch — see the chained exception above for details.")
STOP_GRACE = 5.0  # server.stop(5.0)
WATCHDOG_SECONDS = 1.0  # scheduler_watchdog.py


def requested(args: Namespace) -> bool:
    return bool(getattr(args, "smg_grpc_mode", False) or getattr(args, "grpc_mode", False))


def before_schedulers(args: Namespace, release: str) -> None:
    """serve_grpc up to the scheduler launch: the import of the servicer (raises as SGLang's
    wrapper does where it does not import), then its lines before the schedulers' own."""
    rel = args_mod.release_tuple(release)
    if rel < IMPORTS_FROM:
        try:
            raise ImportError("cannot import name 'ModelOverrideBase' from "
                              "'sglang.srt.arg_groups.model_override_base'")
        except ImportError as missing:
            raise ImportError(IMPORT_ERROR) from missing
    if rel < SERVES_FROM or getattr(args, "grpc_port", None) is not None:
        sys.exit("sglang-sim: gRPC serving is imitated from 0.5.20 on (smg-grpc-servicer "
                 "0.14.1), and not beside HTTP (--grpc-port)")
    server_log.info("Servicer implementation: python (source=default)")
    logging.getLogger("smg_grpc_servicer.rust_lifecycle").warning(
        "kv_events_config cannot be set on ServerArgs; KV event publishing stays as configured")
    server_log.info("Launching scheduler process(es)...")
    # PortArgs names its sockets after temporary files (nothing binds them here)
    recv, send = (f"ipc://{tempfile.gettempdir()}/tmp{uuid.uuid4().hex[:8]}" for _ in range(2))
    manager_log.info(f"GrpcRequestManager initialized with ZMQ IPC: recv={recv}, send={send}")
    launcher_log.info("server_args=ServerArgs(" + ", ".join(
        f"{k}={v!r}" for k, v in vars(args).items()) + ")")


def schedulers_ready(args: Namespace) -> None:
    count = 1 if args.dp_size > 1 else args.tp_size // args.nnodes
    launcher_log.info(f"All {count} scheduler process(es) initialized successfully")


def run(state: State, raw: Namespace) -> None:
    """Serve until a signal or a scheduler's end; exits as the servicer does."""
    code = asyncio.run(_serve(state, raw))
    state.children.kill_tree(include_parent=False)  # launch_server's finally
    sys.exit(code)


async def _serve(state: State, raw: Namespace) -> int:
    import grpc
    from grpc_health.v1 import health_pb2_grpc
    from grpc_reflection.v1alpha import reflection
    from smg_grpc_proto import sglang_scheduler_pb2_grpc as pb_grpc
    from smg_grpc_servicer.hostport import host_port
    from smg_grpc_servicer.sglang.health_servicer import SGLangHealthServicer

    from sglang_sim.grpc_servicer import Servicer

    args = state.args
    loop = asyncio.get_running_loop()
    sidecar = await _start_sidecar(state)
    server = grpc.aio.server(options=[
        ("grpc.max_send_message_length", 1024 * 1024 * 256),
        ("grpc.max_receive_message_length", 1024 * 1024 * 256),
        ("grpc.http2.min_ping_interval_without_data_ms", 10000),
        ("grpc.keepalive_permit_without_calls", True)])
    servicer = Servicer(state, raw)
    health = SGLangHealthServicer(_RequestManagerView(servicer, state), servicer.ready_report())
    logging.getLogger("smg_grpc_servicer.sglang.servicer").info(
        "gRPC scheduler servicer initialized")
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    pb_grpc.add_SglangSchedulerServicer_to_server(servicer, server)
    reflection.enable_server_reflection(("sglang.grpc.scheduler.SglangScheduler",
                                         "grpc.health.v1.Health", reflection.SERVICE_NAME),
                                        server)
    address = host_port(args.host, args.port)
    server.add_insecure_port(address)
    await server.start()
    server_log.info(f"gRPC server listening on {address}")

    ended = asyncio.Event()
    why: list[int] = []

    def stop(code: int) -> None:
        why.append(code)
        ended.set()

    def on_signal() -> None:
        server_log.info("Received shutdown signal")
        stop(0)

    loop.add_signal_handler(signal.SIGTERM, on_signal)
    loop.add_signal_handler(signal.SIGINT, on_signal)
    loop.add_signal_handler(signal.SIGQUIT, lambda: _scheduler_failed(state))
    threading.Thread(target=_warmup, args=(state, raw, health), name="grpc-warmup").start()
    watchdog = asyncio.create_task(_watch_schedulers(state, stop))
    await ended.wait()
    watchdog.cancel()
    server_log.info("Shutting down gRPC server")
    servicer.shutting_down = True
    health.set_not_serving()
    await server.stop(STOP_GRACE)
    server_log.info("Shutting down gRPC service")
    health.set_not_serving()
    manager_log.info("Shutting down GrpcRequestManager")
    manager_log.info("GrpcRequestManager shutdown complete")
    _terminate_schedulers(state)
    if sidecar is not None:
        sidecar.should_exit = True
    if why[0]:
        server_log.error("A scheduler process exited on its own; the servicer exits with code 1")
    return why[0]


class _RequestManagerView:
    """What the servicer's health service reads of its request manager."""

    def __init__(self, servicer: Any, state: State) -> None:
        self._servicer = servicer
        self._state = state

    @property
    def gracefully_exit(self) -> bool:
        return bool(self._servicer.shutting_down)

    @property
    def last_receive_tstamp(self) -> float:
        return float(self._servicer.last_receive)

    @property
    def rid_to_state(self) -> list[str]:
        return self._state.dispatch.rids


def _scheduler_failed(state: State) -> None:
    """request_manager.py's SIGQUIT handler: a scheduler hit an exception."""
    manager_log.error("Received SIGQUIT from scheduler process. Scheduler failed, shutting down "
                      "gRPC server.")
    manager_log.info("Note: Crash dumps are handled by the scheduler process, not the gRPC "
                     "server.")
    state.children.kill_tree(include_parent=True)


async def _watch_schedulers(state: State, stop: Any) -> None:
    """scheduler_watchdog.py: a scheduler gone without a SIGQUIT ends the server (exit 1)."""
    while True:
        await asyncio.sleep(WATCHDOG_SECONDS)
        state.dispatch.mark_dead(state.children.dp_rank_alive)
        codes = [p.poll() for p in state.children.schedulers]
        if any(code is not None for code in codes):
            gone = [c for c in codes if c is not None]
            if any(gone):
                server_log.error(f"A scheduler process exited; non-zero exit codes detected: "
                                 f"{gone}. Shutting down gRPC server")
            else:
                server_log.error(f"A scheduler process exited (exit codes {gone}); shutting "
                                 "down gRPC server")
            stop(1)
            return


def _terminate_schedulers(state: State) -> None:
    """scheduler_launcher.terminate_scheduler_processes: SIGTERM each, 2 s, then SIGKILL."""
    for i, proc in enumerate(state.children.schedulers):
        launcher_log.info(f"Terminating scheduler process {i}...")
        proc.terminate()
        try:
            proc.wait(2)
        except Exception:
            proc.kill()
    launcher_log.info("All scheduler processes terminated")


class _Sidecar(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:  # the servicer's handlers stop the server
        yield


async def _start_sidecar(state: State) -> Any:
    """grpc_server.py's HTTP sidecar: /metrics with --enable-metrics, the profile endpoints."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import PlainTextResponse, Response
    from starlette.routing import Route

    args = state.args
    port = getattr(args, "smg_http_sidecar_port", None) or args.port + 1

    async def metrics_endpoint(request: Request) -> Response:
        return PlainTextResponse(metrics.render(state),
                                 media_type="text/plain; version=0.0.4; charset=utf-8")

    async def profile(request: Request) -> Response:
        start = request.url.path == "/start_profile"
        return PlainTextResponse("Start profiling.\n" if start else
                                 "Stop profiling. This will take some time.\n")

    routes = [Route("/start_profile", profile, methods=["POST"]),
              Route("/stop_profile", profile, methods=["POST"])]
    if args.enable_metrics:
        routes.append(Route("/metrics", metrics_endpoint))
    app = Starlette(routes=routes)
    server = _Sidecar(uvicorn.Config(app, host=args.host, port=port, log_level="warning",
                                     lifespan="off"))
    task = asyncio.create_task(server.serve())
    while not server.started and not task.done():
        await asyncio.sleep(0.05)
    if task.done():
        sidecar_log.error(f"Failed to start HTTP sidecar server: port {port} is in use. "
                          "Continuing without metrics/profile endpoints.")
        return None
    sidecar_log.info(f"HTTP sidecar server started on http://{args.host}:{port}")
    return server


def _warmup(state: State, raw: Namespace, health: Any) -> None:
    """server.py's _wait_and_warmup_grpc: GetModelInfo until it answers, one 8-token request,
    the servicer's planned warm-up over the same channel, then SERVING."""
    import grpc
    from smg_grpc_proto import sglang_scheduler_pb2 as pb
    from smg_grpc_proto import sglang_scheduler_pb2_grpc as pb_grpc
    from smg_grpc_servicer.hostport import loopback_target
    from smg_grpc_servicer.sglang.warmup import warmup_inputs, warmup_wire
    from smg_grpc_servicer.warmup import parse_setting, plan_for, run_warmup

    if state.args.skip_server_warmup:
        server_log.info("Skipping gRPC server warmup (skip_server_warmup=True)")
    else:
        channel = grpc.insecure_channel(loopback_target(state.args.host, state.args.port))
        stub = pb_grpc.SglangSchedulerStub(channel)
        info = None
        for _ in range(120):
            time.sleep(1)
            try:
                info = stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=5)
                break
            except grpc.RpcError:
                continue
        server_log.info("Sending warmup request to gRPC server...")
        request = pb.GenerateRequest(
            request_id=f"WARMUP_{time.time()}",
            tokenized=pb.TokenizedInput(input_ids=[123, 456, 789, 234, 567, 890, 345],
                                        original_text="warmup request"),
            sampling_params=pb.SamplingParams(temperature=0, top_p=1, top_k=1,
                                              repetition_penalty=1, n=1, max_new_tokens=8),
            stream=False)
        try:
            responses = list(stub.Generate(request, timeout=600))
        except grpc.RpcError as error:
            server_log.error(f"gRPC warmup request failed: {error}")
            state.children.kill_tree(include_parent=True)
            return
        if not (responses and responses[-1].HasField("complete")):
            server_log.warning("gRPC warmup request returned no complete response")
            return
        server_log.info("gRPC warmup request completed successfully")
        env = "SMG_SGLANG_SERVICER_WARMUP"
        try:
            setting = parse_setting(os.environ.get(env), name=env)
        except ValueError as error:
            server_log.warning("%s; the planned warm-up is skipped", error)
        else:
            facts = {"is_generation": info.is_generation if info else True,
                     "max_context_length": info.max_context_length if info else 0,
                     "vocab_size": info.vocab_size if info else 0}
            plan = plan_for(setting, warmup_inputs(raw, facts, pins_ranks=False), knob=env)
            if plan is not None:
                run_warmup(plan, warmup_wire("", channel=channel),
                           budget_secs=setting.budget_secs)
        channel.close()
    state.dispatch.reset_stats()  # the simulator's fault counts start after the warm-up
    health.set_serving()
    state.up = True
    server_log.info("The server is fired up and ready to roll!")
