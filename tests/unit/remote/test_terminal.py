"""A host's text on the operator's terminal (remote/terminal.py): its control characters shown
as codes wherever the gate prints it, so a server's log line cannot rewrite the screen (a
forged crash cause) or set the terminal's title."""

from __future__ import annotations

import sys

import pytest

from sglang_fleet.remote.terminal import printable
from sglang_fleet.stages.gate.host import check_server, gate_unit, member_start
from sglang_fleet.stages.gate.host.gate_http import GateError

# A server's line that erases the line above and writes its own cause over it, then sets the
# window title (ESC, CSI as one byte, BEL, carriage return, backspace, DEL)
FORGED = ("\x1b[1A\x1b[2K\r[2026-12-01 10:33:21 TP0] Scheduler hit an exception: "
          "RuntimeError: forged\x9b2K\x1b]0;owned\x07\b\x7f")
SHOWN = ("\\x1b[1A\\x1b[2K\\x0d[2026-12-01 10:33:21 TP0] Scheduler hit an exception: "
         "RuntimeError: forged\\x9b2K\\x1b]0;owned\\x07\\x08\\x7f")
CONTROLS = [chr(c) for c in (*range(0x20), *range(0x7F, 0xA0)) if chr(c) not in "\t\n"]


def test_every_control_character_is_shown_as_its_code() -> None:
    assert printable(FORGED) == SHOWN
    assert printable("".join(CONTROLS)) == "".join(f"\\x{ord(c):02x}" for c in CONTROLS)
    assert printable("tab\there, é … 漢字") == "tab\there, é … 漢字"
    assert printable("one\ntwo") == "one\\x0atwo"
    assert printable("one\ntwo\x1b", lines=True) == "one\ntwo\\x1b"


def raw_controls(text: str) -> list[str]:
    return [c for c in text if c in CONTROLS]


def test_member_start_shows_a_forged_crash_cause_with_its_escapes(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    now = {"ActiveState": "active", "SubState": "running", "InvocationID": "inv1",
           "MainPID": "4242", "ExecMainStartTimestamp": "Wed 2026-07-01 10:00:00 UTC"}
    monkeypatch.setattr(member_start, "unit_state", lambda unit: now)
    monkeypatch.setattr(member_start, "journal", lambda invocation: ["Init parallel begin.",
                                                                     FORGED])
    assert member_start.main(["--unit", "sglang.service", "--budget", "0"]) == 1
    out = capsys.readouterr().out
    assert raw_controls(out) == []
    assert "an exception before its start line: Scheduler hit an exception: RuntimeError: " \
           "forged\\x9b2K\\x1b]0;owned\\x07\\x08\\x7f" in out.splitlines()[0]


def test_the_gate_shows_the_journal_and_its_error_with_their_escapes(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    def down(args: object, result: object) -> None:
        raise GateError(f"sglang.service failed to start: {FORGED}", ["invocation inv1:", FORGED])

    monkeypatch.setattr(check_server, "run", down)
    monkeypatch.setattr(sys, "argv", ["check_server", "--unit", "sglang.service", "--url",
                                      "http://127.0.0.1:1", "--env-file", "/e", "--model", "m"])
    assert check_server.main() == 1
    out = capsys.readouterr().out
    assert raw_controls(out) == []
    assert f"journal: {SHOWN}" in out.splitlines()
    assert f"error: sglang.service failed to start: {SHOWN}" in out.splitlines()
    assert gate_unit.shown(FORGED) == SHOWN
