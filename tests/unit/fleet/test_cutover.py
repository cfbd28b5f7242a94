"""A roll's cutover inside the deploy: the host leaves the routers at its first disruptive
command, once, only in a roll (the roll's side is in tests/unit/roll/test_roll.py, the real
thing under load in tests/lab/test_fleet.py)."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from pyinfra.api.command import FunctionCommand

from sglang_fleet.fleet import cutover, roll_directory, router_api
from sglang_fleet.fleet import inventory as fleet
from sglang_fleet.fleet.router_api import RouterError
from sglang_fleet.hostconfig import HostConfig
from sglang_fleet.stages.driver import deploy as driver
from sglang_fleet.stages.service import deploy as service
from sglang_fleet.stages.service import last_good, units
from tests.fakes import Host, commands, driver_host

URL = "http://10.0.0.11:30000"
HOST = SimpleNamespace(name="b200-01", print_prefix="[b200-01] ")


class Router:
    def __init__(self, url: str, registered: list[str], broken: bool = False,
                 unhealthy: tuple[str, ...] = ()) -> None:
        self.url, self.registered, self.broken = url, list(registered), broken
        self.unhealthy = unhealthy
        self.waited: list[tuple[str, float]] = []
        self.listed_at_wait: list[list[str]] = []  # what was registered at each wait

    def remove(self, url: str) -> bool:
        if self.broken:
            raise RouterError(f"router {self.url}: DELETE /workers answered 500")
        if url not in self.registered:
            return False
        self.registered.remove(url)
        return True

    def workers(self) -> dict[str, dict[str, Any]]:
        if self.broken:
            raise RouterError(f"router {self.url}: GET /workers answered 500")
        return {url: {"is_healthy": True} for url in self.registered}

    def add(self, url: str) -> bool:
        if url in self.registered:
            return False
        self.registered.append(url)
        return True

    def wait_healthy(self, url: str, timeout: float) -> None:
        self.waited.append((url, timeout))
        self.listed_at_wait.append(list(self.registered))
        if url in self.unhealthy:
            raise RouterError(f"router {self.url}: gave up waiting {timeout:.0f} s for the "
                              f"router to see {url} healthy")

    rejoin = router_api.Router.rejoin  # the real order of adds and waits, over this fake's


@pytest.fixture
def roll_dir(monkeypatch: pytest.MonkeyPatch) -> Iterator[roll_directory.RollDirectory]:
    shared = roll_directory.RollDirectory.create()
    monkeypatch.setenv(roll_directory.ENV, str(shared.directory))
    yield shared
    shared.close()


def routers(monkeypatch: pytest.MonkeyPatch, *found: Router) -> None:
    monkeypatch.setattr(fleet, "routers",
                        lambda inventory: [SimpleNamespace(api=lambda r=r: r) for r in found])


def test_outside_a_roll_nothing_leaves(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(roll_directory.ENV, raising=False)
    assert list(cutover.leave_routers()) == []
    assert cutover._leave(None, HOST)


def test_in_a_roll_the_host_leaves_every_router_once_and_drains(
        roll_dir: roll_directory.RollDirectory, monkeypatch: pytest.MonkeyPatch) -> None:
    [command] = cutover.leave_routers()
    assert isinstance(command, FunctionCommand)
    a, b = Router("http://r1:30080", [URL, "http://other:30000"]), Router("http://r2:30080", [URL])
    routers(monkeypatch, a, b)
    drains: list[str] = []

    def drained(url: str, timeout: float) -> tuple[bool, int]:
        drains.append(f"{url} {timeout:g}")
        return False, 3

    monkeypatch.setattr(cutover, "drained", drained)
    roll_dir.plan({"b200-01": [URL]}, drain_timeout=600)
    roll_dir.give("turn", ["b200-01"])
    roll_dir.give("go", ["b200-01"])
    assert roll_dir.out_of_routers("b200-01") is None
    assert cutover._leave(SimpleNamespace(inventory=None), HOST)
    assert a.registered == ["http://other:30000"] and b.registered == []
    assert drains == [f"{URL} 600"]
    out = roll_dir.out_of_routers("b200-01")
    assert out is not None and out.at is not None and out.at > 0
    assert out.notes == [f"{URL}: 3 requests still in flight after 600 s; its own SIGTERM "
                          "drain finishes them"]
    a.registered.append(URL)  # a second disruptive command in the same run: out already
    assert cutover._leave(SimpleNamespace(inventory=None), HOST)
    assert URL in a.registered and len(drains) == 1


def test_a_host_outside_the_batch_stays(roll_dir: roll_directory.RollDirectory,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    router = Router("http://r1:30080", [URL])
    routers(monkeypatch, router)
    roll_dir.plan({"b200-02": ["http://10.0.0.12:30000"]}, drain_timeout=600)
    assert cutover._leave(SimpleNamespace(inventory=None), HOST)
    assert router.registered == [URL] and roll_dir.out_of_routers("b200-01") is None


def test_a_router_that_refuses_fails_the_command(roll_dir: roll_directory.RollDirectory,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    routers(monkeypatch, Router("http://r1:30080", [URL], broken=True))
    roll_dir.plan({"b200-01": [URL]}, drain_timeout=600)
    roll_dir.give("turn", ["b200-01"])
    roll_dir.give("go", ["b200-01"])
    assert cutover._leave(SimpleNamespace(inventory=None), HOST) is False
    assert roll_dir.out_of_routers("b200-01") is not None  # the roll puts it back either way


def test_a_run_waits_for_its_turn_and_stops_if_the_roll_does(
        roll_dir: roll_directory.RollDirectory, monkeypatch: pytest.MonkeyPatch) -> None:
    router = Router("http://r1:30080", [URL])
    routers(monkeypatch, router)
    monkeypatch.setattr(cutover, "POLL", 0.01)
    monkeypatch.setattr(os, "getppid", os.getpid)  # as if the roll started this run
    roll_dir.plan({"b200-01": [URL]}, drain_timeout=600)
    [command] = cutover.turn._inner()
    assert command.function is cutover._await_turn
    given = threading.Timer(0.2, roll_dir.give, ("turn", ["b200-01"]))
    given.start()
    tic = time.monotonic()
    assert cutover._await_turn(None, HOST)  # waits until the roll gives it the turn
    assert time.monotonic() - tic >= 0.15
    assert roll_dir.has("b200-01", "waiting") and roll_dir.has("b200-01", "took")
    assert router.registered == [URL]  # its turn is not leaving
    # leaving waits for go: the batch before it back in the routers
    threading.Timer(0.2, roll_dir.give, ("go", ["b200-01"])).start()
    tic = time.monotonic()
    assert cutover._leave(SimpleNamespace(inventory=None), HOST)
    assert time.monotonic() - tic >= 0.15 and router.registered == []


def test_no_turn_when_the_roll_stopped_or_is_gone(roll_dir: roll_directory.RollDirectory,
                                                  monkeypatch: pytest.MonkeyPatch,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    router = Router("http://r1:30080", [URL])
    routers(monkeypatch, router)
    roll_dir.plan({"b200-01": [URL]}, drain_timeout=600)
    # this test process did not start a run: its parent is not the roll that wrote the plan
    assert cutover._leave(None, HOST) is False
    assert "the roll (pid " in caplog.text and "is gone" in caplog.text
    monkeypatch.setattr(os, "getppid", os.getpid)
    roll_dir.abort()
    assert cutover._leave(None, HOST) is False
    assert "the roll stopped before this host's turn: nothing that serves was changed" in \
        caplog.text
    assert router.registered == [URL] and roll_dir.out_of_routers("b200-01") is None
    assert not roll_dir.has("b200-01", "took")


def test_a_roll_stopped_between_turn_and_go_leaves_nothing(
        roll_dir: roll_directory.RollDirectory, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    router = Router("http://r1:30080", [URL])
    routers(monkeypatch, router)
    monkeypatch.setattr(os, "getppid", os.getpid)
    roll_dir.plan({"b200-01": [URL]}, drain_timeout=600)
    roll_dir.give("turn", ["b200-01"])
    roll_dir.abort()
    assert cutover._leave(None, HOST) is False
    assert "the roll stopped before this host could restart" in caplog.text
    assert roll_dir.has("b200-01", "took") and roll_dir.out_of_routers("b200-01") is None
    assert router.registered == [URL]


def restart(monkeypatch: pytest.MonkeyPatch, changed: bool, routed: bool) -> list[Any]:
    """The running unit's operation, as ``unit_running`` calls it when what it runs changed
    (``restart``, under ``_if``) or not."""
    monkeypatch.setattr(service, "host", Host({"UnitCondition": {
        "ActiveState": "active", "UnitFileState": "enabled"}}))
    return commands(service.unit_started, "sglang.service", restart=changed, routed=routed)


def test_a_server_leaves_right_before_its_restart_and_only_then(
        roll_dir: roll_directory.RollDirectory, monkeypatch: pytest.MonkeyPatch) -> None:
    first, second = restart(monkeypatch, changed=True, routed=True)
    assert isinstance(first, FunctionCommand) and first.function is cutover._leave_units
    assert first.args == (["sglang.service"],)  # the whole host, unless --batch-instances
    assert second == units.start_command("sglang.service")
    assert restart(monkeypatch, changed=False, routed=True) == []  # no restart: it stays
    # the router's own unit and the DCGM exporter are not behind the routers
    assert restart(monkeypatch, changed=True, routed=False) == [
        units.start_command("sglang.service")]


def test_a_restore_that_restarts_leaves_first(roll_dir: roll_directory.RollDirectory,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    fake = Host({"File": {"path": "x"}, "Sha256File": lambda path: path,  # saved != current
                 "FindInFile": [], "Link": None})
    monkeypatch.setattr(last_good, "host", fake)
    found = commands(last_good.restore_unit, "sglang.service")
    assert isinstance(found[0], FunctionCommand) and found[0].function is cutover._leave_units
    assert found[0].args == (["sglang.service"],)  # the whole host, unless --batch-instances
    assert "systemctl restart sglang.service" in found[1]


def test_a_driver_change_leaves_first_and_a_held_driver_stays(
        roll_dir: roll_directory.RollDirectory, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = driver.DriverConfig.of(HostConfig.from_data({"nvidia_driver_version": "580.95.05"},
                                                           "h1"))
    monkeypatch.setattr(driver, "host", driver_host(["580.95.05-1"], "580.82.07-1", []))
    found = commands(driver.driver_packages, cfg)
    assert isinstance(found[0], FunctionCommand) and found[0].function is cutover._leave
    assert found[1].startswith("apt-mark unhold")
    monkeypatch.setattr(driver, "host", driver_host(["580.95.05-1"], "580.95.05-1", []))
    assert commands(driver.driver_packages, cfg) == [f"apt-mark hold {' '.join(cfg.packages)}"]


def test_restore_files_puts_the_last_good_files_back_without_a_restart(
        monkeypatch: pytest.MonkeyPatch) -> None:
    saved = "/etc/sglang/last-good/sglang.service"
    release = "/opt/sglang/releases/sglang-0.5.22-abc"
    fake = Host({"File": {"path": "x"}, "Sha256File": lambda path: path,  # saved != live
                 "FindInFile": [f"ExecStart={release}/bin/python -m x"],
                 "Link": {"link_target": "/opt/sglang/releases/sglang-0.5.23-def"}})
    monkeypatch.setattr(last_good, "host", fake)
    files, link = commands(last_good.restore_files, "sglang.service")
    assert files == last_good._copy_back_command("sglang.service")  # test_last_good runs it
    assert f"cp -p {saved} /etc/systemd/system/sglang.service && " in files
    assert files.endswith("systemctl daemon-reload") and "restart" not in files
    assert link == f"ln -sfn {release} /opt/sglang/current.new && mv -T " \
        "/opt/sglang/current.new /opt/sglang/current"
    fake.facts["Sha256File"] = fake.facts["KeylessSha256"] = lambda path: "same"
    fake.facts["Link"] = {"link_target": release}
    assert commands(last_good.restore_files, "sglang.service") == []
    assert fake.noops == ["sglang.service: its files are the last good release's"]


def test_restore_files_removes_a_new_instance_that_never_started(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def file(path: str) -> dict[str, str] | None:
        return None if "last-good" in path else {"path": path}

    fake = Host({"File": file, "UnitCondition": {"ActiveState": "inactive"}})
    monkeypatch.setattr(last_good, "host", fake)
    monkeypatch.setattr(service, "host", fake)
    assert commands(last_good.restore_files, "sglang-1.service") == [
        "rm -f /etc/systemd/system/sglang-1.service /etc/sglang/sglang-1.env && "
        "systemctl daemon-reload"]
    fake.facts["UnitCondition"] = {"ActiveState": "active"}  # serving: not ours to remove
    assert commands(last_good.restore_files, "sglang-1.service") == []


# --batch-instances: a host's servers leave and come back wave by wave.
SERVERS = {f"sglang-{i}.service": f"http://10.0.0.11:3000{i}" for i in range(3)}
STATE = SimpleNamespace(inventory=None)


def per_server(roll_dir: roll_directory.RollDirectory, monkeypatch: pytest.MonkeyPatch,
               batch_instances: int | None, *found: Router) -> list[str]:
    """A roll of b200-01's three servers, at its go; every drain ends at once, recorded."""
    routers(monkeypatch, *found)
    drains: list[str] = []

    def drained(url: str, timeout: float) -> tuple[bool, int]:
        drains.append(url)
        return True, 0

    monkeypatch.setattr(cutover, "drained", drained)
    roll_dir.plan({"b200-01": list(SERVERS.values())}, drain_timeout=600,
                 units={"b200-01": {u: [url] for u, url in SERVERS.items()}},
                 batch_instances=batch_instances,
                 health_timeout=42)
    roll_dir.give("turn", ["b200-01"])
    roll_dir.give("go", ["b200-01"])
    return drains


