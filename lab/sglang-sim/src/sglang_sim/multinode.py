"""``--nnodes N --node-rank R --dist-init-addr HOST:PORT [--dist-timeout S]``: one node of a tensor
parallel group spread over N nodes, as SGLang runs it (read in the 0.5.10 - 0.5.23 wheels; the
study is the project's multi-node report). Citations are ``release/sglang/srt/<file>:<line>``.

- Checks (check_server_args, in the server process before any child): ``(tp*pp) % nnodes`` →
  ``tp_size must be divisible by number of nodes`` (0.5.12 server_args.py:7231-7233, 0.5.23
  arg_groups/validation_hook.py:178-181); ``--dp-size`` > 1 across nodes (0.5.12 :7255-7257
  without DP attention; 0.5.22+ validation_hook.py:199-202 whatever the attention).
- Layout: node R runs TP ranks ``[R*T/N, (R+1)*T/N)`` on its own GPUs from the first
  (_calculate_rank_ranges, 0.5.12 entrypoints/engine.py; gpu_id 0.5.23 engine.py:935-939).
- Rendezvous: rank 0's scheduler hosts torch's TCPStore at the init address and waits for all T
  ranks (every rank of node 0 included); ranks on other nodes connect to it. Until all have
  joined, ``Init torch distributed begin.`` (0.5.12 model_executor/model_runner.py:1188) or,
  0.5.21+, ``Init parallel begin.`` (0.5.23 distributed/bootstrap.py:115) is the last line; then
  ``Init torch distributed ends. elapsed=…, mem usage=… GB`` (0.5.12 :1320-1323) or ``Init
  parallel ends. elapsed=…`` and ``Memory baseline taken. mem usage=… GB`` (0.5.23 :190,
  :219-222). The timeout is ``--dist-timeout`` seconds, else torch's NCCL default of 600 s.
  Rank 0 then raises torch's ``DistStoreError: Timed out after <timeout+1> seconds waiting for
  clients. <joined>/<T> clients joined.`` and a rank ≥ 1 that never reaches rank 0
  ``DistNetworkError: The client socket has timed out after <ms>ms while trying to connect to
  (HOST, PORT).`` (torch's TCPStore.cpp and socket.cpp texts, not SGLang's); either is a
  scheduler exception (processes.py: ``Scheduler hit an exception``, SIGQUIT, the tree
  SIGKILLed).
- The peer channel: SGLang's ranks talk over NCCL and gloo; here each node ≥ 1 keeps the TCP
  connection it made to rank 0's init port, and rank 0 tells it when a batch is in flight. A
  process that dies closes it, as the kernel closes a dead rank's gloo sockets. There is no
  heartbeat: SGLang has none, and a silent loss (no FIN, no RST) goes unnoticed there too.
- A lost peer, idle: the scheduler loop broadcasts on the TP gloo group every iteration even
  idle (0.5.12 managers/scheduler.py:1715-1723 broadcast_pyobj; 0.5.23
  scheduler_components/request_receiver.py:204-210), so the next iteration raises gloo's
  ``Connection closed by peer`` at once: a scheduler exception. Busy: the forward's NCCL
  collective hangs until the TP group's timeout, ``--dist-timeout`` from 0.5.11 (0.5.12
  distributed/parallel_state.py:1698-1708), torch's 600 s on 0.5.10 (WORLD only), or the
  scheduler's own ``--watchdog-timeout`` if that comes first (child.py for both ends); no request
  moves meanwhile, so rank 0's /health gives 503 after SGLANG_HEALTH_CHECK_TIMEOUT.
- Shutdown: 0.5.14+ rank 0's drained SIGTERM sends ShutdownReq, broadcast to every TP rank
  (0.5.14 managers/tokenizer_manager.py:2651, 0.5.23 :3547); earlier releases kill only rank 0's
  own tree, and the other nodes fail at their next broadcast. A node ≥ 1 is in follow().
"""

from __future__ import annotations

import contextlib
import json
import logging
import select
import socket
import threading
import time
import traceback
from argparse import Namespace
from collections.abc import Callable
from typing import TYPE_CHECKING

from sglang_sim.args import release_tuple

if TYPE_CHECKING:
    from sglang_sim.engine import Engine
    from sglang_sim.processes import Children

