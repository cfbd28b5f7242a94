"""Rolls and teardowns of multi-node groups: a group is one unit of a batch (never split, counted
once by ``--batch``), it leaves the routers (rank 0's URL) at the first disruptive command of
any member, a failed group is restored whole, and a ``--limit`` that takes part of a group is
refused naming the group and its members."""

from __future__ import annotations

import os
from types import SimpleNamespace
from typing import Any, cast

import pytest
from pyinfra.api.inventory import Inventory

from sglang_fleet import converge
from sglang_fleet.errors import InputError
from sglang_fleet.fleet import cutover, roll_directory
from sglang_fleet.fleet import inventory as fleet
from sglang_fleet.fleet.roll_directory import RollDirectory
from sglang_fleet.hostconfig import groups
from sglang_fleet.roll import planning, roll
from tests.conftest import FIELD_PROFILE
from tests.unit.roll.test_roll import FakeRouter, Runs, answering

TP16 = {"sglang_group": "tp16", "sglang.parallel.tp": 16, "sglang.parallel.nnodes": 2,
        "sglang_allowed_clients": ["10.0.0.0/8"]}  # a group needs one
RANK0_URL = "http://10.0.0.11:30000"


def inventory() -> Inventory:
    """A group split in the inventory (its rank 1 after a host of its own), and two single
    hosts."""
    return Inventory(  # type: ignore[no-untyped-call]
        ([("b200-01", {**TP16, "sglang_address": "10.0.0.11"}),
          ("b200-03", {"sglang.parallel.tp": 8, "sglang_address": "10.0.0.13"}),
          ("b200-02", {**TP16, "sglang_address": "10.0.0.12"}),
          ("b200-04", {"sglang.parallel.tp": 8, "sglang_address": "10.0.0.14"})], {}),
        b200=(["b200-01", "b200-03", "b200-02", "b200-04"],
              {"sglang_profile": str(FIELD_PROFILE), "gpu_count": 8}))


@pytest.fixture
def planned(monkeypatch: pytest.MonkeyPatch) -> None:
    """plan() on the inventory above, with one router (nothing reached)."""
    monkeypatch.setattr(planning, "load", lambda path, data: inventory())
    router = SimpleNamespace(url="http://10.0.0.9:30080", api=lambda: FakeRouter({}))
    monkeypatch.setattr(fleet, "routers", lambda inv: [router])


def names(found: planning.Plan) -> list[list[str]]:
    return [[h.name for h in batch] for batch in found.batches]


def test_batches_keep_a_group_whole_and_count_it_once(planned: None) -> None:
    found = planning.plan("inv.py", [], batch=1)
    assert names(found) == [["b200-01", "b200-02"], ["b200-03"], ["b200-04"]]
    assert names(planning.plan("inv.py", [], batch=2)) == [["b200-01", "b200-02", "b200-03"],
                                                           ["b200-04"]]
    # a member leaves the routers with its rank 0's URL; only rank 0's goes back
    assert found.units["b200-02"] == {"sglang.service": [RANK0_URL]}
    assert found.after["b200-02"] == [] and found.after["b200-01"] == [RANK0_URL]


def test_a_members_first_disruption_takes_the_group_out(monkeypatch: pytest.MonkeyPatch) -> None:
    router = FakeRouter({RANK0_URL: True, "http://10.0.0.13:30000": True})
    monkeypatch.setattr(fleet, "routers", lambda inv: [SimpleNamespace(api=lambda: router)])
    monkeypatch.setattr(cutover, "drained", lambda url, timeout: (True, 0))
    roll_dir = RollDirectory.create()
    try:
        roll_dir.plan({"b200-01": [RANK0_URL], "b200-02": []}, drain_timeout=1,
                      units={"b200-01": {"sglang.service": [RANK0_URL]},
                             "b200-02": {"sglang.service": [RANK0_URL]}})
        roll_dir.give("turn", ["b200-01", "b200-02"])
        roll_dir.give("go", ["b200-01", "b200-02"])
        monkeypatch.setenv(roll_directory.ENV, str(roll_dir.directory))
        assert cutover._leave(SimpleNamespace(inventory=None),
                              SimpleNamespace(name="b200-02", print_prefix=""))
        assert router.log == [("remove", RANK0_URL)]  # rank 1 disrupted first: the group left
        assert cutover._leave(SimpleNamespace(inventory=None),
                              SimpleNamespace(name="b200-01", print_prefix=""))
        # rank 0's own leave finds its URL out already; the other host stayed
        assert set(router.log) == {("remove", RANK0_URL)}
        assert list(router.known) == ["http://10.0.0.13:30000"]
    finally:
        roll_dir.close()


