"""The rolling redeploy's control flow, with a stand-in router and pyinfra runs (the real ones
are exercised under load in tests/lab/test_fleet.py)."""

from __future__ import annotations

import subprocess
from types import SimpleNamespace
from typing import Any, cast

import pytest

from sglang_fleet import roll
from sglang_fleet.errors import InputError
from sglang_fleet.routerctl import RouterError
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


class Runs:
    """pyinfra runs, recorded; ``fail`` names the (deploy, host) that fails."""

    def __init__(self, fail: tuple[str, str] | None = None) -> None:
        self.fail = fail
        self.calls: list[tuple[str, list[str], list[str]]] = []

    def __call__(self, inventory: str, deploy: str, hosts: list[str], data: Any) -> int:
        self.calls.append((deploy, hosts, list(data)))
        return 1 if self.fail and (deploy, self.fail[1]) == self.fail and \
            self.fail[1] in hosts else 0


def make(router: FakeRouter, runs: Runs, batch: int = 1) -> roll.Roll:
    hosts = [cast(Any, SimpleNamespace(name=n)) for n in URLS]
    plan = roll.Plan(inventory="inv.py", data=["sglang.memory.page_size=64"],
                     batches=[hosts[i:i + batch] for i in range(0, len(hosts), batch)],
                     before=dict(URLS), after=dict(URLS), routers=[cast(Any, router)])
    return roll.Roll(plan, drain_timeout=1, health_timeout=1, run=runs)


@pytest.fixture(autouse=True)
def instant_drain(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(roll, "drained", lambda url, timeout: (True, 0))


def test_hosts_go_out_converge_and_come_back_one_at_a_time() -> None:
    router, runs = FakeRouter({u[0]: True for u in URLS.values()}), Runs()
    rolled = make(router, runs)
    assert rolled()
    assert [(d, h) for d, h, _ in runs.calls] == [("prepare", ["h1", "h2", "h3"]),
                                                  ("serve", ["h1"]), ("serve", ["h2"]),
                                                  ("serve", ["h3"])]
    assert all(data == ["sglang.memory.page_size=64"] for _, _, data in runs.calls)
    assert router.log == [(op, URLS[h][0]) for h in URLS for op in ("remove", "add")]
    assert "h3              converged" in rolled.report()


def test_a_failure_restores_that_host_and_leaves_the_rest_untouched() -> None:
    router, runs = FakeRouter({u[0]: True for u in URLS.values()}), Runs(("serve", "h2"))
    rolled = make(router, runs)
    assert not rolled()
    assert [(d, h) for d, h, _ in runs.calls] == [
        ("prepare", ["h1", "h2", "h3"]), ("serve", ["h1"]), ("serve", ["h2"]),
        ("restore", ["h2"])]
    assert runs.calls[-1][2] == []  # the restore runs without the roll's data
    assert all(router.known.values()) and len(router.known) == 3
    report = rolled.report()
    assert "h2              failed, last good release serving again" in report
    assert "h3              untouched" in report


def test_no_host_leaves_while_another_is_unhealthy() -> None:
    router, runs = FakeRouter({"http://h1:30000": True, "http://h2:30000": True,
                               "http://h3:30000": False}), Runs()
    with pytest.raises(RouterError, match=r"h3 .* is not healthy"):
        make(router, runs)()
    assert [d for d, _, _ in runs.calls] == ["prepare"] and router.log == []


def test_batches_of_two() -> None:
    router, runs = FakeRouter({u[0]: True for u in URLS.values()}), Runs()
    assert make(router, runs, batch=2)()
    assert [h for _, h, _ in runs.calls] == [["h1", "h2", "h3"], ["h1", "h2"], ["h3"]]


def test_a_failed_preparation_takes_no_host_out() -> None:
    router, runs = FakeRouter({u[0]: True for u in URLS.values()}), Runs(("prepare", "h2"))
    rolled = make(router, runs)
    assert not rolled()
    assert [d for d, _, _ in runs.calls] == ["prepare"] and router.log == []
    assert "h1              not touched: preparing failed" in rolled.report()


def test_bad_input_is_named() -> None:
    with pytest.raises(InputError, match="--data: novalue: not key=value"):
        roll.parse_data(["novalue"])
    with pytest.raises(InputError, match="--batch: must be at least 1"):
        roll.plan("inventories/b200.py", [], 0)
    with pytest.raises(InputError, match="no such inventory file"):
        roll.plan("inventories/nope.py", [], 1)


def test_every_hosts_change_is_checked_before_any_host_is_touched() -> None:
    # In a process of its own: loading an inventory imports pyinfra_cli, which patches the
    # process with gevent.
    result = subprocess.run(["sglang-fleet", "roll", "inventories/b200.py", "--data",
                             "sglang.speculative.num_draft_tokens=7"], cwd=ROOT,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    # every host has the problem: said once, naming them all
    assert "error: pyinfra data of b200-01, b200-02: speculative.num_draft_tokens:" in \
        result.stderr
    assert result.stderr.count("error:") == 1
    assert "fix: set speculative.num_draft_tokens: 4" in result.stderr
    assert "roll:" not in result.stdout and "Traceback" not in result.stderr


class Clock:
    """time.monotonic for the roll: a deploy takes 40 s, a router's health wait 5 s."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


def test_the_table_shows_each_hosts_seconds_out_of_the_router(
        monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    monkeypatch.setattr(roll, "time", SimpleNamespace(monotonic=clock.monotonic,
                                                       strftime=lambda f: "00:00:00"))

    class SlowRouter(FakeRouter):
        def wait_healthy(self, url: str, timeout: float) -> None:
            clock.now += 5
            super().wait_healthy(url, timeout)

    class SlowRuns(Runs):
        def __call__(self, inventory: str, deploy: str, hosts: list[str], data: Any) -> int:
            clock.now += 40
            return super().__call__(inventory, deploy, hosts, data)

    router, runs = SlowRouter({u[0]: True for u in URLS.values()}), SlowRuns(("serve", "h2"))
    rolled = make(router, runs)
    assert not rolled()
    report = rolled.report().splitlines()
    assert report[0].endswith("out of router (s)")
    assert report[1].split()[-1] == "45"  # deploy 40 s + seen healthy 5 s
    assert report[2].split()[-1] == "85"  # failed deploy, restore, then healthy
    assert report[3].split()[-1] == "-"  # never taken out


def test_a_host_the_restore_did_not_bring_back_is_still_out() -> None:
    router = FakeRouter({u[0]: True for u in URLS.values()})
    rolled = make(router, Runs())
    # the preparation passes; the deploy and the restore fail
    rolled.run = lambda inventory, deploy, hosts, data: int(deploy != "prepare")
    assert not rolled()
    assert rolled.outcomes["h1"].still_out and rolled.outcomes["h1"].out_text().endswith("still")
    assert rolled.outcomes["h2"].out_seconds is None
