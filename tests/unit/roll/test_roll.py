"""The rolling redeploy's control flow, with a stand-in router and pyinfra runs (the real ones
are exercised under load in tests/lab/test_fleet.py)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from sglang_fleet.errors import InputError
from sglang_fleet.fleet import cutover, roll_directory, router_api
from sglang_fleet.fleet import inventory as fleet
from sglang_fleet.fleet.inventory import parse_data
from sglang_fleet.fleet.roll_directory import RollDirectory
from sglang_fleet.fleet.router_api import RouterError
from sglang_fleet.roll import planning, roll
from sglang_fleet.stages.compiled import exchange as compiled_exchange
from tests import noconnect
from tests.conftest import ROOT

URLS = {name: [f"http://{name}:30000"] for name in ("h1", "h2", "h3")}


class FakeRouter:
    url = "http://router:30080"

    def __init__(self, healthy: dict[str, bool]) -> None:
        self.known = dict(healthy)
        self.log: list[tuple[str, str]] = []

    def workers(self) -> dict[str, dict[str, Any]]:
        return {url: {"is_healthy": ok} for url, ok in self.known.items()}

    def remove(self, url: str) -> bool:
        self.log.append(("remove", url))
        return self.known.pop(url, None) is not None

    def add(self, url: str) -> bool:
        self.log.append(("add", url))
        self.known[url] = True
        return True

    def wait_healthy(self, url: str, timeout: float) -> None:
        if not self.known.get(url):
            raise RouterError(f"{url} not healthy")

    rejoin = router_api.Router.rejoin  # the real order of adds and waits, over this fake's


class Started:
    """A started run: its work happens when the roll waits for it."""

    def __init__(self, work: Callable[[], int]) -> None:
        self.work = work

    def running(self) -> bool:
        return False

    def wait(self) -> int:
        return self.work()


class Runs:
    """pyinfra runs, recorded when started; ``fail`` (or ``failing``) names the (deploy, host)
    that fails. A serve or restore run restarts each host's server (unless ``restarts`` is
    False), which waits for the host's turn and takes it out of the routers, through the
    deploy's own code (``cutover``) and the roll's directory."""

    def __init__(self, fail: tuple[str, str] | None = None, restarts: bool = True,
                 unreached: set[str] | None = None,
                 failing: set[tuple[str, str]] | None = None) -> None:
        self.fails = (failing or set()) | ({fail} if fail else set())  # (deploy, host)
        self.restarts = restarts
        self.unreached = unreached or set()  # hosts pyinfra cannot connect to: the run ends
        self.calls: list[tuple[str, list[str], list[str]]] = []

    def __call__(self, inventory: str, deploy: str, hosts: list[str], data: Sequence[str],
                 env: dict[str, str]) -> Started:
        self.calls.append((deploy, hosts, list(data)))
        if self.unreached & set(hosts):  # ends at connect, before any operation
            return Started(lambda: 1)
        roll_dir = RollDirectory(Path(env[roll_directory.ENV]))
        if deploy == "serve":  # prepared, at the service stage's turn (cutover.turn)
            roll_dir.give("waiting", hosts)
        if deploy == "prepare":  # each host that prepared says so (cutover.prepared)
            roll_dir.give("prepared", [h for h in hosts if ("prepare", h) not in self.fails])
        return Started(lambda: self.work(deploy, hosts, env))

    def work(self, deploy: str, hosts: list[str], env: dict[str, str]) -> int:
        if deploy in ("serve", "restore") and self.restarts:
            os.environ.update(env)  # as the run's process would have it
            try:
                for name in hosts:
                    if not cutover._leave(SimpleNamespace(inventory=None),
                                          SimpleNamespace(name=name, print_prefix="")):
                        return 1  # no turn or go: the roll stopped before it
            finally:
                del os.environ[roll_directory.ENV]
        return 1 if any((deploy, h) in self.fails for h in hosts) else 0


def answering(hosts: list[Any]) -> dict[str, str]:
    """Every host answers over SSH."""
    return {}


def make(router: FakeRouter, runs: Runs, batch: int = 1,
         reach: Callable[[list[Any]], dict[str, str]] = answering,
         names: Sequence[str] = tuple(URLS)) -> roll.Roll:
    hosts = [cast(Any, SimpleNamespace(name=n)) for n in names]
    urls = {n: URLS[n] for n in names}
    plan = planning.Plan(inventory="inv.py", data=["sglang.memory.page_size=64"],
                         batches=[hosts[i:i + batch] for i in range(0, len(hosts), batch)],
                         before=dict(urls), after=dict(urls), routers=[cast(Any, router)])
    return roll.Roll(plan, drain_timeout=1, health_timeout=1, run=runs, reach=reach)


@pytest.fixture
def router(monkeypatch: pytest.MonkeyPatch) -> FakeRouter:
    """Every host healthy in one router, which the runs find in the inventory; drains end at
    once."""
    fake = FakeRouter({u[0]: True for u in URLS.values()})
    monkeypatch.setattr(fleet, "routers", lambda inventory: [
        SimpleNamespace(api=lambda: fake)])
    monkeypatch.setattr(cutover, "drained", lambda url, timeout: (True, 0))
    return fake


def test_hosts_go_out_converge_and_come_back_one_at_a_time(router: FakeRouter) -> None:
    runs = Runs()
    rolled = make(router, runs)
    assert rolled()
    # the first batch prepares in its own run beside the others' preparation
    assert [(d, h) for d, h, _ in runs.calls] == [("serve", ["h1"]), ("prepare", ["h2", "h3"]),
                                                  ("serve", ["h2"]), ("serve", ["h3"])]
    assert all(data == ["sglang.memory.page_size=64"] for _, _, data in runs.calls)
    assert router.log == [(op, URLS[h][0]) for h in URLS for op in ("remove", "add")]
    assert "h3              converged" in rolled.report()


def test_a_failure_restores_that_host_and_leaves_the_rest_untouched(router: FakeRouter) -> None:
    runs = Runs(("serve", "h2"))
    rolled = make(router, runs)
    assert not rolled()
    # h3's run started with h2's turn and stopped before its own
    assert [(d, h) for d, h, _ in runs.calls] == [
        ("serve", ["h1"]), ("prepare", ["h2", "h3"]), ("serve", ["h2"]),
        ("serve", ["h3"]), ("restore", ["h2"])]
    assert runs.calls[-1][2] == []  # the restore runs without the roll's data
    assert ("remove", "http://h3:30000") not in router.log
    assert all(router.known.values()) and len(router.known) == 3
    report = rolled.report()
    assert "h2              failed, last good release serving again" in report
    assert "h3              untouched" in report


def test_no_host_leaves_while_another_is_unhealthy(router: FakeRouter) -> None:
    router.known["http://h3:30000"] = False
    runs = Runs()
    with pytest.raises(RouterError, match=r"h3 .* is not healthy"):
        make(router, runs)()
    # h1's run was started (and prepared) but never given its turn
    assert [(d, h) for d, h, _ in runs.calls] == [("serve", ["h1"]), ("prepare", ["h2", "h3"]),
                                                  ("serve", ["h2"])]
    assert router.log == []


def test_batches_of_two(router: FakeRouter) -> None:
    runs = Runs()
    assert make(router, runs, batch=2)()
    assert [(d, h) for d, h, _ in runs.calls] == [("serve", ["h1", "h2"]), ("prepare", ["h3"]),
                                                  ("serve", ["h3"])]
    assert [op for op, _ in router.log] == ["remove", "remove", "add", "add", "remove", "add"]


def test_a_failed_preparation_takes_no_host_out(router: FakeRouter) -> None:
    runs = Runs(("prepare", "h2"))
    rolled = make(router, runs)
    assert not rolled()
    # the first batch's run, prepared, never had its turn
    assert [d for d, _, _ in runs.calls] == ["serve", "prepare"] and router.log == []
    assert "h1              not touched: preparing failed" in rolled.report()


def test_bad_input_is_named() -> None:
    with pytest.raises(InputError, match="--data: novalue: not key=value"):
        parse_data(["novalue"])
    with pytest.raises(InputError, match="--batch: must be at least 1"):
        planning.plan("inventories/b200.py", [], 0)
    with pytest.raises(InputError, match="no such inventory file"):
        planning.plan("inventories/nope.py", [], 1)
    for bad in (0, -2):
        with pytest.raises(InputError, match=rf"--batch-instances: must be at least 1, got "
                           rf"{bad}"):
            planning.plan("inventories/b200.py", [], 1, batch_instances=bad)


def test_a_hosts_servers_all_go_back_before_any_is_waited_for(router: FakeRouter) -> None:
    """The router checks the health of a host's servers together, not one after another."""
    class Waits(FakeRouter):
        def wait_healthy(self, url: str, timeout: float) -> None:
            self.log.append(("healthy", url))
            super().wait_healthy(url, timeout)

    waits = Waits({})
    rolled = make(cast(FakeRouter, waits), Runs())
    rolled.went_out("h1")
    rolled.put_back(["h1"], {"h1": ["http://h1:30000", "http://h1:30001"]})
    assert waits.log == [("add", "http://h1:30000"), ("add", "http://h1:30001"),
                         ("healthy", "http://h1:30000"), ("healthy", "http://h1:30001")]
    assert rolled.outcomes["h1"].out_seconds is not None


