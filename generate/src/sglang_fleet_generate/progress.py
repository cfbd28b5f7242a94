"""What a job shows while it runs and at its end: a progress bar (tqdm, on a terminal) with
the ETA, completions/s and output tokens/s (and, as the terminal's width allows, the counts,
the reasoning/answer split and the concurrency; ``PAUSED`` while the fleet is out); ``--json``
status lines for logs; and a final table.

    stats = Stats(total_bytes=10_000)
    stats.add(record, line_bytes=120)
    print(stats.status())
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field
from typing import Any, TextIO

from tqdm import tqdm
from tqdm.utils import disp_len, disp_trim

from sglang_fleet_generate.text import printable


def token_split(usage: Any) -> tuple[int, int]:
    """(reasoning, answer) output tokens of one answer's usage.

    Example: token_split({"completion_tokens": 10, "reasoning_tokens": 7}) == (7, 3)
    """
    if not isinstance(usage, dict):
        return 0, 0
    out = usage.get("completion_tokens") or 0
    details = usage.get("completion_tokens_details") or {}
    reasoning = usage.get("reasoning_tokens") or details.get("reasoning_tokens") or 0
    return int(reasoning), int(out) - int(reasoning)


@dataclass
class Stats:
    """Counters for this run; ``skipped`` counts records finished by an earlier run."""

    total_bytes: int | None = None
    done: int = 0
    failed: int = 0
    skipped: int = 0
    earlier_failed: int = 0
    reasoning_tokens: int = 0
    answer_tokens: int = 0
    bytes_done: int = 0
    bytes_skipped: int = 0
    retries: int = 0
    shards_written: int = 0
    shards_skipped: int = 0
    concurrency: int = 0
    # The fleet is out (every request refused, 503, no healthy worker): why, and since when
    # (monotonic); the run's seconds paused so far. Set by the job's outage breaker.
    pause_cause: str | None = None
    paused_since: float | None = None
    paused_s: float = 0.0
    started: float = field(default_factory=time.monotonic)

    def add(self, usage: Any, line_bytes: int, tries: int, ok: bool) -> None:
        if ok:
            self.done += 1
            reasoning, answer = token_split(usage)
            self.reasoning_tokens += reasoning
            self.answer_tokens += answer
        else:
            self.failed += 1
        self.retries += tries - 1
        self.bytes_done += line_bytes

    def elapsed(self) -> float:
        return max(time.monotonic() - self.started, 1e-9)

    def paused_total(self) -> float:
        """Seconds paused in this run, the pause going on included."""
        ongoing = 0.0 if self.paused_since is None else time.monotonic() - self.paused_since
        return self.paused_s + max(ongoing, 0.0)

    def eta(self) -> float | None:
        """Seconds left, from the input bytes still to do at this run's byte rate."""
        if self.total_bytes is None or not self.bytes_done:
            return None
        left = self.total_bytes - self.bytes_done - self.bytes_skipped
        return max(left, 0) / (self.bytes_done / self.elapsed())

    def status(self) -> dict[str, Any]:
        """One status line's content (also the final ``--json`` line's)."""
        t = self.elapsed()
        eta = self.eta()
        out_tokens = self.reasoning_tokens + self.answer_tokens
        return {"done": self.done, "failed": self.failed, "skipped": self.skipped,
                "completions_per_s": round(self.done / t, 1),
                "output_tokens_per_s": round(out_tokens / t, 1),
                "reasoning_tokens": self.reasoning_tokens, "answer_tokens": self.answer_tokens,
                "retries": self.retries, "concurrency": self.concurrency,
                "shards_written": self.shards_written, "elapsed_s": round(t, 1),
                "eta_s": None if eta is None else round(eta, 1),
                "paused": self.pause_cause is not None, "pause_cause": self.pause_cause,
                "paused_s": round(self.paused_total(), 1)}


