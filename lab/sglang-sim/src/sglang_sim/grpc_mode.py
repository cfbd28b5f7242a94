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
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
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
IMPORT_ERROR = (
    "gRPC mode requires the smg-grpc-servicer package. If not installed, run: pip install "
    "smg-grpc-servicer[sglang]. If already installed, there may be a broken import due to a "
    "version mismatch — see the chained exception above for details.")
STOP_GRACE = 5.0  # server.stop(5.0)
OPENMETRICS = "application/openmetrics-text; version=1.0.0; charset=utf-8"
WATCHDOG_SECONDS = 1.0  # scheduler_watchdog.py


# The first of the servicer's imports each release lacks (its sglang/server.py:25 and
# scheduler_launcher.py:13): the cause SGLang's ImportError is chained from.
_MISSING = [((0, 5, 14, 0), ModuleNotFoundError, "No module named 'sglang.srt.runtime_context'"),
            ((0, 5, 17, 0), ImportError,
             "cannot import name 'publish' from 'sglang.srt.runtime_context'"),
            ((0, 5, 19, 0), ModuleNotFoundError,
             "No module named 'sglang.srt.arg_groups.model_override_base'")]


def before_schedulers(raw: Namespace, release: str) -> None:
    """serve_grpc up to the scheduler launch: the import of the servicer (raises as SGLang's
    wrapper does where it does not import), the implementation switch, then its lines before
    the schedulers' own. ``raw``: the arguments as given (what the servicer prints)."""
    from smg_grpc_servicer.rust_lifecycle import (
        ServicerConfigError,
        configuration_exit,
        servicer_switch,
    )

    rel = args_mod.release_tuple(release)
    for until, kind, text in _MISSING:
        if rel < until:
            if rel >= (0, 5, 13, 0):  # launch_server's finally, before the traceback prints
                pid = os.getpid()
                logging.getLogger("sglang.srt.utils.common").info(
                    f"kill_process_tree called: parent_pid={pid}, include_parent=False, "
                    f"pid={pid}")
            try:
                raise kind(text)
            except ImportError as missing:
                raise ImportError(IMPORT_ERROR) from missing
    if rel < SERVES_FROM:
        sys.exit("sglang-sim: gRPC serving is imitated from 0.5.20 on (smg-grpc-servicer "
                 "0.14.1 imports on 0.5.19 but cannot read its ServerArgs)")
    try:
        impl, origin = servicer_switch("SMG_SGLANG_SERVICER_IMPL")
    except ServicerConfigError as error:
        raise configuration_exit(error, server_log) from None
    server_log.info(f"Servicer implementation: {impl} (source={origin})")
    if impl == "rust" or raw.kv_events_config:
        sys.exit("sglang-sim: the Rust servicer (SMG_SGLANG_SERVICER_IMPL=rust) and KV event "
                 "relaying (--kv-events-config) are not imitated")
    if os.environ.get("SMG_SGLANG_SERVICER_KV_EVENTS", "").strip().lower() not in (
            "0", "false", "no", "off"):  # the servicer's default publisher, on a sealed record
        logging.getLogger("smg_grpc_servicer.rust_lifecycle").warning(
            "kv_events_config cannot be set on ServerArgs; KV event publishing stays as "
            "configured")
    server_log.info("Launching scheduler process(es)...")
    # PortArgs names its sockets after temporary files (nothing binds them here)
    recv, send = (f"ipc://{tempfile.gettempdir()}/tmp{uuid.uuid4().hex[:8]}" for _ in range(2))
    manager_log.info(f"GrpcRequestManager initialized with ZMQ IPC: recv={recv}, send={send}")
    hidden = {"watermark_key", "watermark_key_b", "watermark_config"}  # ServerArgs.__repr__
    launcher_log.info("server_args=ServerArgs(" + ", ".join(
        f"{k}={v!r}" for k, v in vars(raw).items() if k not in hidden) + ")")


def schedulers_ready(args: Namespace) -> None:
    count = 1 if args.dp_size > 1 else args.tp_size // args.nnodes
    launcher_log.info(f"All {count} scheduler process(es) initialized successfully")


