"""``python -m sglang_sim.child scheduler|detokenizer TP_RANK``: the stand-in for one of the
processes SGLang's server forks (``sglang::scheduler_TP0``, ``sglang::detokenizer``).

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
  can print, and sends SIGQUIT (0.5.23 utils/watchdog.py:150-163).
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import signal
import sys
import threading
import time
import traceback
from types import FrameType

from sglang_sim import logs

PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    ctypes.CDLL("libc.so.6").prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


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


def _commands() -> None:
    for line in sys.stdin:
        verb, _, rest = line.strip().partition(" ")
        if verb == "exception":
            exception(json.loads(rest))
        elif verb == "hang":
            watchdog_timeout(rest)


def main(argv: list[str]) -> None:
    _die_with_parent()
    role, rank = argv[0], int(argv[1]) if len(argv) > 1 else 0
    logs.configure(os.environ.get("SGLANG_SIM_LOG_LEVEL", "info"), tp_rank=rank)
    if role == "scheduler":
        signal.signal(signal.SIGUSR1, _sigusr1)
        threading.Thread(target=_commands, daemon=True).start()
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main(sys.argv[1:])
