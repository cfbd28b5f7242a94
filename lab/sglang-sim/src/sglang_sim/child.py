"""``python -m sglang_sim.child scheduler RANKS | detokenizer | controller TP DP FD``: the stand-in
for one of the processes SGLang's server forks (``sglang::scheduler``,
``sglang::detokenizer``, ``sglang::data_parallel_controller`` and its ``sglang::scheduler_DP3``).

It holds no model; it lives and dies as SGLang's children do:
- its first act is PR_SET_PDEATHSIG = SIGKILL (run_scheduler_process → kill_itself_when_parent_died,
  0.5.23 srt/utils/common.py:3432), so no orphan outlives a killed server;
- SIGTERM and SIGINT keep their default dispositions: neither run_scheduler_process nor
  run_detokenizer_process installs a handler (0.5.10 managers/scheduler.py:3560-3625,
  0.5.23 managers/scheduler.py:6280-6380, detokenizer_manager.py), so a SIGTERM sent to the
  whole control group ends them at once, in the middle of the server's drain;
- on a command from the server on its standard input (a fault the simulator injects: what the
  scheduler's model code raised), or on SIGUSR1 (a fault hook of the simulator's, not
  SGLang's), a scheduler hits an exception: it logs ``Scheduler hit an exception:
  <traceback>`` and sends SIGQUIT to its parent
  (0.5.23 managers/scheduler.py:6370-6373), then waits to be killed by the parent's handler;
- ``hang SECONDS`` stands for a forward batch that never returns: after ``--watchdog-timeout``
  the scheduler's watchdog logs ``Scheduler watchdog timeout (...)``, sleeps 5 s so the parent
  can print, and sends SIGQUIT (0.5.23 utils/watchdog.py:150-163);
- ``nccl_timeout SECONDS RANK`` stands for a TP collective whose peer node is gone (multinode.py):
  torch's NCCL watchdog ends the process with SIGABRT after the group's timeout; ``exit`` is the
  ShutdownReq broadcast from rank 0 (0.5.14+): the scheduler loop ends and the process exits 0.

The DP controller (``--dp-size`` > 1 without DP attention; see dp.py for the sources) forks a
scheduler per DP rank, logging ``Launch DP{d} starting at GPU #{base}.`` for each, and installs no
SIGQUIT handler: a DP rank's scheduler exception (its SIGQUIT goes to its parent, the controller)
ends the controller by SIGQUIT's default action, and every scheduler with it (their parent died).
It tells the server its schedulers' pids (``scheduler_pids``, one JSON line on the pipe FD) and
passes the server's fault commands (``D exception ...``) on to DP rank D's scheduler.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import resource
import signal
import subprocess
import sys
import threading
import time
import traceback
from types import FrameType

from sglang_sim import logs

PR_SET_PDEATHSIG = 1
PARENT = "SGLANG_SIM_PARENT_PID"  # who forked this child (processes.py)


def _die_with_parent() -> None:
    """As kill_itself_when_parent_died; a parent already gone before it (the simulator's load
    runs beside the children's own start) is a parent that died."""
    ctypes.CDLL("libc.so.6").prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if str(os.getppid()) != os.environ.get(PARENT, str(os.getppid())):
        os.kill(os.getpid(), signal.SIGKILL)


def exception(formatted: str) -> None:
    """run_scheduler_process's ``except Exception``: the traceback, then SIGQUIT to the parent
    (``formatted``: the traceback of what the simulated scheduler raised)."""
    logging.getLogger(logs.SCHEDULER).error(f"Scheduler hit an exception: {formatted}")
    os.kill(os.getppid(), signal.SIGQUIT)


def _sigusr1(signum: int, frame: FrameType | None) -> None:
    try:
        raise RuntimeError("simulated scheduler exception (SIGUSR1 to the scheduler)")
    except RuntimeError:
        exception(traceback.format_exc())


def watchdog_timeout(value: str) -> None:
    """WatchdogRaw._watchdog_once with soft=False, once a batch has not moved for ``value``
    seconds (as ServerArgs holds it: ``300`` by default, ``1.0`` from ``--watchdog-timeout 1``,
    printed with ``{self.watchdog_timeout=}``)."""
    time.sleep(float(value))
    logging.getLogger(logs.SCHEDULER).error(
        f"Scheduler watchdog timeout (self.watchdog_timeout={value}, self.soft=False)")
    print(file=sys.stderr, flush=True)
    print(file=sys.stdout, flush=True)
    time.sleep(5)
    os.kill(os.getppid(), signal.SIGQUIT)


def nccl_timeout(seconds: str, rank: str) -> None:
    """A TP collective whose peer is gone, as torch's NCCL watchdog ends it (multinode.py): after
    the group's timeout it logs the timed-out work and, under TORCH_NCCL_ASYNC_ERROR_HANDLING's
    default (3; SGLang sets no TORCH_NCCL_* variable), takes the process down from its C++
    thread: std::terminate, SIGABRT, no Python handler (so no "Scheduler hit an exception").
    The text is torch's (ProcessGroupNCCL.cpp), not SGLang's; its glog prefix varies by torch
    version and is shortened here."""
    time.sleep(float(seconds))
    ms = int(float(seconds) * 1000)
    work = f"WorkNCCL(SeqNum=1, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)={ms})"
    print(f"[rank{rank}]:[E ProcessGroupNCCL.cpp] [Rank {rank}] Watchdog caught collective "
          f"operation timeout: {work} ran for {ms + 1} milliseconds before timing out.\n"
          f"[rank{rank}]:[E ProcessGroupNCCL.cpp] [Rank {rank}] To avoid data inconsistency, "
          "we are taking the entire process down.\n"
          "terminate called after throwing an instance of 'c10::DistBackendError'",
          file=sys.stderr, flush=True)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # no core file where the test runs
    os.abort()


def _commands() -> None:
    for line in sys.stdin:
        verb, _, rest = line.strip().partition(" ")
        if verb == "exception":
            exception(json.loads(rest))
        elif verb == "hang":
            watchdog_timeout(rest)
        elif verb == "nccl_timeout":
            nccl_timeout(*rest.split())
        elif verb == "exit":  # ShutdownReq: the scheduler loop ends, the process exits 0
            os._exit(0)


def controller(tp_size: int, dp_size: int, ready_fd: int) -> None:
    """run_data_parallel_controller_process → launch_dp_schedulers: each DP rank's TP group from
    GPU ``dp_rank * tp_size`` (0.5.12 managers/data_parallel_controller.py:240-268, 0.5.23
    :420-449), its schedulers forked by the controller (0.5.12 :529-553, 0.5.23 :771-799)."""
    from sglang_sim import processes  # the children's spawner, here the controller's

    log = logging.getLogger("sglang.srt.managers.data_parallel_controller")
    groups: list[list[subprocess.Popen[bytes]]] = []
    for dp_rank in range(dp_size):
        log.info(f"Launch DP{dp_rank} starting at GPU #{dp_rank * tp_size}.")
        groups.append([processes.spawn_scheduler(logs.scheduler_prefix(t, tp_size, dp_rank))
                       for t in range(tp_size)])
    with os.fdopen(ready_fd, "w") as ready:
        ready.write(json.dumps({"scheduler_pids": [[p.pid for p in g] for g in groups]}) + "\n")
    for line in sys.stdin:  # the server's fault commands for one DP rank's scheduler
        rank, _, command = line.partition(" ")
        stdin = groups[int(rank)][0].stdin
        if stdin is not None and groups[int(rank)][0].poll() is None:
            stdin.write(command.encode())
            stdin.flush()


def main(argv: list[str]) -> None:
    _die_with_parent()
    role = argv[0]
    level = os.environ.get("SGLANG_SIM_LOG_LEVEL", "info")
    if role == "controller":
        logs.configure(level, prefix="")
        controller(int(argv[1]), int(argv[2]), int(argv[3]))
    elif role == "scheduler":
        logs.configure(level, prefix=f" {argv[1].replace('_', ' ')}" if argv[1] else "")
        signal.signal(signal.SIGUSR1, _sigusr1)
        threading.Thread(target=_commands, daemon=True).start()
    else:
        logs.configure(level)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main(sys.argv[1:])
