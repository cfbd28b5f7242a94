"""Progress of long work on a host, a line every ``EVERY`` seconds, which the deploy shows as
it comes (``sglang_fleet.ops.live``) instead of staying silent for minutes (standard library
only):

    meter = Meter(total=55_560_000_000, done=0)
    with Reporter(lambda: "weights: " + meter.line()):
        ...  # meter.add(n) as bytes arrive (from any thread), or Meter(measure=...) to poll
    # weights: 12.34 GB of 55.56 GB (22%), 410 MB/s, about 1 min 45 s left
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from types import TracebackType

EVERY = 10.0  # seconds between two lines
WINDOW = 30.0  # seconds of recent transfer the rate (and so the ETA) is measured over


def size(n: float) -> str:
    """Bytes in decimal units, as ``df -H`` and the staging's last line say them.

    >>> size(12_345_678_901), size(410_000_000), size(999)
    ('12.35 GB', '410 MB', '999 B')
    """
    for unit, scale in (("TB", 1e12), ("GB", 1e9)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    for unit, scale in (("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.0f} {unit}"
    return f"{n:.0f} B"


def duration(seconds: float) -> str:
    """A time span the way an operator reads it.

    >>> duration(42), duration(105), duration(7380)
    ('42 s', '1 min 45 s', '2 h 3 min')
    """
    s = max(0, round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60} s"
    return f"{s // 3600} h {s % 3600 // 60} min"


class Meter:
    """Bytes done of a known total, and the rate they come at: counted with ``add`` (from any
    thread), or read with ``measure`` (e.g. the bytes under a directory) at each line."""

    def __init__(self, total: int, done: int = 0, measure: Callable[[], int] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.total = max(0, total)
        self._done = done
        self._measure = measure
        self._clock = clock
        self._lock = threading.Lock()
        self._samples: deque[tuple[float, int]] = deque([(clock(), done)])

    def add(self, n: int) -> None:
        with self._lock:
            self._done += n

    @property
    def done(self) -> int:
        """Bytes done so far, never above the total (a retried part is not counted twice)."""
        if self._measure is not None:
            with self._lock:
                self._done = self._measure()
        return min(self._done, self.total) if self.total else self._done

    def rate(self) -> float:
        """Bytes per second over the last ``WINDOW`` seconds (since the start before that)."""
        now, done = self._clock(), self.done
        with self._lock:
            self._samples.append((now, done))
            while len(self._samples) > 2 and now - self._samples[1][0] >= WINDOW:
                self._samples.popleft()
            then, before = self._samples[0]
        return (done - before) / (now - then) if now > then else 0.0

    def line(self) -> str:
        """``12.34 GB of 55.56 GB (22%), 410 MB/s, about 1 min 45 s left``."""
        rate, done = self.rate(), self.done
        share = f" ({100 * done // self.total}%)" if self.total else ""
        text = f"{size(done)} of {size(self.total)}{share}, {size(rate)}/s"
        left = self.total - done
        if left > 0:
            text += f", about {duration(left / rate)} left" if rate > 0 else ", stalled"
        return text


def say(line: str) -> None:
    """A progress line on standard output, at once (the stage shows it as it comes)."""
    print(line, flush=True)


class Reporter:
    """Prints ``line()`` every ``every`` seconds from a thread of its own while the ``with``
    block runs (the work itself may block in a library call for minutes)."""

    def __init__(self, line: Callable[[], str], every: float = EVERY,
                 emit: Callable[[str], None] = say) -> None:
        self._line, self._every, self._emit = line, every, emit
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="progress", daemon=True)

    def _run(self) -> None:
        start = time.monotonic()
        beat = 1
        # On a fixed beat from the start: a slow line() does not push the next one later.
        while not self._stop.wait(max(0.0, start + beat * self._every - time.monotonic())):
            beat += 1
            try:
                self._emit(self._line())
            except Exception as exc:  # progress never fails the work it reports on
                self._emit(f"progress unavailable: {type(exc).__name__}: {exc}")

    def __enter__(self) -> Reporter:
        if self._every > 0:
            self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)
