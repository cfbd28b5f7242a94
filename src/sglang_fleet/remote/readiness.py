"""Time to ready of one start of an SGLang server, in parts, from that invocation's journal
(standard library only: the gate runs it on the host).

The marks, each the journal's own time of a line (microseconds, ``__REALTIME_TIMESTAMP``;
SGLang's ``[%Y-%m-%d %H:%M:%S]`` prefix has only seconds):

  start             systemd's "Started <unit>" job message (Type=exec: after the exec)
  weights           the target's "Load weight end. elapsed=..." (model_executor/model_runner.py,
                    0.5.10:1247, 0.5.23:1373; older: "type=..., dtype=..." without elapsed);
                    0.5.23's overlapped loading logs "Load weight end. Committed real weights
                    after CUDA graph capture" instead (startup_weight_load.py:538): not this
                    mark, the weights then load during the capture
  kv                the target's "Memory pool end." (0.5.10: model_runner_kv_cache_mixin.py:906,
                    0.5.23: mem_cache/kv_cache_configurator.py:499), logged once its KV cache
                    ("KV Cache is allocated", mem_cache/memory_pool.py) and, for a hybrid model,
                    its mamba state ("Mamba Cache is allocated", memory_pool.py:311/984) exist
  graphs            the last "Capture ... graph end." before ready: the target's decode or verify
                    graph (0.5.10 "Capture cuda graph end. Time elapsed: ..." model_runner.py:2460;
                    0.5.23 "Capture target verify CUDA graph end. bs=..." cuda_graph_setup.py:788),
                    then the draft worker's load, pool and its graphs ("Capture draft cuda graph
                    end", eagle_worker.py:257 in 0.5.10; "Capture draft extend CUDA graph end",
                    eagle_worker_v2.py:654 in 0.5.23)
  ready             "The server is fired up and ready to roll!" (entrypoints/http_server.py,
                    0.5.10:1929, 0.5.23:2600), after SGLang's own warm-up generation
  first_generation  the first "Prefill batch, ..." the scheduler logs after ready
                    (scheduler_metrics_mixin.py:389 in 0.5.10, metrics_reporter.py:754 in 0.5.23)

Each line is read by the capacity report's reader (capacity.Reader): the marks are those of the
rank the capacity report shows (TP0), never the draft worker's.

    timing = parse(entries(json_lines))     # json_lines: journalctl -o json output
    describe(timing)   # 'ready in 31.2 s: start→weights 4.6 s, →KV+mamba 1.1 s, ...'
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from . import capacity

MARKS = ("start", "weights", "kv", "graphs", "ready", "first_generation")
UNIT_STARTED = "39f53479d3a045ac8e11786248231fbf"  # systemd's SD_MESSAGE_UNIT_STARTED
CAPTURE_END = re.compile(r"Capture .*graph end\.", re.IGNORECASE)
READY = "The server is fired up and ready to roll!"


@dataclass(frozen=True)
class Entry:
    """One journal entry: its time (seconds since the epoch), its text, and whether it is
    systemd's message that the unit started."""

    t: float
    message: str
    started: bool = False


@dataclass
class Timing:
    marks: dict[str, float] = field(default_factory=dict)  # mark -> journal time
    mamba: bool = False  # a hybrid model: its mamba state was allocated

    def label(self, mark: str) -> str:
        names = {"kv": "KV+mamba" if self.mamba else "KV", "first_generation": "first generation"}
        return names.get(mark, mark)

    def parts(self) -> list[tuple[str, str | None, float | None]]:
        """(mark, the mark it is measured from, seconds); seconds None when not logged.

            Timing({"start": 0.0, "weights": 4.6}).parts()[0]   # ('weights', 'start', 4.6)
        """
        out: list[tuple[str, str | None, float | None]] = []
        last: str | None = "start" if "start" in self.marks else None
        for mark in MARKS[1:]:
            if mark not in self.marks:
                out.append((mark, None, None))
                continue
            seconds = self.marks[mark] - self.marks[last] if last else None
            out.append((mark, last, None if seconds is None else round(seconds, 3)))
            last = mark
        return out

    @property
    def seconds(self) -> float | None:
        """Process start to ready (None when either is not logged)."""
        if "start" in self.marks and "ready" in self.marks:
            return round(self.marks["ready"] - self.marks["start"], 3)
        return None