def test_a_failed_group_is_restored_whole_and_rank0_goes_back(
        monkeypatch: pytest.MonkeyPatch) -> None:
    router = FakeRouter({RANK0_URL: True, "http://h3:30000": True})
    monkeypatch.setattr(fleet, "routers", lambda inv: [SimpleNamespace(api=lambda: router)])
    monkeypatch.setattr(cutover, "drained", lambda url, timeout: (True, 0))
    hosts = [cast(Any, SimpleNamespace(name=n)) for n in ("b200-01", "b200-02", "h3")]
    urls = {"b200-01": [RANK0_URL], "b200-02": [], "h3": ["http://h3:30000"]}
    plan = planning.Plan(inventory="inv.py", data=[], batches=[hosts[:2], hosts[2:]],
                         before=dict(urls), after=dict(urls), routers=[cast(Any, router)],
                         units={"b200-02": {"sglang.service": [RANK0_URL]}})
    runs = Runs(("serve", "b200-02"))
    rolled = roll.Roll(plan, drain_timeout=1, health_timeout=1, run=runs, reach=answering)
    assert not rolled()
    assert [(d, h) for d, h, _ in runs.calls] == [
        ("serve", ["b200-01", "b200-02"]), ("prepare", ["h3"]), ("serve", ["h3"]),
        ("restore", ["b200-01", "b200-02"])]
    assert router.log.count(("add", RANK0_URL)) == 1 and router.known[RANK0_URL]
    assert ("remove", "http://h3:30000") not in router.log
    assert roll_directory.ENV not in os.environ


def test_a_limit_that_takes_part_of_a_group_is_refused_naming_it() -> None:
    inv = inventory()
    [problem] = groups.partial_groups(["b200-02", "b200-03"], inv,
                                      "--limit of deploys/teardown.py")
    assert (problem.source, problem.key) == ("--limit of deploys/teardown.py", "sglang_group")
    assert problem.message == ("it takes part of group 'tp16' (members, rank 0 first: b200-01, "
                               "b200-02): b200-01 left out")
    assert problem.fix == "take every member of the group (b200-01,b200-02) or none of them"
    assert groups.partial_groups(["b200-01", "b200-02"], inv, "x") == []
    assert groups.partial_groups(["b200-03"], inv, "x") == []


def test_a_deploy_limited_to_part_of_a_group_stops_before_any_change(
        monkeypatch: pytest.MonkeyPatch) -> None:
    inv = inventory()
    monkeypatch.setattr(converge, "host", inv.get_host("b200-01"))
    monkeypatch.setattr(converge, "state", SimpleNamespace(limit_hosts=[inv.get_host("b200-01")]))
    with pytest.raises(InputError, match=r"--limit of deploys/teardown.py: sglang_group: it "
                       r"takes part of group 'tp16' .*: b200-02 left out"):
        converge.whole_group("deploys/teardown.py")
    monkeypatch.setattr(converge, "state", SimpleNamespace(limit_hosts=None))  # no --limit
    converge.whole_group("deploys/teardown.py")
    monkeypatch.setattr(converge, "host", inv.get_host("b200-03"))
    monkeypatch.setattr(converge, "state", SimpleNamespace(limit_hosts=[inv.get_host("b200-03")]))
    converge.whole_group("deploys/teardown.py")  # a host of its own


def test_units_of_follow_rank0s_place() -> None:
    assert [[h.name for h in u] for u in groups.units_of(inventory())] == [
        ["b200-01", "b200-02"], ["b200-03"], ["b200-04"]]
