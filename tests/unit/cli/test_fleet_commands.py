"""``status`` and ``roll`` say the fleet's health in their exit status: status exits 0 for a
healthy fleet and 1 when a host is unreachable or a server does not serve (with --json too),
and fits the terminal; roll --json names an unreachable host's SSH error as its cause."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest

from sglang_fleet import cli
from sglang_fleet.report import status
from tests.unit.report.test_status import serving_row

INVENTORY = "inventories/b200.py"
ERROR = "unreachable: SSH: Could not connect to 10.0.0.12:22 (Connection refused)"


def fake_fleet(monkeypatch: pytest.MonkeyPatch, rows: list[status.Row]) -> list[Any]:
    """status reads this fleet instead of connecting to the inventory's hosts; what it was
    asked to read, in the list returned."""
    asked: list[Any] = []

    def collect(inventory: str, data: dict[str, Any] | None = None) -> status.Fleet:
        asked.append((inventory, data))
        return status.Fleet(rows)

    monkeypatch.setattr(status, "collect", collect)
    return asked


def healthy() -> list[status.Row]:
    return [serving_row("b200-01"), serving_row("b200-02")]


def unreachable() -> list[status.Row]:
    return [serving_row("b200-01"), serving_row("b200-02", state="unreachable", error=ERROR)]


def test_a_healthy_fleet_exits_0(monkeypatch: pytest.MonkeyPatch,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    fake_fleet(monkeypatch, healthy())
    assert cli.main(["status", INVENTORY]) == 0
    said = " ".join(capsys.readouterr().out.split())  # wrapped to the terminal
    assert said.endswith("healthy: 2 hosts answered over SSH; 2 servers active/running, "
                         "/health 200, no fatal GPU finding")
    assert cli.main(["status", INVENTORY, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[-1]["healthy"] is True


def test_data_reads_the_fleet_as_the_deploy_was_given_it(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    asked = fake_fleet(monkeypatch, healthy())
    assert cli.main(["status", INVENTORY, "--data", "sglang.server.router_connection=grpc",
                     "--data", "sglang.parallel.instances=4"]) == 0
    assert asked == [(INVENTORY, {"sglang.server.router_connection": "grpc",
                                  "sglang.parallel.instances": 4})]
    assert cli.main(["status", INVENTORY, "--data", "no-equals-sign"]) != 0
    assert "not key=value" in capsys.readouterr().err


@pytest.mark.parametrize("width", [40, 80, 120, 200])
def test_an_unreachable_host_is_named_and_exits_1(
        width: int, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("COLUMNS", str(width))
    fake_fleet(monkeypatch, unreachable())
    assert cli.main(["status", INVENTORY]) == 1
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) <= width
    assert f"unhealthy: b200-02: {ERROR}" in " ".join(out.split())
    assert "healthy:" not in out.replace("unhealthy:", "")


def test_under_json_an_unreachable_host_is_listed_and_exits_1(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    fake_fleet(monkeypatch, unreachable())
    assert cli.main(["status", INVENTORY, "--json"]) == 1
    rows = json.loads(capsys.readouterr().out)
    assert [r["kind"] for r in rows] == ["server", "server", "fleet"]  # the shape it had
    assert rows[-1]["healthy"] is False
    assert rows[-1]["unreachable"] == [{"host": "b200-02", "error": ERROR}]


def test_a_server_not_serving_exits_1(monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    fake_fleet(monkeypatch, [serving_row("b200-01", state="failed (start-limit-hit)")])
    assert cli.main(["status", INVENTORY]) == 1
    assert "unhealthy: b200-01 sglang.service: failed (start-limit-hit)" in \
        capsys.readouterr().out


def test_roll_json_names_an_unreachable_host_as_the_cause(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from sglang_fleet.cli.fleet_commands import roll_as_json
    from sglang_fleet.fleet import cutover
    from sglang_fleet.fleet import inventory as fleet
    from tests.unit.roll.test_roll import SSH_ERROR, URLS, FakeRouter, Runs, make

    router = FakeRouter({u[0]: True for u in URLS.values()})
    monkeypatch.setattr(fleet, "routers", lambda inventory: [SimpleNamespace(api=lambda: router)])
    monkeypatch.setattr(cutover, "drained", lambda url, timeout: (True, 0))

    def reach(hosts: list[Any]) -> dict[str, str]:
        return {"h2": SSH_ERROR}

    ok, document = roll_as_json(make(router, Runs(), reach=reach, names=("h1", "h2")))
    assert not ok and router.log == []
    assert "host 2 of 2 h2: SSH to h2" in capsys.readouterr().err
    assert [(h["host"], h["result"], h["cause"]) for h in document["hosts"]] == [
        ("h1", "not touched: the roll stopped before it", ""),
        ("h2", "not touched: unreachable", SSH_ERROR)]
    assert document["cause"] == f"host 2 of 2 h2: {SSH_ERROR}"


def test_help_says_the_exit_status(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["status", "--help"]) == 0
    shown = capsys.readouterr().out
    assert "exit status:\n  0  every host answered" in shown
    assert "  1  unhealthy: a host unreachable over SSH" in shown
    assert "  2  a usage error" in shown
