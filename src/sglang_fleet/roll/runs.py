"""A roll's pyinfra runs: one process per batch, limited to its hosts, stopping at the first
error (a tolerant preparation: on every host it can); its output held until the roll shows it,
so two batches' lines never mix.

    run = pyinfra("inventories/b200.py", "serve", ["b200-01"], [], roll_dir.env())
    run.wait()      # its output shown, then its exit status
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

DEPLOYS = "sglang_fleet.converge"  # pyinfra runs these functions per host, from any directory


class Started(Protocol):
    def running(self) -> bool:
        """Whether the run's process is still going."""
        ...

    def wait(self) -> int:
        """Until the run ends (its output shown): its exit status."""
        ...


# Start one pyinfra run: inventory, deploy function, hosts, --data, extra environment.
Start = Callable[[str, str, list[str], Sequence[str], dict[str, str]], Started]


class PyinfraRun:
    """A pyinfra run in its own process. Its output waits in a file (root's, 0600) until it
    is shown by ``wait``: a batch's run starts while the batch before it is still converging,
    and their lines must not mix."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        fd, self.log = tempfile.mkstemp(prefix="sglang-fleet-run-", suffix=".log")
        with os.fdopen(fd, "wb") as out:
            self.proc = subprocess.Popen(argv, env={**os.environ, **env}, stdout=out,
                                         stderr=subprocess.STDOUT)
        self.shown = 0

    def running(self) -> bool:
        return self.proc.poll() is None

    def wait(self) -> int:
        with open(self.log, "rb") as log:
            log.seek(self.shown)
            while True:
                ended = self.proc.poll() is not None
                chunk = log.read()
                if chunk:
                    sys.stdout.buffer.write(chunk)
                    sys.stdout.flush()
                    self.shown += len(chunk)
                if ended:
                    break
                time.sleep(0.1)
        Path(self.log).unlink(missing_ok=True)
        return self.proc.returncode


def pyinfra(inventory: str, deploy: str, hosts: list[str], data: Sequence[str],
            env: dict[str, str], parallel: int | None = None,
            tolerant: bool = False) -> Started:
    """One pyinfra run limited to ``hosts`` (never asks) that stops at the first error; a
    preparation of a roll that ``tolerant``-ly skips failed hosts goes on on every host it can
    (each says when it is prepared). ``parallel``: hosts a preparation works on at once
    (pyinfra's default: 20 per CPU of this machine); a batch's run works on all its hosts at
    once, since they wait for their turn together, each holding one of pyinfra's places."""
    stop = [] if deploy == "prepare" and tolerant else ["--fail-percent", "0"]
    at_once = parallel if deploy == "prepare" else max(parallel or 0, len(hosts))
    argv = [sys.executable, "-m", "pyinfra", "-y", *stop,
            *([f"--parallel={at_once}"] if at_once else []), inventory,
            f"{DEPLOYS}.{deploy}", *(f"--limit={h}" for h in hosts),
            *(f"--data={d}" for d in data)]
    return PyinfraRun(argv, env)
