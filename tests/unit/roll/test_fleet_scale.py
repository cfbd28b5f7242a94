"""Rolls at fleet scale, over an inventory of 120 hosts (two of them multi-node groups of two)
with a fake run launcher and router: batches as a percentage, the max-unavailable budget that
counts hosts already unhealthy, a preparation that skips the hosts it may and reports them, and
a stopped roll resumed from its journal."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from pyinfra.api.inventory import Inventory

from sglang_fleet.errors import InputError
from sglang_fleet.fleet import cutover
from sglang_fleet.fleet import inventory as fleet
from sglang_fleet.fleet.router_api import RouterError
from sglang_fleet.roll import command, planning, runs, scale
from sglang_fleet.roll.roll import Roll
from tests.conftest import FIELD_PROFILE
from tests.unit.roll.test_roll import FakeRouter, Runs

NAMES = [f"b{i:03}" for i in range(1, 121)]
GROUPS = {"b001": "tp16-a", "b002": "tp16-a", "b003": "tp16-b", "b004": "tp16-b"}
RANK1 = ("b002", "b004")  # no URL of their own: they serve through b001 and b003


def url(name: str) -> str:
    return f"http://10.0.1.{int(name[1:])}:30000"


def inventory() -> Inventory:
    hosts = []
    for name in NAMES:
        data: dict[str, Any] = {"sglang_address": url(name)[7:].split(":")[0],
                                "sglang.parallel.tp": 8}  # one server a host
        if name in GROUPS:
            data |= {"sglang_group": GROUPS[name], "sglang.parallel.tp": 16,
                     "sglang.parallel.nnodes": 2, "sglang_allowed_clients": ["10.0.0.0/8"]}
        hosts.append((name, data))
    return Inventory(  # type: ignore[no-untyped-call]
        (hosts, {}), b200=(NAMES, {"sglang_profile": str(FIELD_PROFILE), "gpu_count": 8}))


@pytest.fixture
def router(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> FakeRouter:
    """Every server healthy in one router; drains end at once; journals under ``tmp_path``."""
    fake = FakeRouter({url(n): True for n in NAMES if n not in RANK1})
    monkeypatch.setattr(planning, "load", lambda path, data: inventory())
    monkeypatch.setattr(fleet, "routers", lambda inv: [
        SimpleNamespace(url=fake.url, api=lambda: fake)])
    monkeypatch.setattr(cutover, "drained", lambda u, timeout: (True, 0))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    return fake


def rolling(runs: Runs, down: set[str] = frozenset(),  # type: ignore[assignment]
            **options: Any) -> Roll:
    """The roll ``sglang-fleet roll inv.py OPTIONS`` makes, its runs and SSH probe faked."""
    made = command.make("inv.py", ["sglang.memory.page_size=64"], **options)
    made.run = runs
    made.reach = lambda hosts: {h.name: f"SSH to {h.name} failed: timed out" for h in hosts
                                if h.name in down}
    return made


def served(runs: Runs) -> list[str]:
    """The hosts the roll's serve runs converged, in order."""
    return [h for deploy, hosts, _ in runs.calls if deploy == "serve" for h in hosts]


def test_a_percentage_batch_counts_units_and_keeps_groups_whole(router: FakeRouter) -> None:
    found = planning.plan("inv.py", [], "10%")
    batches = [[h.name for h in b] for b in found.batches]
    # 118 units (two groups of two, 116 hosts alone): 10% is 12 units a batch, 10 batches
    assert len(batches) == 10 and [len(b) for b in batches] == [14] + [12] * 8 + [10]
    assert batches[0][:4] == ["b001", "b002", "b003", "b004"]
    assert [n for b in batches for n in b] == NAMES
    assert len(planning.plan("inv.py", [], "1%").batches) == 59  # 2 units a batch
    assert len(planning.plan("inv.py", [], "100%").batches) == 1
    with pytest.raises(InputError, match=r"--max-unavailable: 5% allows 6 hosts out at once, "
                       r"fewer than a batch \(14 hosts\)"):
        command.make("inv.py", [], batch="10%", max_unavailable="5%")


def test_the_budget_counts_hosts_already_unhealthy_and_the_roll_resumes(
        router: FakeRouter, capsys: pytest.CaptureFixture[str]) -> None:
    for name in ("b100", "b101", "b102"):  # unhealthy before the roll: 3 of the budget
        router.known[url(name)] = False
    third_back = url("b038")  # the last host of the third batch (14 + 12 + 12 hosts)
    added = router.add

    def add(u: str) -> bool:  # four more fail once the third batch is back: 3 + 4 + 12 > 18
        if u == third_back:
            for name in ("b060", "b061", "b062", "b063"):
                router.known[url(name)] = False
        return added(u)

    router.add = add  # type: ignore[method-assign,assignment]
    runs = Runs()
    made = rolling(runs, batch="10%", max_unavailable="15%")  # 18 hosts
    with pytest.raises(RouterError, match=r"b060 \(http://10.0.1.60:30000 is not healthy in "
                       r"http://router:30080\); .* and 2 more: taking b039, .* out too would "
                       r"make 19 hosts unavailable, more than --max-unavailable 18"):
        made()
    out = capsys.readouterr().out
    assert "already out of service: b100 (" in out and "with b001, b002" in out  # 17 of 18
    assert served(runs)[:38] == NAMES[:38]  # three batches converged
    assert not any(op == "remove" and u == url("b039") for op, u in router.log)
    journal = scale.Journal.of("inv.py", ["sglang.memory.page_size=64"])
    assert json.loads(journal.path.read_text())["ended"].startswith("stopped: b060 (")
    assert journal.load().done == NAMES[:38]

    # fixed: the roll resumes at the fourth batch, the three before it not rolled again
    for u in router.known:
        router.known[u] = True
    router.add = added  # type: ignore[method-assign]
    again = Runs()
    resumed = rolling(again, batch="10%", max_unavailable="15%", resume=True)
    assert resumed()
    assert served(again) == NAMES[38:]
    assert [h for d, hs, _ in again.calls if d == "prepare" for h in hs] == NAMES[50:]
    assert "b001            converged by the roll it resumes" in resumed.report()
    assert "b120            converged" in resumed.report()
    with pytest.raises(InputError, match="the last roll of this inventory and --data "
                       "completed: nothing to resume"):
        rolling(Runs(), batch="10%", resume=True)
    with pytest.raises(InputError, match=r"no stopped roll of .*inv\.py with --data "
                       r"sglang\.memory\.page_size=128 to resume"):
        command.make("inv.py", ["sglang.memory.page_size=128"], resume=True)


