"""The server's process tree and how it dies, as SGLang's does.

- ``Children``: the scheduler (per TP rank) and the detokenizer, forked before the model loads
  (Engine._launch_subprocesses), watched once loaded by the SubprocessWatchdog
  (0.5.10 entrypoints/engine.py:737-746; 0.5.23 engine.py:1313), which polls every second and,
  for a child gone with a non-zero exit code, logs ``Subprocess NAME (pid=P) crashed with exit
  code C. Triggering SIGQUIT for cleanup...`` and sends SIGQUIT to the server itself
  (utils/watchdog.py SubprocessWatchdog._check_processes, the same in 0.5.10 - 0.5.23).
- SIGQUIT: while starting, launch_phase_sigquit_handler logs ``Received sigquit from a child
  process. It usually means the child failed.`` (0.5.10 entrypoints/engine.py:1153, 0.5.23
  engine.py:1978); once serving, TokenizerManager's running_phase_sigquit_handler logs ``SIGQUIT
  received. signum=..., frame=.... It usually means one child failed.`` (0.5.10
  managers/tokenizer_manager.py:2561, 0.5.23 :4074) and stops the SubprocessWatchdog. Both end in
  ``kill_process_tree(os.getpid())``: SIGKILL to every child, then to the server itself
  (0.5.10 utils/common.py:1038-1066; from 0.5.13 it first logs ``kill_process_tree called:
  parent_pid=P, include_parent=True, pid=P``). So a crashed server ends killed by SIGKILL.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import FrameType

from sglang_sim import args as args_mod

logger = logging.getLogger("sglang.srt.managers.tokenizer_manager")
common = logging.getLogger("sglang.srt.utils.common")
WATCHDOG_INTERVAL = 1.0  # SubprocessWatchdog(interval=1.0)


class Children:
    """The server's children and the watchdog that turns one's death into the server's."""

    def __init__(self, release: str, tp_size: int) -> None:
        self.release = release
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        for rank in range(tp_size):
            self.procs[f"scheduler_{rank}"] = _spawn("scheduler", rank)
        self.procs["detokenizer"] = _spawn("detokenizer", 0)
        self._stop = threading.Event()
        self._watching: threading.Thread | None = None
        self._signals = threading.current_thread() is threading.main_thread()
        if self._signals:  # as SGLang: handlers only from the main thread (engine.py)
            signal.signal(signal.SIGQUIT, self._launch_phase)

    @property
    def scheduler(self) -> subprocess.Popen[bytes]:
        return self.procs["scheduler_0"]

    def tell(self, command: str) -> None:
        """A fault for the TP0 scheduler (``exception JSON``, ``hang SECONDS``)."""
        stdin = self.scheduler.stdin
        if stdin is not None and self.scheduler.poll() is None:
            stdin.write(f"{command}\n".encode())
            stdin.flush()

    def exception(self, formatted: str, wait: bool = True) -> None:
        """The TP0 scheduler hits an exception (its traceback, formatted): it logs it and sends
        SIGQUIT to the server, whose handler then kills the whole tree. ``wait``: for that end,
        as the server's launch waits on its scheduler (returns if no SIGQUIT came)."""
        self.tell("exception " + json.dumps(formatted))
        if not wait:
            return
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and self.scheduler.poll() is None:
            time.sleep(0.1)

    def serving(self) -> None:
        """The model is loaded (wait_for_ready): the watchdog starts."""
        self._watching = threading.Thread(target=self._watch, daemon=True,
                                          name="subprocess-watchdog")
        self._watching.start()

    def _watch(self) -> None:
        while not self._stop.wait(WATCHDOG_INTERVAL):
            for name, proc in self.procs.items():
                code = proc.poll()
                if code is None or code == 0:
                    continue
                logger.error(f"Subprocess {name} (pid={proc.pid}) crashed with exit code "
                             f"{code}. Triggering SIGQUIT for cleanup...")
                os.kill(os.getpid(), signal.SIGQUIT)
                return

    def stop_watching(self) -> None:
        self._stop.set()
        if self._watching is not None and self._watching is not threading.current_thread():
            self._watching.join(timeout=2 * WATCHDOG_INTERVAL)

    def _launch_phase(self, signum: int, frame: FrameType | None) -> None:
        logging.getLogger("sglang.srt.entrypoints.engine").error(
            "Received sigquit from a child process. It usually means the child failed.")
        self.kill_tree(include_parent=True)

    def handle_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        """TokenizerManager.auto_create_handle_loop, at the first generate request (the
        warm-up): SIGQUIT gets the running-phase handler, through the loop, which calls it
        without arguments (0.5.10 managers/tokenizer_manager.py:1515, 0.5.23 :2457)."""
        if self._signals:
            loop.add_signal_handler(signal.SIGQUIT, self._running_phase)

    def _running_phase(self, signum: int | None = None, frame: FrameType | None = None) -> None:
        logger.error(f"SIGQUIT received. {signum=}, {frame=}. It usually means one child failed.")
        self._stop.set()
        self.kill_tree(include_parent=True)

    def kill_tree(self, include_parent: bool) -> None:
        """utils/common.py kill_process_tree(os.getpid(), include_parent)."""
        if args_mod.release_tuple(self.release) >= (0, 5, 13, 0):
            common.info(f"kill_process_tree called: parent_pid={os.getpid()}, "
                        f"include_parent={include_parent}, pid={os.getpid()}")
        for proc in self.procs.values():
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
        if include_parent:  # as SGLang: no wait for the children, itself next
            logging.shutdown()
            sys.stderr.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        for proc in self.procs.values():
            proc.wait()


def _spawn(role: str, rank: int) -> subprocess.Popen[bytes]:
    """The child under SGLang's process title (setproctitle there; argv[0] here, which leaves
    the interpreter unable to find its own packages: PYTHONPATH names the simulator's)."""
    title = f"sglang::scheduler_TP{rank}" if role == "scheduler" else "sglang::detokenizer"
    here = str(Path(__file__).resolve().parent.parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [here, *filter(None, [os.environ.get("PYTHONPATH")])])}
    return subprocess.Popen([title, "-m", "sglang_sim.child", role, str(rank)],
                            executable=sys.executable, stdin=subprocess.PIPE, env=env)