DEFAULT_TIMEOUT = 600  # [torch] default_pg_nccl_timeout: --dist-timeout unset on CUDA
NEW_INIT_LINES = (0, 5, 21, 0)  # distributed/bootstrap.py init_parallel_runtime
GROUP_TIMEOUT_FROM = (0, 5, 11, 0)  # _MODEL_PARALLEL_GROUP_TIMEOUT: --dist-timeout for TP groups
NEW_DP_RULE = (0, 5, 22, 0)
DIST_INIT_GB = 0.19  # the simulator's figure for NCCL/gloo buffers (measured only on GPUs)
GLOO_CLOSED = "[/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:547] Connection closed by peer"
WATCH_SECONDS = 0.1  # how often rank 0 tells the other nodes whether a batch is in flight


class DistStoreError(RuntimeError):
    """torch.distributed.DistStoreError, as its traceback names it."""


class DistNetworkError(RuntimeError):
    """torch.distributed.DistNetworkError, as its traceback names it."""


DistStoreError.__module__ = DistNetworkError.__module__ = "torch.distributed"


def check(args: Namespace, release: str) -> None:
    """check_server_args' multi-node rules: AssertionError in the server process (exit 1)."""
    nnodes = args.nnodes
    if (args.tp_size * getattr(args, "pp_size", 1)) % nnodes != 0:
        raise AssertionError("tp_size must be divisible by number of nodes")
    if args.dp_size > 1 and nnodes != 1:
        if release_tuple(release) >= NEW_DP_RULE:
            raise AssertionError("multi-node data-parallel replicas are not supported; use "
                                 "attention DP (--attn-dp-size) across nodes")
        if not getattr(args, "enable_dp_attention", False):
            raise AssertionError("multi-node data parallel is not supported unless dp attention!")


def local_ranks(args: Namespace) -> list[int]:
    per_node = args.tp_size // args.nnodes
    return list(range(args.node_rank * per_node, (args.node_rank + 1) * per_node))


def collective_timeout(args: Namespace, release: str) -> float:
    """How long a TP collective waits for a lost peer before torch's NCCL watchdog fires."""
    if release_tuple(release) >= GROUP_TIMEOUT_FROM and args.dist_timeout:
        return float(args.dist_timeout)
    return float(DEFAULT_TIMEOUT)


def _address(args: Namespace) -> tuple[str, int]:
    """``tcp://<dist_init_addr>`` as given; without it each node points at its own --host and a
    random port, so the nodes never meet (0.5.12 model_runner.py:1221-1228)."""
    if not args.dist_init_addr:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return args.host or "127.0.0.1", int(s.getsockname()[1])
    host, _, port = args.dist_init_addr.rpartition(":")
    return host.strip("[]"), int(port)