def test_batch_instances_larger_than_a_hosts_servers_is_named(tmp_path: Path) -> None:
    after = {"h1": ["http://h1:30000", "http://h1:30001"], "h2": ["http://h2:30000"]}
    planning._fits(None, after)
    planning._fits(1, after)
    with pytest.raises(InputError, match=r"--batch-instances: 2 is more than a host's "
                       r"servers: h2 runs 1 server\n    fix: give at most 1"):
        planning._fits(2, after)
    # through the command, before any host is touched (a process of its own: see below)
    log = tmp_path / "connections"
    result = subprocess.run(["sglang-fleet", "roll", "inventories/b200.py",
                             "--batch-instances", "9"], cwd=ROOT, capture_output=True,
                            text=True, timeout=60, env=noconnect.env(log))
    assert result.returncode == 1 and "roll:" not in result.stdout
    assert noconnect.attempts(log) == []  # the example's hosts are never reached
    # instances: auto on the example's gpu_count 8
    assert result.stderr.startswith("error: --batch-instances: 9 is more than a host's "
                                    "servers: b200-01 runs 8 servers, b200-02 runs 8 servers\n")


def test_every_hosts_change_is_checked_before_any_host_is_touched(tmp_path: Path) -> None:
    # In a process of its own: loading an inventory imports pyinfra_cli, which patches the
    # process with gevent.
    log = tmp_path / "connections"
    result = subprocess.run(["sglang-fleet", "roll", "inventories/b200.py", "--data",
                             "sglang.speculative.num_draft_tokens=7"], cwd=ROOT,
                            capture_output=True, text=True, timeout=60, env=noconnect.env(log))
    assert result.returncode == 1 and noconnect.attempts(log) == []
    # every host has the problem: said once, naming them all
    assert "error: --data (hosts b200-01, b200-02): speculative.num_draft_tokens:" in \
        result.stderr
    assert result.stderr.count("error:") == 1
    assert "fix: set speculative.num_draft_tokens: 4" in result.stderr
    assert "roll:" not in result.stdout and "Traceback" not in result.stderr


