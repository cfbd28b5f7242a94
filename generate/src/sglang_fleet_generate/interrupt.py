"""SIGTERM stops a job as Ctrl-C does. asyncio.Runner turns SIGINT into a cancellation of its
main task, so the job unwinds through its ``finally`` blocks (input closed, connections
closed, the output's lock or lease given back; a shard being committed is on the output whole
or not at all, as after kill -9), then raises KeyboardInterrupt once the task is done (Python
3.11 asyncio/runners.py, Runner.run and Runner._on_sigint). This does the same for SIGTERM,
whatever SIGINT's disposition (a job started in the background of a script ignores SIGINT),
and raises Terminated, a KeyboardInterrupt naming its signal. A second SIGTERM while the job
unwinds raises at once, as a second Ctrl-C does.

    with sigterm_stops():
        run_loop(guard(run_job(opts)))  # Terminated(SIGTERM) after the job has unwound
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Coroutine, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import FrameType
from typing import Any, TypeVar

T = TypeVar("T")


class Terminated(KeyboardInterrupt):
    """The job was stopped by ``signum`` (SIGTERM), after unwinding as on Ctrl-C."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@dataclass
class _Watch:
    task: asyncio.Task[Any] | None = None  # the job's main task, while guard runs it
    signum: int | None = None
    count: int = 0


_watch = _Watch()


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    _watch.signum = signum
    _watch.count += 1
    task = _watch.task
    if task is not None and _watch.count == 1 and not task.done():
        task.cancel()
        task.get_loop().call_soon_threadsafe(lambda: None)  # wake a loop waiting in select
        return
    raise Terminated(signum)  # outside the job's loop (or a second signal): at once


@contextmanager
def sigterm_stops() -> Iterator[None]:
    """SIGTERM raises Terminated in this block (after the job unwinds, inside guard)."""
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
        _watch.signum, _watch.count = None, 0


async def guard(main: Coroutine[Any, Any, T]) -> T:
    """Run ``main`` as the task SIGTERM cancels; Terminated once it has unwound."""
    _watch.task = asyncio.current_task()
    try:
        return await main
    except asyncio.CancelledError:
        if _watch.signum is not None:
            raise Terminated(_watch.signum) from None
        raise
    finally:
        _watch.task = None


def signal_of(exc: KeyboardInterrupt) -> signal.Signals:
    """The signal behind an interruption: SIGTERM for Terminated, else Ctrl-C's SIGINT."""
    return signal.Signals(exc.signum) if isinstance(exc, Terminated) else signal.SIGINT