def _text(value: Any) -> str:
    """journalctl -o json gives MESSAGE as a string, or as a list of bytes when it is not
    valid UTF-8 or holds control characters."""
    if isinstance(value, list):
        return bytes(b for b in value if isinstance(b, int) and 0 <= b < 256).decode(
            errors="replace")
    return value if isinstance(value, str) else ""


def entries(lines: Iterable[str]) -> list[Entry]:
    """The entries of ``journalctl -o json`` output, one JSON object a line; other lines
    (a journalctl warning, a cut line) are skipped.

        entries(['{"__REALTIME_TIMESTAMP": "1764553482123456", "MESSAGE": "hi"}'])
        # [Entry(t=1764553482.123456, message='hi', started=False)]
    """
    out = []
    for line in lines:
        try:
            obj = json.loads(line)
            t = int(obj["__REALTIME_TIMESTAMP"]) / 1e6
        except (ValueError, KeyError, TypeError):
            continue
        if not isinstance(obj, dict):
            continue
        started = obj.get("MESSAGE_ID") == UNIT_STARTED or (
            obj.get("JOB_TYPE") == "start" and obj.get("JOB_RESULT") == "done")
        out.append(Entry(t, _text(obj.get("MESSAGE")), started))
    return sorted(out, key=lambda e: e.t)


def _startup_events(log: list[Entry]) -> list[capacity.Event | None]:
    """Each entry's startup event as the capacity report reads it, kept only for the rank whose
    figures the report shows, so that each mark is one rank's, never the earliest of eight."""
    reader = capacity.Reader()
    events = [reader.line(e.message) for e in log]
    shown = reader.result().rank
    return [ev if ev is not None and ev.rank == shown else None for ev in events]


def parse(log: list[Entry]) -> Timing:
    """The marks found in one invocation's entries (see the module's docstring)."""
    timing = Timing()
    marks = timing.marks
    kv_line: float | None = None
    for e, ev in zip(log, _startup_events(log), strict=True):
        text, kind = e.message, ev.kind if ev else None
        if e.started:
            marks.setdefault("start", e.t)
        elif "ready" in marks:
            if "Prefill batch" in text:
                marks.setdefault("first_generation", e.t)
        elif READY in text:
            marks["ready"] = e.t
        elif kind == "load" and ev is not None and ev.role == "target":
            marks.setdefault("weights", e.t)
        elif kind in ("kv", "mamba") and "graphs" not in marks:
            timing.mamba = timing.mamba or kind == "mamba"
            if "kv" not in marks:
                kv_line = e.t
        elif kind == "pool" and ev is not None and ev.role == "target":
            marks.setdefault("kv", e.t)
        elif CAPTURE_END.search(text):
            marks["graphs"] = e.t
    if "kv" not in marks and kv_line is not None:
        marks["kv"] = kv_line  # a release without "Memory pool end": its last pool line
    return timing


def describe(timing: Timing) -> str:
    """One line for the gate's output.

        describe(t)  # 'ready in 31.2 s: start→weights 4.6 s, →KV+mamba 1.1 s, →graphs 12.0 s,
                     #  →ready 2.1 s, →first generation 0.4 s'
    """
    shown = []
    for mark, since, seconds in timing.parts():
        name = timing.label(mark)
        if mark not in timing.marks:
            shown.append(f"{name} not logged")
        elif since is None or seconds is None:
            shown.append(f"→{name} (no start to measure from)")
        elif since == "start":
            shown.append(f"start→{name} {seconds:.1f} s")
        elif MARKS.index(since) == MARKS.index(mark) - 1:
            shown.append(f"→{name} {seconds:.1f} s")
        else:
            shown.append(f"{timing.label(since)}→{name} {seconds:.1f} s")
    total = timing.seconds
    head = f"ready in {total:.1f} s" if total is not None else (
        "ready, start not logged" if "ready" in timing.marks else "time to ready not logged")
    return f"{head}: {', '.join(shown)}"


def as_json(timing: Timing) -> dict[str, Any]:
    """For the gate's JSON: seconds to ready and each part (null: not logged).

        {"seconds": 31.2, "mamba": true, "parts": [{"part": "weights", "from": "start",
         "seconds": 4.6}, ...]}
    """
    return {"seconds": timing.seconds, "mamba": timing.mamba,
            "parts": [{"part": mark, "from": since, "seconds": seconds}
                      for mark, since, seconds in timing.parts()]}