class Clock:
    """The roll's and the cutover's time: a deploy works 10 s in the router, then 30 s out of
    it (restart and gate); a router's health wait takes 5 s."""

    def __init__(self) -> None:
        self.now = 1000.0

    def time(self) -> float:
        return self.now

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        fake = SimpleNamespace(monotonic=self.time, time=self.time,
                               strftime=lambda f: "00:00:00")
        monkeypatch.setattr(roll, "time", fake)
        monkeypatch.setattr(cutover, "time", fake)


def test_the_table_shows_each_hosts_seconds_out_of_the_router(
        monkeypatch: pytest.MonkeyPatch, router: FakeRouter) -> None:
    clock = Clock()
    clock.install(monkeypatch)

    def wait_healthy(url: str, timeout: float) -> None:
        clock.now += 5

    class SlowRuns(Runs):
        def work(self, deploy: str, hosts: list[str], env: dict[str, str]) -> int:
            clock.now += 10  # facts, uploads, unit files: still in the router
            status = super().work(deploy, hosts, env)
            clock.now += 30  # restart and gate
            return status

    monkeypatch.setattr(router, "wait_healthy", wait_healthy)
    rolled = make(router, SlowRuns(("serve", "h2")))
    assert not rolled()
    report = rolled.report().splitlines()
    assert report[0].endswith("out of router (s)")
    rows = {line.split()[0]: line for line in report[1:] if not line.startswith(" ")}
    assert rows["h1"].split()[-1] == "35.0"  # out at its restart: 30 s, seen healthy 5 s
    assert rows["h2"].split()[-1] == "75.0"  # failed: 30 s, the restore 40 s, healthy 5 s
    assert rows["h3"].split()[-1] == "-"  # never taken out
    assert report[3].split() == ["cause:", "its", "deploy", "failed", "(its", "output",
                                 "above)"]  # under h2