def test_a_tolerant_preparation_skips_failed_hosts_and_reports_them(
        router: FakeRouter, capsys: pytest.CaptureFixture[str]) -> None:
    # b093 does not answer (nor serves); b002's preparation fails, so its group (b001, b002) is
    # skipped. The default budget lets the batches leave beside the hosts the roll skipped.
    router.known[url("b093")] = False
    runs = Runs(failing={("prepare", "b002")})
    made = rolling(runs, {"b093"}, batch="10%", tolerate="3%")  # 3 hosts
    assert not made()  # every other host converged, but not every host
    skipped = {"b093": "SSH to b093 failed: timed out",
               "b001": "b002 of its group: its preparation failed (its output above)",
               "b002": "its preparation failed (its output above)"}
    assert made.skipped == skipped
    assert served(runs) == [n for n in NAMES if n not in skipped]
    assert [url("b001"), url("b093")] == [u for u in (url("b001"), url("b093"))
                                          if ("remove", u) not in router.log]
    report = made.report()
    assert "b093            skipped: unreachable" in report
    assert "b001            skipped: preparing failed" in report
    out = capsys.readouterr().out
    assert "host 93 of 120 b093: skipped, serving as it did (SSH to b093" in out
    assert "already out of service: b093 (http://10.0.1.93:30000 is not healthy" in out

    # once they answer and prepare, --resume rolls exactly them, group first
    again = Runs()
    resumed = rolling(again, batch="10%", tolerate="3%", resume=True)
    assert resumed()
    assert served(again) == ["b001", "b002", "b093"]
    assert scale.Journal.of("inv.py", ["sglang.memory.page_size=64"]).path.exists()


def test_more_failed_preparations_than_tolerated_stop_before_any_host_leaves(
        router: FakeRouter, capsys: pytest.CaptureFixture[str]) -> None:
    runs = Runs(failing={("prepare", "b002")})
    made = rolling(runs, {"b093"}, batch="10%", tolerate="2%")  # 2 hosts: 3 failed
    assert not made()
    assert router.log == [] and served(runs) == []
    report = made.report()
    assert "b120            not touched: preparing failed" in report
    assert "b093            skipped: unreachable" in report  # within the tolerance alone
    assert made.cause() == "host 2 of 120 b002: its preparation failed (its output above)"
    assert "preparing failed (more hosts to skip than --tolerate 2): no host was taken out" \
        in capsys.readouterr().out


def test_the_resume_command_repeats_the_options_quoted(router: FakeRouter) -> None:
    made = command.make("inv.py", ["sglang.model.served_name=a b;c"], batch="10%")
    assert command.resume_hint(made, {"batch": "10%", "tolerate": "3%", "drain_timeout": 900.0,
                                      "health_timeout": 300, "parallel": None}) == (
        "sglang-fleet roll inv.py --data 'sglang.model.served_name=a b;c' --batch 10% "
        "--tolerate 3% --drain-timeout 900 --resume")


def test_budgets_round_down_and_batches_up() -> None:
    assert scale.amount("--batch", "12%", 101) == 13
    assert scale.amount("--max-unavailable", "12%", 101, up=False) == 12
    assert scale.amount("--max-unavailable", "1%", 20, up=False) == 1  # never none
    assert scale.amount("--tolerate", "2%", 40, 0, up=False) == 0
    for bad in ("0", "0%", "101%", "ten", "-1"):
        with pytest.raises(InputError, match="--batch"):
            scale.amount("--batch", bad, 120)


def test_a_journal_that_cannot_be_written_stops_the_roll_before_it_starts(
        router: FakeRouter, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "file"))
    with pytest.raises(InputError, match=r"file/sglang-fleet/rolls/inv-\w+\.json: cannot "
                       r"write the roll's journal: Not a directory\n.*fix: set XDG_STATE_HOME"):
        command.make("inv.py", [])


def test_a_batch_runs_all_its_hosts_at_once_and_only_a_tolerant_preparation_goes_on(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A batch's hosts wait for their turn together, each holding one of pyinfra's places: a
    run with fewer places than hosts would never let the last ones say they wait."""
    argvs: list[list[str]] = []
    monkeypatch.setattr(runs, "PyinfraRun", lambda argv, env: argvs.append(argv))
    batch = [f"b{i:03}" for i in range(1, 51)]
    runs.pyinfra("inv.py", "serve", batch, [], {}, parallel=10)
    runs.pyinfra("inv.py", "restore", batch[:2], [], {})
    runs.pyinfra("inv.py", "prepare", NAMES, [], {}, parallel=10, tolerant=True)
    runs.pyinfra("inv.py", "prepare", NAMES, [], {})
    options = [[a for a in argv if a.startswith("--") and not a.startswith("--limit")]
               for argv in argvs]
    assert options == [["--fail-percent", "--parallel=50"], ["--fail-percent", "--parallel=2"],
                       ["--parallel=10"], ["--fail-percent"]]