def run(state: State, raw: Namespace) -> None:
    """Serve until a signal or a scheduler's end; exits as the servicer does."""
    try:
        code = asyncio.run(_serve(state, raw))
    finally:
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
    health = SGLangHealthServicer(servicer, servicer.ready_report())
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
    loop.add_signal_handler(signal.SIGQUIT, lambda: _scheduler_failed(state))

    warmup = threading.Thread(target=_wait_and_warmup, args=(state, raw, health, loop))
    warmup.start()
    stop = asyncio.Event()

    def on_signal() -> None:
        server_log.info("Received shutdown signal")
        stop.set()

    loop.add_signal_handler(signal.SIGTERM, on_signal)
    loop.add_signal_handler(signal.SIGINT, on_signal)
    exited = await _watch_schedulers(state, stop)
    server_log.info("Shutting down gRPC server")
    health.set_not_serving()
    await server.stop(STOP_GRACE)
    servicer.gracefully_exit = True  # as the request manager's shutdown sets it
    logging.getLogger("smg_grpc_servicer.sglang.servicer").info("Shutting down gRPC service")
    health.set_not_serving()
    manager_log.info("Shutting down GrpcRequestManager")
    manager_log.info("GrpcRequestManager shutdown complete")
    if warmup.is_alive():
        server_log.info("Waiting for warmup thread to finish...")
        await asyncio.to_thread(warmup.join, 5.0)
    _terminate_schedulers(state)
    if sidecar is not None:
        sidecar.should_exit = True
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.shield(sidecar.task), 2)
    if exited:
        server_log.error("A scheduler process exited on its own; the servicer exits with code 1")
        return 1
    return 0


def _scheduler_failed(state: State) -> None:
    """request_manager.py's SIGQUIT handler: a scheduler hit an exception."""
    manager_log.error("Received SIGQUIT from scheduler process. Scheduler failed, shutting down "
                      "gRPC server.")
    manager_log.info("Note: Crash dumps are handled by the scheduler process, not the gRPC "
                     "server.")
    state.children.kill_tree(include_parent=True)


async def _watch_schedulers(state: State, stop: asyncio.Event) -> bool:
    """scheduler_watchdog.watch_scheduler_processes: whether a scheduler exited on its own
    (False once a signal set ``stop``)."""
    log = logging.getLogger("smg_grpc_servicer.sglang.scheduler_watchdog")
    while not stop.is_set():
        state.dispatch.mark_dead(state.children.dp_rank_alive)
        codes = [p.poll() for p in state.children.schedulers]
        if any(code is not None for code in codes):
            if any(code not in (None, 0) for code in codes):
                log.error(f"A scheduler process exited; non-zero exit codes detected: {codes}. "
                          "Shutting down gRPC server")
            else:
                log.error(f"A scheduler process exited (exit codes {codes}); shutting down "
                          "gRPC server")
            return True
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), WATCHDOG_SECONDS)
    return False


def _terminate_schedulers(state: State) -> None:
    """scheduler_launcher.terminate_scheduler_processes: SIGTERM each live one, 2 s, then
    SIGKILL."""
    for i, proc in enumerate(state.children.schedulers):
        if proc.poll() is not None:
            continue
        launcher_log.info(f"Terminating scheduler process {i}...")
        proc.terminate()
        try:
            proc.wait(2)
        except subprocess.TimeoutExpired:
            launcher_log.warning(f"Scheduler process {i} did not terminate, killing...")
            proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(1)
    launcher_log.info("All scheduler processes terminated")


class _Sidecar(uvicorn.Server):
    task: asyncio.Task[None]

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:  # the servicer's handlers stop the server
        yield


async def _start_sidecar(state: State) -> _Sidecar | None:
    """grpc_server.py's HTTP sidecar, bound before the gRPC port: /metrics with
    --enable-metrics (the schedulers' series, OpenMetrics: no TokenizerManager here), the
    profile endpoints; a port it cannot bind is logged and the server goes on without it."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import PlainTextResponse, Response
    from starlette.routing import Route

    args = state.args
    port = getattr(args, "smg_http_sidecar_port", None) or args.port + 1

    async def metrics_endpoint(request: Request) -> Response:
        return Response(metrics.render(state, tokenizer=False) + "# EOF\n",
                        media_type=OPENMETRICS)

    async def profile(request: Request) -> Response:
        start = request.url.path == "/start_profile"
        return PlainTextResponse("Start profiling.\n" if start else
                                 "Stop profiling. This will take some time.\n")

    routes = [Route("/start_profile", profile, methods=["POST"]),
              Route("/stop_profile", profile, methods=["POST"])]
    if args.enable_metrics:
        routes.append(Route("/metrics", metrics_endpoint))
    sock = socket.socket(socket.AF_INET6 if ":" in args.host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((args.host, port))
    except OSError as error:
        sock.close()
        sidecar_log.error(f"Failed to start HTTP sidecar server: {error}. Continuing without "
                          "metrics/profile endpoints.", exc_info=True)
        return None
    server = _Sidecar(uvicorn.Config(Starlette(routes=routes), log_level="warning",
                                     lifespan="off"))
    server.task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started and not server.task.done():
        await asyncio.sleep(0.05)
    sidecar_log.info(f"HTTP sidecar server started on http://{args.host}:{port}")
    return server


def _wait_and_warmup(state: State, raw: Namespace, health: Any,
                     loop: asyncio.AbstractEventLoop) -> None:
    """server.py's _wait_and_warmup_grpc: the warm-up, then SERVING and the ready line."""
    if state.args.skip_server_warmup:
        server_log.info("Skipping gRPC server warmup (skip_server_warmup=True)")
    elif not _execute_warmup(state, raw):
        return
    health.set_serving()
    loop.call_soon_threadsafe(_ready, state)
    server_log.info("The server is fired up and ready to roll!")