class Peers:
    """This node's end of the channel: rank 0's store and its clients, or the client."""

    def __init__(self, args: Namespace, release: str) -> None:
        self.args = args
        self.release = release
        self.timeout = int(args.dist_timeout or DEFAULT_TIMEOUT)
        self.world = args.tp_size
        self.clients: list[tuple[socket.socket, str]] = []  # rank 0: each node's, its address
        self.server: socket.socket | None = None
        self.leader: socket.socket | None = None  # node ≥ 1: its connection to rank 0
        self.closing = False  # ShutdownReq sent or received: a closed connection is expected
        self.peer = ""  # node ≥ 1: rank 0's address, as gloo names it

    def rendezvous(self, log: logging.Logger) -> None:
        """init_process_group: the begin line, every rank met (or the release's error), the end
        lines, with ``mem usage`` the simulator's DIST_INIT_GB once there are peers."""
        tic = time.perf_counter()
        new = release_tuple(self.release) >= NEW_INIT_LINES
        log.info("Init parallel begin." if new else "Init torch distributed begin.")
        if self.args.nnodes > 1:
            if self.args.node_rank == 0:
                self._host()
            else:
                self._join()
        usage = DIST_INIT_GB if self.world > 1 else 0.0
        elapsed = time.perf_counter() - tic
        if new:
            log.info(f"Init parallel ends. elapsed={elapsed:.2f} s")
            log.info(f"Memory baseline taken. mem usage={usage:.2f} GB")
        else:
            log.info(f"Init torch distributed ends. elapsed={elapsed:.2f} s, "
                     f"mem usage={usage:.2f} GB")

    def _host(self) -> None:
        """TCPStore's server on every interface; waitForWorkers counts whole seconds and fails
        once more than the timeout have passed."""
        server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("", _address(self.args)[1]))
        server.listen(64)
        self.server = server
        joined = self.world // self.args.nnodes  # node 0's own ranks, rank 0 included
        start = time.monotonic()
        while joined < self.world:
            left = start + self.timeout + 1 - time.monotonic()
            if left <= 0:
                raise DistStoreError(f"Timed out after {self.timeout + 1} seconds waiting for "
                                     f"clients. {joined}/{self.world} clients joined.")
            if not select.select([server], [], [], min(left, 0.5))[0]:
                continue
            conn, (host, port) = server.accept()
            conn.settimeout(5)
            with contextlib.suppress(OSError, ValueError):
                hello = json.loads(conn.makefile("r").readline())
                joined += int(hello["ranks"])
                self.clients.append((conn, f"[{host}]:{port}"))
        for conn, _ in self.clients:
            conn.settimeout(None)
            conn.sendall(b"go\n")

    def _join(self) -> None:
        """TCPStore's client: connect retries until the timeout, then waits for the group."""
        host, port = _address(self.args)
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                conn = socket.create_connection((host, port), timeout=1)
                break
            except OSError:
                if time.monotonic() >= deadline:
                    raise DistNetworkError(
                        f"The client socket has timed out after {self.timeout * 1000}ms while "
                        f"trying to connect to ({host}, {port}).") from None
                time.sleep(0.2)
        conn.settimeout(None)
        peer_host, peer_port = conn.getpeername()[:2]
        self.peer = f"[{peer_host}]:{peer_port}"
        ranks = self.world // self.args.nnodes
        conn.sendall(json.dumps({"node_rank": self.args.node_rank, "ranks": ranks}).encode()
                     + b"\n")
        self.leader = conn
        if self._read_line(conn) != "go":  # rank 0 died before the group formed
            raise DistNetworkError("failed to recv, got 0 bytes")

    @staticmethod
    def _read_line(conn: socket.socket) -> str:
        data = b""
        while not data.endswith(b"\n"):
            try:
                chunk = conn.recv(1)
            except OSError:
                return ""
            if not chunk:
                return ""
            data += chunk
        return data.decode().strip()

    def loaded(self) -> None:
        """Weight loading and CUDA graph capture run TP collectives: rank 0 is ready only when
        every rank is; a rank lost meanwhile is lost to the broadcast (raises)."""
        if self.leader is not None:
            self.leader.sendall(b"loaded\n")
            return
        for conn, address in self.clients:
            if self._read_line(conn) != "loaded":
                raise RuntimeError(f"{GLOO_CLOSED} {address}")

    def watch(self, busy: Callable[[], bool], lost: Callable[[str, bool], None]) -> None:
        """Rank 0, serving: tell the other nodes when a batch starts or ends; a connection that
        closes is a lost peer, noticed at once (the next iteration's broadcast)."""
        def run() -> None:
            state: bool | None = None
            while not self.closing:
                now = busy()
                if now != state:
                    state = now
                    self._send(b"busy\n" if now else b"idle\n")
                ready = select.select([c for c, _ in self.clients], [], [], WATCH_SECONDS)[0]
                for conn in ready:
                    if self._eof(conn) and not self.closing:
                        # whether a batch runs now, not at the last look: the next
                        # iteration's broadcast, idle, or a forward's collective, busy
                        lost(dict(self.clients)[conn], busy())
                        return
        threading.Thread(target=run, daemon=True, name="tp-peers").start()

    @staticmethod
    def _eof(conn: socket.socket) -> bool:
        try:
            return conn.recv(64) == b""
        except OSError:
            return True

    def _send(self, message: bytes) -> None:
        for conn, _ in self.clients:
            with contextlib.suppress(OSError):
                conn.sendall(message)

    def shutdown(self) -> None:
        """0.5.14+: ShutdownReq rides the TP broadcast to every rank of every node."""
        self.closing = True
        self._send(b"shutdown\n")


def lost_peer(children: Children, engines: list[Engine], args: Namespace, release: str,
              address: str, busy: bool) -> None:
    """What this node's schedulers (``children``, ``engines``) do when a peer is gone (see the
    module's docstring)."""
    if not busy:
        try:
            raise RuntimeError(f"{GLOO_CLOSED} {address}")
        except RuntimeError:
            children.exception(traceback.format_exc(), wait=False)
        return
    for engine in engines:
        engine.stuck = True  # the forward never returns: no request moves again
    nccl = collective_timeout(args, release)
    if args.watchdog_timeout < nccl:
        children.tell(f"hang {args.watchdog_timeout!r}")
    else:
        _nccl_timeout(children, nccl, local_ranks(args))


def _nccl_timeout(children: Children, seconds: float, ranks: list[int]) -> None:
    for proc, rank in zip(children.schedulers, ranks, strict=False):
        if proc.stdin is not None and proc.poll() is None:
            with contextlib.suppress(OSError):
                proc.stdin.write(f"nccl_timeout {seconds!r} {rank}\n".encode())
                proc.stdin.flush()