def test_with_batch_instances_only_the_restarting_servers_leave_and_drain(
        roll_dir: roll_directory.RollDirectory, monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = Router("http://r1:30080", list(SERVERS.values())), Router("http://r2:30080",
                                                                    list(SERVERS.values()))
    drains = per_server(roll_dir, monkeypatch, 2, a, b)
    u0, u1, u2 = SERVERS.values()
    assert cutover._leave_units(STATE, HOST, ["sglang-1.service", "sglang-2.service"])
    assert a.registered == [u0] and b.registered == [u0] and drains == [u1, u2]
    out = roll_dir.out_of_routers("b200-01")
    assert out is not None and out.at is None  # the host never left whole
    [wave] = out.waves
    assert wave.urls == [u1, u2] and wave.back is None and out.still_out() == wave.left
    # the wave is ready: back into every router, each waited for until it is healthy
    assert cutover._rejoin(STATE, HOST, [u1, u2])
    assert sorted(a.registered) == sorted(b.registered) == sorted(SERVERS.values())
    assert a.waited == [(u1, 42), (u2, 42)] and b.waited == a.waited
    assert {u1, u2} <= set(a.listed_at_wait[0])  # both back before the first is waited for
    out = roll_dir.out_of_routers("b200-01")
    assert out is not None and out.waves[0].back is not None and out.still_out() is None
    # the next wave opens a wave of its own
    assert cutover._leave_units(STATE, HOST, ["sglang-0.service"])
    out = roll_dir.out_of_routers("b200-01")
    assert out is not None and [w.urls for w in out.waves] == [[u1, u2], [u0]]
    assert u0 not in a.registered and drains == [u1, u2, u0]


def test_without_batch_instances_a_restarting_server_takes_its_host_out_whole(
        roll_dir: roll_directory.RollDirectory, monkeypatch: pytest.MonkeyPatch) -> None:
    router = Router("http://r1:30080", [*SERVERS.values(), "http://other:30000"])
    drains = per_server(roll_dir, monkeypatch, None, router)
    assert cutover._leave_units(STATE, HOST, ["sglang-1.service"])
    assert router.registered == ["http://other:30000"] and drains == list(SERVERS.values())
    out = roll_dir.out_of_routers("b200-01")
    assert out is not None and out.at is not None and out.waves == []
    # it comes back whole, after its gate, through the roll: never wave by wave
    assert cutover._rejoin(STATE, HOST, [SERVERS["sglang-1.service"]])
    assert router.registered == ["http://other:30000"] and router.waited == []


def test_a_new_server_takes_nothing_out_and_joins_when_ready(
        roll_dir: roll_directory.RollDirectory, monkeypatch: pytest.MonkeyPatch) -> None:
    u0, u1, new = SERVERS.values()
    router = Router("http://r1:30080", [u0, u1])  # sglang-2 is new: in the plan, not routed
    drains = per_server(roll_dir, monkeypatch, 1, router)
    assert cutover._leave_units(STATE, HOST, ["sglang-2.service"])
    assert router.registered == [u0, u1] and drains == []
    assert roll_dir.out_of_routers("b200-01") is None
    assert cutover._rejoin(STATE, HOST, [new])
    assert router.registered == [u0, u1, new] and router.waited == [(new, 42)]


def test_a_server_the_roll_does_not_know_takes_its_host_out_whole(
        roll_dir: roll_directory.RollDirectory, monkeypatch: pytest.MonkeyPatch) -> None:
    # the host runs a fourth server from an earlier roll's --data; this roll retires it
    fourth = "http://10.0.0.11:30003"
    router = Router("http://r1:30080", [*SERVERS.values(), fourth, "http://10.0.0.12:30000"])
    drains = per_server(roll_dir, monkeypatch, 1, router)
    assert cutover._leave_units(STATE, HOST, ["sglang-3.service"])
    # every worker at the host's address leaves, the other host's stays
    assert router.registered == ["http://10.0.0.12:30000"]
    assert drains == [*SERVERS.values(), fourth]
    out = roll_dir.out_of_routers("b200-01")
    assert out is not None and out.at is not None


def test_a_whole_leave_after_some_waves_takes_every_server_out(
        roll_dir: roll_directory.RollDirectory, monkeypatch: pytest.MonkeyPatch) -> None:
    # a wave came back at a new URL (its port changed); then the host fails and is restored
    router = Router("http://r1:30080", list(SERVERS.values()))
    per_server(roll_dir, monkeypatch, 1, router)
    moved = "http://10.0.0.11:31000"
    assert cutover._leave_units(STATE, HOST, ["sglang-0.service"])
    assert cutover._rejoin(STATE, HOST, [moved])
    assert moved in router.registered
    assert cutover._leave(STATE, HOST)
    assert router.registered == []
    out = roll_dir.out_of_routers("b200-01")
    assert out is not None and out.at is not None
    # out whole: a server's own leave is a no-op now, and nothing comes back early
    assert cutover._leave_units(STATE, HOST, ["sglang-1.service"])
    assert cutover._rejoin(STATE, HOST, [moved]) and router.registered == []


def test_a_wave_the_router_does_not_see_healthy_fails_the_command(
        roll_dir: roll_directory.RollDirectory, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    u1 = SERVERS["sglang-1.service"]
    router = Router("http://r1:30080", list(SERVERS.values()), unhealthy=(u1,))
    per_server(roll_dir, monkeypatch, 1, router)
    assert cutover._leave_units(STATE, HOST, ["sglang-1.service"])
    assert cutover._rejoin(STATE, HOST, [u1]) is False
    assert f"putting {u1} back: router http://r1:30080: gave up waiting 42 s" in caplog.text
    out = roll_dir.out_of_routers("b200-01")
    assert out is not None and out.still_out() == out.waves[0].left  # still out: the roll
    # puts it back


def test_a_server_waits_for_its_go_before_it_leaves(
        roll_dir: roll_directory.RollDirectory, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    router = Router("http://r1:30080", list(SERVERS.values()))
    routers(monkeypatch, router)
    monkeypatch.setattr(os, "getppid", os.getpid)
    roll_dir.plan({"b200-01": list(SERVERS.values())}, drain_timeout=600,
                 units={"b200-01": {u: [url] for u, url in SERVERS.items()}},
                 batch_instances=1)
    roll_dir.give("turn", ["b200-01"])
    roll_dir.abort()
    assert cutover._leave_units(STATE, HOST, ["sglang-0.service"]) is False
    assert "the roll stopped before this host could restart" in caplog.text
    assert router.registered == list(SERVERS.values())
    assert roll_dir.out_of_routers("b200-01") is None
