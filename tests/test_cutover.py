"""A roll's cutover inside the deploy: the host leaves the routers at its first disruptive
command, once, only in a roll (the roll's side is in tests/test_roll.py, the real thing under
load in tests/lab/test_fleet.py)."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from pyinfra.api.command import FunctionCommand

from sglang_fleet import cutover, driver, fleet, gate, service
from sglang_fleet.routerctl import RouterError
from tests.test_operations import Host, commands, driver_host

URL = "http://10.0.0.11:30000"
HOST = SimpleNamespace(name="b200-01", print_prefix="[b200-01] ")


class Router:
    def __init__(self, url: str, registered: list[str], broken: bool = False) -> None:
        self.url, self.registered, self.broken = url, list(registered), broken

    def remove(self, url: str) -> bool:
        if self.broken:
            raise RouterError(f"router {self.url}: DELETE /workers answered 500")
        if url not in self.registered:
            return False
        self.registered.remove(url)
        return True


@pytest.fixture
def handoff(monkeypatch: pytest.MonkeyPatch) -> Iterator[cutover.Handoff]:
    shared = cutover.Handoff.create()
    monkeypatch.setenv(cutover.ENV, str(shared.directory))
    yield shared
    shared.close()


def routers(monkeypatch: pytest.MonkeyPatch, *found: Router) -> None:
    monkeypatch.setattr(fleet, "routers",
                        lambda inventory: [SimpleNamespace(api=lambda r=r: r) for r in found])


def test_outside_a_roll_nothing_leaves(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(cutover.ENV, raising=False)
    assert list(cutover.leave_routers()) == []
    assert cutover._leave(None, HOST)


def test_in_a_roll_the_host_leaves_every_router_once_and_drains(
        handoff: cutover.Handoff, monkeypatch: pytest.MonkeyPatch) -> None:
    [command] = cutover.leave_routers()
    assert isinstance(command, FunctionCommand)
    a, b = Router("http://r1:30080", [URL, "http://other:30000"]), Router("http://r2:30080", [URL])
    routers(monkeypatch, a, b)
    drains: list[str] = []

    def drained(url: str, timeout: float) -> tuple[bool, int]:
        drains.append(f"{url} {timeout:g}")
        return False, 3

    monkeypatch.setattr(cutover, "drained", drained)
    handoff.plan({"b200-01": [URL]}, drain_timeout=600)
    handoff.give("turn", ["b200-01"])
    handoff.give("go", ["b200-01"])
    assert handoff.left("b200-01") is None
    assert cutover._leave(SimpleNamespace(inventory=None), HOST)
    assert a.registered == ["http://other:30000"] and b.registered == []
    assert drains == [f"{URL} 600"]
    left = handoff.left("b200-01")
    assert left is not None and left.at > 0
    assert left.notes == [f"{URL}: 3 requests still in flight after 600 s; its own SIGTERM "
                          "drain finishes them"]
    a.registered.append(URL)  # a second disruptive command in the same run: out already
    assert cutover._leave(SimpleNamespace(inventory=None), HOST)
    assert URL in a.registered and len(drains) == 1


def test_a_host_outside_the_batch_stays(handoff: cutover.Handoff,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    router = Router("http://r1:30080", [URL])
    routers(monkeypatch, router)
    handoff.plan({"b200-02": ["http://10.0.0.12:30000"]}, drain_timeout=600)
    assert cutover._leave(SimpleNamespace(inventory=None), HOST)
    assert router.registered == [URL] and handoff.left("b200-01") is None


def test_a_router_that_refuses_fails_the_command(handoff: cutover.Handoff,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    routers(monkeypatch, Router("http://r1:30080", [URL], broken=True))
    handoff.plan({"b200-01": [URL]}, drain_timeout=600)
    handoff.give("turn", ["b200-01"])
    handoff.give("go", ["b200-01"])
    assert cutover._leave(SimpleNamespace(inventory=None), HOST) is False
    assert handoff.left("b200-01") is not None  # the roll puts it back either way


def test_a_run_waits_for_its_turn_and_stops_if_the_roll_does(
        handoff: cutover.Handoff, monkeypatch: pytest.MonkeyPatch) -> None:
    router = Router("http://r1:30080", [URL])
    routers(monkeypatch, router)
    monkeypatch.setattr(cutover, "POLL", 0.01)
    monkeypatch.setattr(os, "getppid", os.getpid)  # as if the roll started this run
    handoff.plan({"b200-01": [URL]}, drain_timeout=600)
    [command] = cutover.turn._inner()
    assert command.function is cutover._await_turn
    given = threading.Timer(0.2, handoff.give, ("turn", ["b200-01"]))
    given.start()
    tic = time.monotonic()
    assert cutover._await_turn(None, HOST)  # waits until the roll gives it the turn
    assert time.monotonic() - tic >= 0.15
    assert handoff.has("b200-01", "waiting") and handoff.has("b200-01", "took")
    assert router.registered == [URL]  # its turn is not leaving
    # leaving waits for go: the batch before it back in the routers
    threading.Timer(0.2, handoff.give, ("go", ["b200-01"])).start()
    tic = time.monotonic()
    assert cutover._leave(SimpleNamespace(inventory=None), HOST)
    assert time.monotonic() - tic >= 0.15 and router.registered == []


def test_no_turn_when_the_roll_stopped_or_is_gone(handoff: cutover.Handoff,
                                                  monkeypatch: pytest.MonkeyPatch,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    router = Router("http://r1:30080", [URL])
    routers(monkeypatch, router)
    handoff.plan({"b200-01": [URL]}, drain_timeout=600)
    # this test process did not start a run: its parent is not the roll that wrote the plan
    assert cutover._leave(None, HOST) is False
    assert "the roll (pid " in caplog.text and "is gone" in caplog.text
    monkeypatch.setattr(os, "getppid", os.getpid)
    handoff.abort()
    assert cutover._leave(None, HOST) is False
    assert "the roll stopped before this host's turn: nothing that serves was changed" in \
        caplog.text
    assert router.registered == [URL] and handoff.left("b200-01") is None
    assert not handoff.has("b200-01", "took")


def test_a_roll_stopped_between_turn_and_go_leaves_nothing(
        handoff: cutover.Handoff, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    router = Router("http://r1:30080", [URL])
    routers(monkeypatch, router)
    monkeypatch.setattr(os, "getppid", os.getpid)
    handoff.plan({"b200-01": [URL]}, drain_timeout=600)
    handoff.give("turn", ["b200-01"])
    handoff.abort()
    assert cutover._leave(None, HOST) is False
    assert "the roll stopped before this host could restart" in caplog.text
    assert handoff.has("b200-01", "took") and handoff.left("b200-01") is None
    assert router.registered == [URL]


class Changed:
    def __init__(self, changed: bool) -> None:
        self.changed = changed

    def did_change(self) -> bool:
        return self.changed


def restart(monkeypatch: pytest.MonkeyPatch, changed: bool, routed: bool) -> list[Any]:
    monkeypatch.setattr(service, "state", SimpleNamespace(is_executing=True))
    monkeypatch.setattr(service, "host", Host({"UnitCondition": {
        "ActiveState": "active", "UnitFileState": "enabled"}}))
    return commands(service.unit_running, "sglang.service", [Changed(changed)], routed=routed)


def test_a_server_leaves_right_before_its_restart_and_only_then(
        handoff: cutover.Handoff, monkeypatch: pytest.MonkeyPatch) -> None:
    first, second = restart(monkeypatch, changed=True, routed=True)
    assert isinstance(first, FunctionCommand) and first.function is cutover._leave
    assert second == service.start_command("sglang.service")
    assert restart(monkeypatch, changed=False, routed=True) == []  # no restart: it stays
    # the router's own unit and the DCGM exporter are not behind the routers
    assert restart(monkeypatch, changed=True, routed=False) == [
        service.start_command("sglang.service")]


def test_a_restore_that_restarts_leaves_first(handoff: cutover.Handoff,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    fake = Host({"File": {"path": "x"}, "Sha256File": lambda path: path,  # saved != current
                 "FindInFile": [], "Link": None})
    monkeypatch.setattr(gate, "host", fake)
    found = commands(gate.last_good_back, "sglang.service")
    assert isinstance(found[0], FunctionCommand) and found[0].function is cutover._leave
    assert "systemctl restart sglang.service" in found[1]


def test_a_driver_change_leaves_first_and_a_held_driver_stays(
        handoff: cutover.Handoff, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = driver.DriverConfig.from_data({"nvidia_driver_version": "580.95.05"}, "h1")
    monkeypatch.setattr(driver, "state", SimpleNamespace(is_executing=True))
    monkeypatch.setattr(driver, "host", driver_host(["580.95.05-1"], "580.82.07-1", []))
    found = commands(driver.driver_packages, cfg)
    assert isinstance(found[0], FunctionCommand) and found[0].function is cutover._leave
    assert found[1].startswith("apt-mark unhold")
    monkeypatch.setattr(driver, "host", driver_host(["580.95.05-1"], "580.95.05-1", []))
    assert commands(driver.driver_packages, cfg) == [f"apt-mark hold {' '.join(cfg.packages)}"]


def test_files_back_puts_the_last_good_files_back_without_a_restart(
        monkeypatch: pytest.MonkeyPatch) -> None:
    saved = "/etc/sglang/last-good/sglang.service"
    release = "/opt/sglang/releases/sglang-0.5.22-abc"
    fake = Host({"File": {"path": "x"}, "Sha256File": lambda path: path,  # saved != live
                 "FindInFile": [f"ExecStart={release}/bin/python -m x"],
                 "Link": {"link_target": "/opt/sglang/releases/sglang-0.5.23-def"}})
    monkeypatch.setattr(gate, "host", fake)
    files, link = commands(gate.files_back, "sglang.service")
    assert files.startswith(f"cp -p {saved} /etc/systemd/system/sglang.service && cp -p "
                            f"{saved}.env /etc/sglang/sglang.env")
    assert files.endswith("systemctl daemon-reload") and "restart" not in files
    assert link == f"ln -sfn {release} /opt/sglang/current.new && mv -T " \
        "/opt/sglang/current.new /opt/sglang/current"
    fake.facts["Sha256File"] = lambda path: "same"
    fake.facts["Link"] = {"link_target": release}
    assert commands(gate.files_back, "sglang.service") == []
    assert fake.noops == ["sglang.service: its files are the last good release's"]


def test_files_back_removes_a_new_instance_that_never_started(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def file(path: str) -> dict[str, str] | None:
        return None if "last-good" in path else {"path": path}

    fake = Host({"File": file, "UnitCondition": {"ActiveState": "inactive"}})
    monkeypatch.setattr(gate, "host", fake)
    monkeypatch.setattr(service, "host", fake)
    assert commands(gate.files_back, "sglang-1.service") == [
        "rm -f /etc/systemd/system/sglang-1.service /etc/sglang/sglang-1.env && "
        "systemctl daemon-reload"]
    fake.facts["UnitCondition"] = {"ActiveState": "active"}  # serving: not ours to remove
    assert commands(gate.files_back, "sglang-1.service") == []
