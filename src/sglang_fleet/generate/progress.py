"""What a job shows while it runs and at its end: a progress bar (tqdm, on a terminal) with
completions/s, output tokens/s, the reasoning/answer split and the ETA; ``--json`` status lines
for logs; and a final table.

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
                "eta_s": None if eta is None else round(eta, 1)}


def _clock(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    s = int(seconds)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


class Display:
    """The bar (if stderr is a terminal and --json is off) and the --json status lines."""

    def __init__(self, stats: Stats, json_lines: bool, out: TextIO | None = None) -> None:
        self.stats = stats
        self.json_lines = json_lines
        self.out = out or sys.stdout
        self.bar: tqdm[Any] | None = None
        if not json_lines and sys.stderr.isatty():
            self.bar = tqdm(total=stats.total_bytes, unit="B", unit_scale=True,
                            bar_format="{percentage:3.0f}%|{bar}| {desc}", dynamic_ncols=True)

    def event(self, kind: str, **fields: Any) -> None:
        """A one-off line: JSON with --json, else text (through the bar if there is one)."""
        if self.json_lines:
            print(json.dumps({"event": kind, **fields}), file=self.out, flush=True)
            return
        text = f"{kind}: " + ", ".join(f"{k} {v}" for k, v in fields.items())
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
        status = s.status()
        total = s.reasoning_tokens + s.answer_tokens
        split = f"{100 * s.reasoning_tokens / total:.0f}/{100 * s.answer_tokens / total:.0f}" \
            if total else "-"
        self.bar.n = s.bytes_done + s.bytes_skipped
        self.bar.set_description_str(
            f"{s.done + s.skipped} done, {s.failed} failed, "
            f"{status['completions_per_s']:.0f} compl/s, "
            f"{status['output_tokens_per_s']:.0f} tok/s, reasoning/answer {split}%, "
            f"conc {s.concurrency}, ETA {_clock(status['eta_s'])}")

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
            ("failures file", summary.get("failures_file") or "-")]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)