def _clock(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    s = int(seconds)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def compact(x: float) -> str:
    """Three digits and a k/M/G/T suffix, whole numbers under 1000 as they are.

    Example: compact(7) == "7"; compact(0.42) == "0.42"; compact(850.4) == "850";
    compact(12_345) == "12.3k"; compact(1_234_567) == "1.23M"
    """
    suffixes = ["", "k", "M", "G", "T"]
    while abs(x) >= 999.5 and len(suffixes) > 1:
        x /= 1000
        suffixes.pop(0)
    if not suffixes[0] and x == int(x):
        return str(int(x))
    digits = 0 if abs(x) >= 99.95 else 1 if abs(x) >= 9.995 else 2
    return f"{x:.{digits}f}{suffixes[0]}"


def _short_time(seconds: float) -> str:
    """Example: _short_time(7) == "7s"; _short_time(185) == "3m05s";
    _short_time(3720) == "1h02m"."""
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


BAR_FORMAT = "{percentage:3.0f}%|{bar}| {desc}"
BAR_FIXED = len("100%|| ")  # the bar format's own characters around the bar and the text
MIN_BAR = 10


def bar_text(stats: Stats, width: int) -> str:
    """The text beside the bar, at most ``width - BAR_FIXED - MIN_BAR`` characters: the ETA
    first (``?`` while paused), completions/s and tokens/s always; then, while they fit, the
    pause and its cause, the counts, the reasoning/answer split and the concurrency.

    Example (80 columns): "ETA 0:12:34, 41.2k done, 3 failed, 850/s, 12.3k tok/s"
    """
    room = width - BAR_FIXED - MIN_BAR
    status = stats.status()
    paused = stats.pause_cause is not None  # no estimate while nothing moves
    required = [(0, f"ETA {'?' if paused else _clock(status['eta_s'])}"),
                (4, f"{compact(status['completions_per_s'])}/s"),
                (5, f"{compact(status['output_tokens_per_s'])} tok/s")]
    total = stats.reasoning_tokens + stats.answer_tokens
    optional = [(2, f"{compact(stats.done + stats.skipped)} done"),
                (3, f"{compact(stats.failed)} failed")]
    if total:
        optional.append((6, f"reasoning/answer {100 * stats.reasoning_tokens / total:.0f}/"
                            f"{100 * stats.answer_tokens / total:.0f}%"))
    optional.append((7, f"concurrency {stats.concurrency}"))
    chosen = list(required)
    used = sum(len(text) + 2 for _, text in chosen) - 2
    if paused:
        pause = _pause_text(stats, room - used - 2)
        if pause:
            chosen.append((1, pause))
            used += disp_len(pause) + 2
    for place, text in optional:
        if used + 2 + len(text) <= room:
            chosen.append((place, text))
            used += len(text) + 2
    return ", ".join(text for _, text in sorted(chosen))


def _pause_text(stats: Stats, room: int) -> str:
    """``PAUSED 12s: connection refused``, the cause cut to ``room`` (nothing if even
    ``PAUSED`` does not fit)."""
    head = "PAUSED"
    if stats.paused_since is not None:
        head += f" {_short_time(time.monotonic() - stats.paused_since)}"
    # one line of printable text, whatever the server said (no escape reaches the terminal)
    cause = "".join(c if c.isprintable() else " " for c in stats.pause_cause or "")
    cause = " ".join(cause.split())
    text = f"{head}: {cause}" if cause else head
    if disp_len(text) <= room:  # a terminal's columns: a CJK character takes two
        return text
    if room >= len(head) + 3:
        return disp_trim(text, room - 1) + "\u2026"
    for short in (head, "PAUSED"):
        if room >= len(short):
            return short
    return ""


def new_bar(total: int | None, file: TextIO | None = None,
            ncols: int | None = None) -> tqdm[Any]:
    """The bar on stderr, as wide as the terminal (``ncols`` fixed: a test's width)."""
    return tqdm(total=total, unit="B", unit_scale=True, bar_format=BAR_FORMAT,
                file=file or sys.stderr, ncols=ncols, dynamic_ncols=ncols is None)


class Display:
    """The bar (if stderr is a terminal and --json is off, or the ``bar`` given) and the
    --json status lines."""

    def __init__(self, stats: Stats, json_lines: bool, out: TextIO | None = None,
                 bar: tqdm[Any] | None = None) -> None:
        self.stats = stats
        self.json_lines = json_lines
        self.out = out or sys.stdout
        self.bar = bar
        if bar is None and not json_lines and sys.stderr.isatty():
            self.bar = new_bar(stats.total_bytes)

    def event(self, kind: str, **fields: Any) -> None:
        """A one-off line: JSON with --json, else text (through the bar if there is one)."""
        if self.json_lines:
            print(json.dumps({"event": kind, **fields}), file=self.out, flush=True)
            return
        # a cause or a fingerprint quotes the server: shown safe (``terminal``)
        text = printable(f"{kind}: " + ", ".join(f"{k} {v}" for k, v in fields.items()))
        if self.bar is not None:
            self.bar.write(text, file=sys.stderr)
        else:
            print(text, file=sys.stderr, flush=True)

    def tick(self) -> None:
        s = self.stats
        if self.json_lines:
            self.event("progress", **s.status())
        if self.bar is None:
            return
        self.bar.n = s.bytes_done + s.bytes_skipped
        width = self.bar.format_dict.get("ncols") or 80  # unknown: a terminal's usual width
        self.bar.set_description_str(bar_text(s, width))

    def close(self) -> None:
        if self.bar is not None:
            self.tick()
            self.bar.close()


def final_table(stats: Stats, summary: dict[str, Any]) -> str:
    """The table printed at the end of a job (text mode)."""
    s = stats.status()
    rows = [("output", summary["output"]),
            ("records written (this run)", f"{stats.done:,}"),
            ("records from earlier runs", f"{stats.skipped:,}"),
            ("failed (this run / earlier)", f"{stats.failed:,} / {stats.earlier_failed:,}"),
            ("shards written / skipped", f"{stats.shards_written} / {stats.shards_skipped}"),
            ("completions/s", f"{s['completions_per_s']:,.1f}"),
            ("output tokens/s", f"{s['output_tokens_per_s']:,.1f}"),
            ("reasoning / answer tokens", f"{stats.reasoning_tokens:,} / "
                                          f"{stats.answer_tokens:,}"),
            ("retries", f"{stats.retries:,}"),
            ("elapsed", _clock(s["elapsed_s"])),
            ("time paused", _clock(s["paused_s"])),
            ("failures file", summary.get("failures_file") or "-")]
    width = max(len(k) for k, _ in rows)
    return "\n".join([*(f"{k:<{width}}  {v}" for k, v in rows), "", *next_steps(summary)])


def next_steps(summary: dict[str, Any]) -> list[str]:
    """What to run next, below the table: the failed lines' retry, the one view of results."""
    lines = []
    failed = int(summary.get("failures") or 0)
    if failed:
        lines.append(f"{failed:,} line{'s' if failed > 1 else ''} failed (listed in "
                     f"{summary.get('failures_file')})"
                     + ("; to send them again:" if summary.get("retry_command") else ""))
        if summary.get("retry_command"):
            lines.append(f"  {summary['retry_command']}")
    if summary.get("results_command"):
        lines.append(f"every record in one view: {summary['results_command']}")
    return lines
