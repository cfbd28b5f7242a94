"""A node ≥ 1 once its schedulers are ready (``node_rank >= 1`` in Engine._launch_subprocesses:
0.5.10 entrypoints/engine.py:681-705, 0.5.12 :812-839, 0.5.23 :1234-1290).

- No tokenizer, detokenizer or HTTP API: the main process starts launch_dummy_health_check_server
  on its own ``--host``/``--port`` (0.5.12 utils/common.py:2579-2639, 0.5.23 :3624-3685): FastAPI
  with GET ``/ping``, ``/health`` and ``/health_generate``, each an empty 200, served by uvicorn
  in a daemon thread ``health-check-server`` at log level warning without a log config (so no
  uvicorn lines), then logs ``Dummy health check server started in background thread at
  HOST:PORT``. Its answers say nothing of the schedulers or the peers.
- It then joins its schedulers, logging ``Scheduler or DataParallelController PID terminated with
  CODE`` (ERROR) as each ends (0.5.12 engine.py:664-670, 0.5.23 :1014-1026). 0.5.21+ then return
  from launch_server (http_server.py:3163), whose ``finally`` kills the rest of the tree
  (launch_server.py:84-86) and the process exits 0. Up to 0.5.20 it falls into the HTTP server's
  setup with no tokenizer manager (0.5.12 http_server.py:2339-2361); how that ends was not
  settled from source (needs a run): the simulator ends those releases as 0.5.21+.
- Its SIGQUIT handler stays the launch phase's (processes.py), so a scheduler exception ends it
  killed by SIGKILL. SIGTERM: no handler up to 0.5.20 (the default action ends it, its schedulers
  die with it); 0.5.21+ install one once the schedulers are ready that only logs ``SIGTERM received
  on node_rank R; waiting for the rank-0 ShutdownReq broadcast to stop the schedulers.``
  (0.5.23 engine.py:1258-1273).
"""

from __future__ import annotations

import asyncio
import json
import logging
import select
import signal
import sys
import threading
from types import FrameType
from typing import TYPE_CHECKING, Any

import uvicorn

from sglang_sim import multinode
from sglang_sim.args import release_tuple

if TYPE_CHECKING:
    from sglang_sim.state import State

engine_log = logging.getLogger("sglang.srt.entrypoints.engine")
common = logging.getLogger("sglang.srt.utils.common")
NODE_SIGTERM_HANDLER = (0, 5, 21, 0)
POLL_SECONDS = 0.2


def host_port(host: str, port: int) -> str:
    """NetworkAddress.to_host_port_str: an IPv6 host in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def dummy_app() -> Any:
    """The FastAPI app as Starlette: GET only (FastAPI adds no HEAD: 405), FastAPI's JSON
    ``{"detail": …}`` for 404 and 405, an empty 200 (content-length 0, no content type)."""
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    async def ok(_: Request) -> Response:
        return Response(status_code=200)

    async def detail(_: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        return Response(json.dumps({"detail": exc.detail}, separators=(",", ":")),
                        exc.status_code, headers=exc.headers, media_type="application/json")

    routes = [Route(path, ok, methods=["GET"]) for path in ("/ping", "/health",
                                                             "/health_generate")]
    for route in routes:
        assert route.methods is not None
        route.methods.discard("HEAD")
    return Starlette(routes=routes, exception_handlers={HTTPException: detail})


def launch_dummy_health_check_server(host: str, port: int) -> None:
    config = uvicorn.Config(dummy_app(), host=host, port=port, timeout_keep_alive=5,
                            log_config=None, log_level="warning", lifespan="off")
    server = uvicorn.Server(config)
    threading.Thread(target=lambda: asyncio.run(server.serve()), daemon=True,
                     name="health-check-server").start()
    common.info(f"Dummy health check server started in background thread at "
                f"{host_port(host, port)}")


def follow(state: State) -> None:
    """Serve the dummy health server and follow rank 0 until this node's schedulers end."""
    args, children, peers = state.args, state.children, state.peers
    assert peers is not None and peers.leader is not None
    if (release_tuple(state.release) >= NODE_SIGTERM_HANDLER
            and threading.current_thread() is threading.main_thread()):
        def on_sigterm(signum: int, frame: FrameType | None) -> None:
            engine_log.warning(
                f"SIGTERM received on node_rank {args.node_rank}; waiting for the rank-0 "
                "ShutdownReq broadcast to stop the schedulers.")
        signal.signal(signal.SIGTERM, on_sigterm)
    launch_dummy_health_check_server(args.host, args.port)
    busy = False
    buffer = b""
    while all(proc.poll() is None for proc in children.schedulers):
        if not select.select([peers.leader], [], [], POLL_SECONDS)[0]:
            continue
        try:
            chunk = peers.leader.recv(256)
        except OSError:
            chunk = b""
        if not chunk:  # rank 0's node is gone
            if not peers.closing:
                multinode.lost_peer(children, state.dispatch.engines, args, state.release,
                                    peers.peer, busy)
            break
        buffer += chunk
        *lines, rest = buffer.split(b"\n")
        buffer = rest
        for line in lines:
            if line in (b"busy", b"idle"):
                busy = line == b"busy"
            elif line == b"shutdown":  # the ShutdownReq broadcast: every scheduler exits 0
                peers.closing = True
                children.tell_all("exit")
    for proc in children.schedulers:
        code = proc.wait()
        engine_log.error(f"Scheduler or DataParallelController {proc.pid} terminated with {code}")
    children.kill_tree(include_parent=False)
    sys.exit(0)