def _ready(state: State) -> None:
    state.dispatch.reset_stats()  # the simulator's fault counts start after the warm-up
    state.up = True


def _execute_warmup(state: State, raw: Namespace) -> bool:
    """server.py's _execute_grpc_server_warmup: GetModelInfo until it answers (120 tries),
    one 8-token request, the servicer's planned warm-up over the same channel; a failure
    SIGKILLs the server and its children."""
    import grpc
    from smg_grpc_proto import sglang_scheduler_pb2 as pb
    from smg_grpc_proto import sglang_scheduler_pb2_grpc as pb_grpc
    from smg_grpc_servicer.hostport import loopback_target

    channel = None
    try:
        channel = grpc.insecure_channel(
            loopback_target(state.args.host, state.args.port),
            options=[("grpc.max_send_message_length", 1024 * 1024 * 256),
                     ("grpc.max_receive_message_length", 1024 * 1024 * 256)])
        stub = pb_grpc.SglangSchedulerStub(channel)
        info, last_error = None, None
        for _ in range(120):
            time.sleep(1)
            try:
                info = stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=5)
                break
            except Exception as error:
                last_error = str(error)
        if info is None:
            server_log.error("gRPC server warmup failed: Could not connect to server after 120 "
                             f"seconds. Last error: {last_error}")
            channel.close()
            state.children.kill_tree(include_parent=True)
            return False
        server_log.info("Sending warmup request to gRPC server...")
        request = pb.GenerateRequest(
            request_id=f"WARMUP_{time.time()}",
            tokenized=pb.TokenizedInput(input_ids=[123, 456, 789, 234, 567, 890, 345],
                                        original_text="warmup request"),
            sampling_params=pb.SamplingParams(temperature=0, top_p=1, top_k=1,
                                              repetition_penalty=1, n=1, max_new_tokens=8),
            stream=False)
        if getattr(raw, "disaggregation_mode", "null") != "null":
            request.disaggregated_params.bootstrap_host = "2.2.2.2"  # FAKE_BOOTSTRAP_HOST
            request.disaggregated_params.bootstrap_room = 0
        try:
            responses = list(stub.Generate(request, timeout=600))
        except Exception as error:
            server_log.error(f"gRPC warmup request failed: {error}")
            channel.close()
            state.children.kill_tree(include_parent=True)
            return False
        success = bool(responses and responses[-1].HasField("complete"))
        if success:
            server_log.info("gRPC warmup request completed successfully")
            _planned_warmup(raw, info, channel)
        else:
            server_log.warning("gRPC warmup request returned no complete response")
        channel.close()
        return success
    except Exception as error:
        server_log.error(f"gRPC warmup failed with exception: {error}\n"
                         f"{traceback.format_exc()}")
        if channel is not None:
            channel.close()
        state.children.kill_tree(include_parent=True)
        return False


def _planned_warmup(raw: Namespace, info: Any, channel: Any) -> None:
    """server.py's planned_warmup: the servicer's own plan and pass (its warmup modules, as
    they are); a failure of the pass is one line, never the end of the server."""
    from smg_grpc_servicer.sglang.warmup import warmup_inputs, warmup_wire
    from smg_grpc_servicer.warmup import parse_setting, plan_for, run_warmup

    env = "SMG_SGLANG_SERVICER_WARMUP"
    try:
        try:
            setting = parse_setting(os.environ.get(env), name=env)
        except ValueError as error:
            server_log.warning("%s; the planned warm-up is skipped", error)
            return
        if getattr(raw, "disaggregation_mode", "null") != "null":
            server_log.info("Planned warm-up: none on a disaggregation role on this servicer")
            return
        facts = {"is_generation": info.is_generation,
                 "max_context_length": info.max_context_length, "vocab_size": info.vocab_size}
        plan = plan_for(setting, warmup_inputs(raw, facts, pins_ranks=False), knob=env)
        if plan is not None:
            run_warmup(plan, warmup_wire("", channel=channel), budget_secs=setting.budget_secs)
    except Exception:
        server_log.exception("The planned warm-up failed; the server serves without it")
