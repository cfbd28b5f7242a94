"""The generate progress bar as tqdm draws it (into a StringIO at a fixed width): it fits the
terminal, keeps the ETA, completions/s and tokens/s, says PAUSED while the fleet is out; the
--json status and the final table carry the time paused."""

from __future__ import annotations

import io
import re
import time

import pytest

from sglang_fleet_generate.progress import Display, Stats, compact, final_table, new_bar


def busy_stats() -> Stats:
    """A big job two minutes in: seven-figure counts, five-figure rates."""
    stats = Stats(total_bytes=4 * 10**9, started=time.monotonic() - 120)
    stats.done, stats.skipped, stats.failed = 1_234_567, 250_000, 12_345
    stats.reasoning_tokens, stats.answer_tokens = 90_000_000, 30_000_000
    stats.bytes_done, stats.bytes_skipped = 10**9, 2 * 10**8
    stats.concurrency = 1024
    return stats


def drawn(stats: Stats, width: int) -> list[str]:
    """The lines tqdm wrote for one tick (the bar redrawn after each carriage return)."""
    out = io.StringIO()
    display = Display(stats, False, bar=new_bar(stats.total_bytes, file=out, ncols=width))
    out.seek(0)
    out.truncate()
    display.tick()
    return [line for line in re.split(r"[\r\n]", out.getvalue()) if line.strip()]


@pytest.mark.parametrize("width", [60, 80, 200])
def test_the_bar_fits_the_width_with_eta_and_rates(width: int) -> None:
    lines = drawn(busy_stats(), width)
    assert lines, "tqdm drew nothing"
    for line in lines:
        assert len(line) <= width, (len(line), line)
        assert re.search(r"ETA \d+:\d\d:\d\d", line), line  # whole, never cut
        assert "10.3k/s" in line, line  # 1.23M completed in this run's 120 s
        assert "1.00M tok/s" in line, line
    bar = re.search(r"\|([^|]*)\|", lines[-1])
    assert bar is not None and len(bar.group(1)) >= 10, lines[-1]
    if width >= 80:
        assert "1.48M done, 12.3k failed" in lines[-1], lines[-1]
    if width >= 200:
        assert "reasoning/answer 75/25%" in lines[-1] and "concurrency 1024" in lines[-1]


@pytest.mark.parametrize("width", [60, 80, 200])
def test_the_bar_says_paused_within_the_width(width: int) -> None:
    stats = busy_stats()
    stats.pause_cause = "connection refused"
    stats.paused_since = time.monotonic() - 12.4
    stats.paused_s = 30.0
    line = drawn(stats, width)[-1]
    assert len(line) <= width, (len(line), line)
    assert "ETA ?" in line and "/s" in line and "tok/s" in line, line
    assert ("PAUSED" if width < 80 else "PAUSED 12s: connection refused") in line, line
    stats.pause_cause = "upstream said \x1b[2J" + "x" * 300  # long, with a terminal escape
    line = drawn(stats, width)[-1]
    assert len(line) <= width and "\x1b" not in line and "PAUSED" in line, line
    status = stats.status()
    assert status["paused"] is True and status["pause_cause"].startswith("upstream said")
    assert 42 <= status["paused_s"] < 50  # 30 s of earlier pauses and this one's 12 s
    table = final_table(stats, {"output": "out", "failures": 0})
    assert re.search(r"^time paused +0:00:4\d$", table, re.M), table


def test_status_without_a_pause() -> None:
    status = busy_stats().status()
    assert (status["paused"], status["pause_cause"], status["paused_s"]) == (False, None, 0.0)
    assert "time paused" in final_table(busy_stats(), {"output": "out", "failures": 0})


def test_compact_numbers() -> None:
    assert [compact(x) for x in (7, 0.42, 850.4, 999.5, 12_345, 1_234_567, 3e9)] == \
        ["7", "0.42", "850", "1.00k", "12.3k", "1.23M", "3.00G"]


def test_an_event_shows_the_servers_text_with_its_escapes(
        capsys: pytest.CaptureFixture[str]) -> None:
    """A pause's cause and a fingerprint quote the server: an escape in them would rewrite the
    terminal's line; they are shown as codes (remote/terminal.py)."""
    from sglang_fleet_generate import fingerprint

    display = Display(busy_stats(), False)
    display.event("paused", cause="HTTP 503: \x1b[2K\roverloaded\x07")
    fields = {"model_path": "/m\x1b]0;owned\x07", "version": "0.5.23\x9b2K"}
    display.event("fingerprint", answered_by=fingerprint.describe(fields))
    assert capsys.readouterr().err.splitlines() == [
        "paused: cause HTTP 503: \\x1b[2K\\x0doverloaded\\x07",
        "fingerprint: answered_by m\\x1b]0;owned\\x07 (/m\\x1b]0;owned\\x07), SGLang "
        "0.5.23\\x9b2K, no speculative decoding"]
    assert "\x1b" not in fingerprint.describe(fields)