def test_a_host_whose_run_restarts_nothing_never_leaves_the_router(router: FakeRouter) -> None:
    rolled = make(router, Runs(restarts=False))
    assert rolled()
    assert [op for op, _ in router.log] == ["add"] * 3  # registered already: a no-op
    assert all(o.out_seconds is None and o.result == "converged"
               for o in rolled.outcomes.values())


def test_a_host_the_restore_did_not_bring_back_is_still_out(router: FakeRouter) -> None:
    class Failing(Runs):
        def work(self, deploy: str, hosts: list[str], env: dict[str, str]) -> int:
            super().work(deploy, hosts, env)
            return int(deploy != "prepare")  # the preparation passes; deploy and restore fail

    rolled = make(router, Failing())
    assert not rolled()
    assert rolled.outcomes["h1"].still_out and rolled.outcomes["h1"].out_text().endswith("still")
    assert rolled.outcomes["h2"].out_seconds is None
    assert "http://h1:30000" not in router.known


def test_a_batch_that_cannot_go_back_stops_the_roll_and_the_next_one_unstages(
        router: FakeRouter) -> None:
    """h2 had its turn (h1 passed its gate) and may have changed its files; h1 never came back
    into the router, so h2 never got its go: its last good files go back, nothing restarts."""
    def wait_healthy(url: str, timeout: float) -> None:
        if url == "http://h1:30000":
            raise RouterError(f"router {router.url}: gave up waiting 1 s for {url}")

    router.wait_healthy = wait_healthy  # type: ignore[method-assign]
    runs = Runs()
    rolled = make(router, runs)
    with pytest.raises(RouterError, match="gave up waiting"):
        rolled()
    assert [(d, h) for d, h, _ in runs.calls] == [
        ("serve", ["h1"]), ("prepare", ["h2", "h3"]), ("serve", ["h2"]), ("restore", ["h1"]),
        ("unstage", ["h2"])]
    assert runs.calls[-1][2] == ["sglang.memory.page_size=64"]  # the roll's units, its data
    assert ("remove", "http://h2:30000") not in router.log
    assert rolled.outcomes["h2"].result == "not restarted: last good files back"
    assert rolled.outcomes["h3"].result == "untouched"


def test_the_end_of_a_roll_prints_the_fleets_capacity_and_job_time(router: FakeRouter) -> None:
    """After the table: what the fleet serves once the roll is over, read then (as ``status``
    reads it) and summed from each server's gate record; a host that did not come back is
    named, not counted."""
    from sglang_fleet.report import status
    from tests.unit.report.test_status import measured_row, record

    reads: list[str] = []

    def read_fleet() -> status.Fleet:
        reads.append("read")
        rows = [measured_row(n, "sglang.service", "i", record(
            "sglang.service", "i", "0.5.23", f"2026-07-01T10:0{k}:00Z", 48, 6000.0))
            for k, n in enumerate(("h1", "h3"))]
        rows.insert(1, measured_row("h2", "sglang.service", "j", None, health="HTTP 503"))
        return status.Fleet(rows, (900_000, 1000))

    rolled = make(router, Runs(("serve", "h2")))
    rolled.read_fleet = read_fleet
    assert not rolled() and reads == []  # nothing read while the roll runs
    ending = rolled.fleet_lines()
    assert reads == ["read"]
    assert ending[0].startswith("fleet: 96 running requests on 2 of 3 servers")
    assert ending[1].startswith("fleet: 12,000 output tok/s, the sum of 2 of 3 servers'")
    assert ending[2].startswith("fleet: job 900,000 completions x 1,000 tokens: about 20.8 h")
    assert ending[3] == "fleet: not counted: h2 sglang.service (down: /health HTTP 503)"


