"""``sglang-fleet status``'s table fits the terminal: no line longer than the width at 40, 80,
120 and 200 columns, the essential columns kept (cut with … only when even they do not fit),
the rest folded under a row, values every row shares said once."""

from __future__ import annotations

import doctest

import pytest

from sglang_fleet.report import layout, status, status_view

WIDTHS = (40, 80, 120, 200)
LONG = ("Scheduler hit an exception: torch.OutOfMemoryError: CUDA out of memory. Tried to "
        "allocate 2.00 GiB (GPU 0; 179.06 GiB total capacity)")


def fleet_rows() -> list[status.Row]:
    """Two hosts of two servers (one of them crashed), one unreachable host and a router:
    rows over 200 characters wide as one line each."""
    rows = []
    for host in ("b200-01", "b200-02"):
        for i in range(2):
            rows.append(status.Row(
                "server", host, f"http://{host}:3000{i}", unit=f"sglang-{i}.service",
                state="active/running", since="Mon 2026-11-30 23:01:02 UTC",
                release="sglang-0.5.23-3f2a9c1d", model="qwen3.6-27b", algorithm="NEXTN",
                health="ok", running=12, queued=0, tokens_per_s=1834.5, accept_length=2.81,
                gpus=f"{i * 4}-{i * 4 + 3}", gpu_used_mib=600000, gpu_free_mib=130000,
                router="healthy", restarts=0, capacity=48, measured_tokens_per_s=6000.0))
    rows[1].state, rows[1].health, rows[1].restarts = "failed (start-limit-hit)", "HTTP 503", 5
    rows[1].last_crash = LONG
    rows[1].gpu_health = ["FATAL xid-79 (GPU 4)"]
    rows.append(status.Row("server", "b200-03", "http://b200-03:30000", unit="sglang.service",
                           model="qwen3.6-27b", algorithm="NEXTN", state="unreachable",
                           health="unreachable (ConnectError)",
                           error="unreachable: SSH: Could not connect to 10.0.0.13:22 "
                                 "(Connection refused)"))
    rows.append(status.Row("router", "router-01", "http://10.0.0.9:30080", health="ok",
                           router="4/5"))
    return rows


def test_the_old_table_was_wider_than_any_terminal() -> None:
    rows = [[c or "-" for c in status_view.cells(r)] for r in fleet_rows()]
    widths = [max(len(x) for x in col) for col in zip(status_view.COLUMNS, *rows, strict=True)]
    assert sum(widths) + 2 * (len(widths) - 1) > 200  # one line per row: what it was


@pytest.mark.parametrize("width", WIDTHS)
def test_no_line_is_wider_than_the_terminal(width: int) -> None:
    text = status_view.table(fleet_rows(), width=width)
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= width, "\n" + text
    head = lines[0].split()
    assert head[0] == "host" and "state" in head and "health" in head  # the essential ones
    # every host on a line of its own, with its state, and what did not fit folded under it
    starts = [line.split()[0] for line in lines[1:] if not line.startswith(" ")]
    assert starts[:6] == ["b200-01", "b200-01", "b200-02", "b200-02", "b200-03", "router-01"]
    words = " ".join(text.split())
    assert "unreachable: SSH: Could not connect to 10.0.0.13:22 (Connection refused)" in words
    assert "last crash: Scheduler hit an exception" in words  # folded, wrapped, not cut
    # only where host, state and health do not fit whole (40: 9 + 24 + 26 and the gaps)
    rows = [line for line in lines if not line.startswith(" ")]
    assert any("…" in line for line in rows) == (width == 40)
    assert "…" not in "\n".join(line for line in lines if line.startswith(" "))


def test_shared_values_are_said_once_after_the_table() -> None:
    text = status_view.table(fleet_rows(), width=80)
    assert text.count("qwen3.6-27b") == 1 and text.count("NEXTN") == 1
    assert "every server: model qwen3.6-27b" in text.splitlines()
    assert "every server: algo NEXTN" in text.splitlines()
    # b200-03's release is not known ("-"): each row says its own
    assert text.count("sglang-0.5.23-3f2a9c1d") == 4


def test_wide_enough_the_table_is_one_line_per_row() -> None:
    lines = status_view.table(fleet_rows(), width=1000).splitlines()
    body = [line for line in lines[1:] if line and not line.startswith("every server:")]
    assert all(not line.startswith(" ") for line in body[:1])
    assert "notes" in lines[0].split()  # every column fits


def test_only_essential_cells_that_do_not_fit_are_cut() -> None:
    host = "a-b200-host-with-a-name-longer-than-any-terminal-column"
    text = layout.fit(["host", "state", "notes"], [[host, "active/running", "fine"]],
                      essential=["host", "state"], width=40)
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 40
    assert lines[1].startswith("a-b200-host-with-a-name") and "…" in lines[1]
    assert lines[2] == "    notes fine"


def test_the_width_is_the_terminals_columns_at_least_40(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "132")
    assert layout.terminal_width() == 132
    monkeypatch.setenv("COLUMNS", "12")
    assert layout.terminal_width() == 40
    monkeypatch.setenv("COLUMNS", "60")
    text = status_view.table(fleet_rows())
    assert max(len(line) for line in text.splitlines()) <= 60


def test_the_docstring_example_is_what_it_prints() -> None:
    failed, tried = doctest.testmod(layout)
    assert tried >= 2 and failed == 0
