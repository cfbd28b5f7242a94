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
from collections.abc import Callable
from pathlib import Path
from types import FrameType

from sglang_sim import args as args_mod
from sglang_sim import logs

logger = logging.getLogger("sglang.srt.managers.tokenizer_manager")
common = logging.getLogger("sglang.srt.utils.common")
WATCHDOG_INTERVAL = 1.0  # SubprocessWatchdog(interval=1.0)


class Children:
    """The server's children and the watchdog that turns one's death into the server's.

    With ``dp_size`` > 1 the server forks the DP controller instead of its schedulers (0.5.12
    entrypoints/engine.py:584-653, 0.5.23 engine.py:910-983); the controller forks one scheduler
    per DP rank (child.py) and the watchdog watches the controller as ``scheduler_0`` and the
    detokenizer (0.5.12 engine.py:866-876, 0.5.23 :1360-1367), never the DP ranks' schedulers:
    a DP rank's scheduler killed outright is noticed by nothing (its requests wait forever).
    """

    def __init__(self, release: str, tp_size: int, dp_size: int = 1,
                 ranks: list[int] | None = None, grpc: bool = False) -> None:
        """``ranks``: the TP ranks this node runs (multinode.py; all of them on one node). A
        node ≥ 1 forks no detokenizer: its main process runs no tokenizer or detokenizer
        (0.5.12 entrypoints/engine.py:812-839, 0.5.23 :1234-1290). ``grpc``: the gRPC
        servicer's launch (grpc_mode.py) forks the schedulers alone and sets no SIGQUIT
        handler while they load."""
        self.release = release
        self.dp_size = dp_size
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.dp_pids: list[list[int]] = []  # each DP rank's schedulers (scheduler_pids)
        if dp_size > 1:
            read, write = os.pipe()  # the controller's ready message (its mp.Pipe in SGLang)
            self.procs["scheduler_0"] = _spawn(
                "sglang::data_parallel_controller",
                ["controller", str(tp_size), str(dp_size), str(write)], pass_fds=(write,))
            os.close(write)
            self.dp_pids = self._scheduler_pids(read)
        else:
            for i, rank in enumerate(range(tp_size) if ranks is None else ranks):
                self.procs[f"scheduler_{i}"] = spawn_scheduler(
                    logs.scheduler_prefix(rank, tp_size, None), ignore_sigint=grpc)
        if (ranks is None or 0 in ranks) and not grpc:
            self.procs["detokenizer"] = _spawn("sglang::detokenizer", ["detokenizer"])
        self._stop = threading.Event()
        self._watching: threading.Thread | None = None
        self._signals = threading.current_thread() is threading.main_thread()
        if self._signals and not grpc:  # as SGLang: handlers only from the main thread
            signal.signal(signal.SIGQUIT, self._launch_phase)

    @property
    def scheduler(self) -> subprocess.Popen[bytes]:
        """The process the server forked for its schedulers: TP0's, or the DP controller."""
        return self.procs["scheduler_0"]

    def _scheduler_pids(self, fd: int) -> list[list[int]]:
        """The controller's report of its schedulers (SCHEDULER_PIDS_ARG in its ready message)."""
        with os.fdopen(fd, "rb") as pipe:
            line = pipe.readline()
        if not line:
            raise RuntimeError(_died_during_init(self.scheduler))
        pids: list[list[int]] = json.loads(line)["scheduler_pids"]
        return pids

    def dp_rank_alive(self, dp_rank: int) -> bool:
        """Whether every scheduler of a DP rank still runs (a zombie does not: the controller
        never reaps them, as SGLang's does not while it serves)."""
        return all(_running(pid) for pid in self.dp_pids[dp_rank]) if self.dp_pids else True

    def tell(self, command: str, dp_rank: int = 0) -> None:
        """A fault for a scheduler (``exception JSON``, ``hang SECONDS``): TP0's, or DP rank
        ``dp_rank``'s through the controller."""
        stdin = self.scheduler.stdin
        if stdin is not None and self.scheduler.poll() is None:
            line = f"{dp_rank} {command}" if self.dp_size > 1 else command
            stdin.write(f"{line}\n".encode())
            stdin.flush()

    @property
    def schedulers(self) -> list[subprocess.Popen[bytes]]:
        return [p for name, p in self.procs.items() if name.startswith("scheduler_")]

    def tell_all(self, command: str) -> None:
        """The same command to every scheduler of this node (without DP)."""
        for proc in self.schedulers:
            if proc.stdin is not None and proc.poll() is None:
                with contextlib.suppress(OSError):
                    proc.stdin.write(f"{command}\n".encode())
                    proc.stdin.flush()

    def exception(self, formatted: str, wait: bool = True, dp_rank: int = 0) -> None:
        """A scheduler hits an exception (its traceback, formatted): it logs it and sends
        SIGQUIT to its parent, the server, whose handler then kills the whole tree; with DP the
        parent is the controller, which dies of it. ``wait``: for that end, as the server's
        launch waits on its scheduler; with DP the server then raises what SGLang's
        _wait_for_scheduler_ready raises (returns if no SIGQUIT came)."""
        self.tell("exception " + json.dumps(formatted), dp_rank)
        if not wait:
            return
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and self.scheduler.poll() is None:
            time.sleep(0.1)
        if self.dp_size > 1 and self.scheduler.poll() is not None:
            raise RuntimeError(_died_during_init(self.scheduler))

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


def spawn_scheduler(prefix: str, ignore_sigint: bool = False) -> subprocess.Popen[bytes]:
    """A scheduler under its process title: ``sglang::scheduler`` and its ranks, spaces as
    ``_`` (0.5.12 managers/scheduler.py:3966, 0.5.23 :6294): ``sglang::scheduler_DP3``.
    ``ignore_sigint``: the gRPC servicer's schedulers ignore SIGINT (smg-grpc-servicer
    sglang/scheduler_launcher.py:34-49); Python leaves a signal ignored at its start so."""
    return _spawn(f"sglang::scheduler{prefix.replace(' ', '_')}",
                  ["scheduler", prefix.strip().replace(" ", "_")],
                  preexec=_ignore_sigint if ignore_sigint else None)


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _spawn(title: str, argv: list[str], pass_fds: tuple[int, ...] = (),
           preexec: Callable[[], None] | None = None) -> subprocess.Popen[bytes]:
    """The child under SGLang's process title (setproctitle there; argv[0] here, which leaves
    the interpreter unable to find its own packages: PYTHONPATH names the simulator's)."""
    here = str(Path(__file__).resolve().parent.parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [here, *filter(None, [os.environ.get("PYTHONPATH")])]), "SGLANG_SIM_PARENT_PID":
        str(os.getpid())}
    # a child under a title has no sys.executable: the DP controller forks by /proc/self/exe
    python = sys.executable or os.readlink("/proc/self/exe")
    return subprocess.Popen([title, "-m", "sglang_sim.child", *argv], executable=python,
                            stdin=subprocess.PIPE, env=env, pass_fds=pass_fds,
                            preexec_fn=preexec)


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _died_during_init(proc: subprocess.Popen[bytes]) -> str:
    """_scheduler_died_error (0.5.10 - 0.5.23 entrypoints/engine.py; 0.5.12 :1315-1323): rank 0
    is the controller, its exit code SIGQUIT's when a DP rank's scheduler failed."""
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)
    return (f"Rank 0 scheduler died during initialization (exit code: {proc.returncode}). "
            "If exit code is -9 (SIGKILL), a common cause is the OS OOM killer. "
            "Run `dmesg -T | grep -i oom` to check.")