def test_a_fleet_that_cannot_be_read_after_the_roll_is_one_line(router: FakeRouter) -> None:
    def unreadable() -> Any:
        raise InputError.one("inv.py", "sglang_profile", "no serving hosts", "give hosts one")

    rolled = make(router, Runs())
    rolled.read_fleet = unreadable
    assert rolled.fleet_lines() == ["fleet: not read: inv.py: sglang_profile: no serving hosts"]


def test_with_batch_instances_a_host_keeps_serving_and_the_table_shows_each_wave(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Three hosts of three servers, one server at a time: never more than one server out of
    the router, each wave back before the next leaves; the table gives the longest a server of
    the host was out, and a line per wave."""
    units = {h: {f"sglang-{i}.service": f"http://{h}:3000{i}" for i in range(3)}
             for h in URLS}
    fake = FakeRouter({url: True for by_unit in units.values() for url in by_unit.values()})
    monkeypatch.setattr(fleet, "routers", lambda inventory: [SimpleNamespace(api=lambda: fake)])
    monkeypatch.setattr(cutover, "drained", lambda url, timeout: (True, 0))
    clock = Clock()
    clock.install(monkeypatch)
    fewest = []
    removing = fake.remove

    def remove(url: str) -> bool:
        found = removing(url)
        fewest.append(len(fake.known))
        return found

    fake.remove = remove  # type: ignore[method-assign]

    class WaveRuns(Runs):
        """The service stage of each host: its servers restart one wave at a time, each out
        of the router for 20 s and back once ready."""

        def work(self, deploy: str, hosts: list[str], env: dict[str, str]) -> int:
            if deploy != "serve":
                return 0
            os.environ.update(env)
            try:
                for name in hosts:
                    who = SimpleNamespace(name=name, print_prefix="")
                    for unit, url in units[name].items():
                        assert cutover._leave_units(SimpleNamespace(inventory=None), who,
                                                    [unit])
                        clock.now += 20 + int(unit[7])  # the first (compiling) the longest
                        assert cutover._rejoin(SimpleNamespace(inventory=None), who, [url])
            finally:
                del os.environ[roll_directory.ENV]
            return 0

    hosts = [cast(Any, SimpleNamespace(name=n)) for n in units]
    every = {h: list(by_unit.values()) for h, by_unit in units.items()}
    plan = planning.Plan(inventory="inv.py", data=[], batches=[[h] for h in hosts],
                         before=every, after=every, routers=[cast(Any, fake)], batch_instances=1,
                         units={h: {u: [url] for u, url in by_unit.items()}
                                for h, by_unit in units.items()})
    rolled = roll.Roll(plan, drain_timeout=1, health_timeout=1, run=WaveRuns(), reach=answering)
    assert rolled()
    assert fewest and min(fewest) == 8  # of 9: one server out at a time
    assert all(fake.known.values()) and len(fake.known) == 9
    report = rolled.report().splitlines()
    assert report[1].split()[:2] == ["h1", "converged"] and report[1].split()[-1] == "22.0"
    assert report[2:5] == [
        f"{'':<16}wave 1 out of the router 20.0 s: http://h1:30000",
        f"{'':<16}wave 2 out of the router 21.0 s: http://h1:30001",
        f"{'':<16}wave 3 out of the router 22.0 s: http://h1:30002"]


def test_the_table_says_what_each_host_did_with_its_kernels(router: FakeRouter) -> None:
    class NotingRuns(Runs):
        def work(self, deploy: str, hosts: list[str], env: dict[str, str]) -> int:
            for name in hosts if deploy == "serve" else []:
                compiled_exchange.note(RollDirectory(Path(env[roll_directory.ENV])), name,
                                       f"received ({name})")
            return super().work(deploy, hosts, env)

    rolled = make(router, NotingRuns())
    assert rolled()
    report = rolled.report()
    assert [line.strip() for line in report.splitlines() if "kernels:" in line] == [
        f"kernels: received ({name})" for name in URLS]


SSH_ERROR = "SSH to h2 (10.0.0.12) failed: Could not connect (Connection refused)"


def test_the_roll_says_host_k_of_n_as_it_goes(router: FakeRouter,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    assert make(router, Runs(), names=("h1", "h2"))()
    said = [line.split(" ", 2)[2] for line in capsys.readouterr().out.splitlines()
            if line.startswith("roll: ")]
    turns = [line for line in said if "its turn (out" in line]
    assert turns == ["host 1 of 2 h1: its turn (out of the router from its first restart)",
                     "host 2 of 2 h2: its turn (out of the router from its first restart)"]
    assert "host 1 of 2 h1: converged" in said and "host 2 of 2 h2: converged" in said
    assert said.index("host 1 of 2 h1: converged") < said.index(turns[1])


def test_an_unreachable_host_is_named_and_no_host_is_touched(
        router: FakeRouter, capsys: pytest.CaptureFixture[str]) -> None:
    runs = Runs()
    rolled = make(router, runs, reach=lambda hosts: {"h2": SSH_ERROR}, names=("h1", "h2"))
    assert not rolled()
    assert runs.calls == [] and router.log == []  # no run started, nobody left the router
    out = capsys.readouterr().out
    assert f"host 2 of 2 h2: {SSH_ERROR}" in out
    # said as the host's SSH error, nothing about a router after the order line
    assert "prepared in" not in out and not any("router" in line
                                                for line in out.splitlines()[1:])
    assert rolled.outcomes["h2"].cause.startswith("SSH to h2 (10.0.0.12) failed: ")
    assert rolled.outcomes["h2"].result == "not touched: unreachable"
    assert rolled.outcomes["h1"].result == "not touched: the roll stopped before it"
    assert rolled.cause() == f"host 2 of 2 h2: {SSH_ERROR}"
    assert f"cause: {SSH_ERROR}" in rolled.report()


def test_a_first_host_lost_after_the_check_is_the_cause_not_the_router(
        router: FakeRouter, capsys: pytest.CaptureFixture[str]) -> None:
    """The first batch's run ends at connect, before its turn (it was "prepared in 2 s" and
    then restored, blamed on what came after): it is not prepared, nothing leaves the router,
    nothing is restored, and the cause is its SSH error."""
    probes: list[list[str]] = []

    def reach(hosts: list[Any]) -> dict[str, str]:
        probes.append([h.name for h in hosts])
        lost = SSH_ERROR.replace("h2 (10.0.0.12)", "h1 (10.0.0.11)")
        return {} if len(probes) == 1 else {"h1": lost}

    runs = Runs(unreached={"h1"})
    rolled = make(router, runs, reach=reach, names=("h1", "h2"))
    assert not rolled()
    assert probes == [["h1", "h2"], ["h1"]]
    assert [d for d, _, _ in runs.calls] == ["serve", "prepare"]  # no restore, no unstage
    assert router.log == [] and all(router.known.values())  # serving as before
    out = capsys.readouterr().out
    assert "prepared in" not in out and "its turn (out" not in out
    assert "host 1 of 2 h1: SSH to h1 (10.0.0.11) failed: Could not connect" in out
    h1 = rolled.outcomes["h1"]
    assert (h1.result, h1.cause.split(" ", 1)[0]) == ("not touched: failed before its turn",
                                                       "SSH")
    assert rolled.outcomes["h2"].result == "not touched: the roll stopped before it"


def test_a_failed_deploy_of_a_host_that_went_away_names_ssh(router: FakeRouter) -> None:
    calls = iter([{}, {"h2": SSH_ERROR}])
    rolled = make(router, Runs(("serve", "h2")), reach=lambda hosts: next(calls),
                  names=("h1", "h2"))
    assert not rolled()
    assert rolled.outcomes["h2"].cause == SSH_ERROR
    assert rolled.outcomes["h1"].cause == ""


def test_a_router_that_fails_is_the_cause_when_the_host_answers(router: FakeRouter) -> None:
    def wait_healthy(url: str, timeout: float) -> None:
        raise RouterError(f"router {router.url}: gave up waiting 1 s for {url}")

    router.wait_healthy = wait_healthy  # type: ignore[method-assign]
    rolled = make(router, Runs(), names=("h1", "h2"))
    with pytest.raises(RouterError):
        rolled()
    assert rolled.outcomes["h1"].cause.startswith("router: router http://router:30080: gave up")
