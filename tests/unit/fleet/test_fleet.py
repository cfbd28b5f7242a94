"""Router membership of a multi-node group: its server is one worker, rank 0's URL; a rank >= 1
answers /health (SGLang's dummy health server) and 404 on every API path, so it never is one."""

from __future__ import annotations

from pyinfra.api.inventory import Inventory

from sglang_fleet import hostconfig
from sglang_fleet.config.render import render_all
from sglang_fleet.fleet import inventory as fleet
from sglang_fleet.report import status, status_view
from sglang_fleet.roll import planning
from tests.conftest import FIELD_PROFILE


def inventory() -> Inventory:
    tp16 = {"sglang_group": "tp16", "sglang.parallel.tp": 16, "sglang.parallel.nnodes": 2}
    return Inventory(  # type: ignore[no-untyped-call]
        ([("b200-01", {**tp16, "sglang_address": "10.0.0.11"}),
          ("b200-02", {**tp16, "sglang_address": "10.0.0.12"}),
          ("b200-03", {"sglang.parallel.tp": 8, "sglang_address": "10.0.0.13"})], {}),
        b200=(["b200-01", "b200-02", "b200-03"],
              {"sglang_profile": str(FIELD_PROFILE), "gpu_count": 8}))


def test_the_router_worker_list_excludes_rank_1() -> None:
    inv = inventory()
    assert fleet.all_worker_urls(inv) == ["http://10.0.0.11:30000", "http://10.0.0.13:30000"]
    assert fleet.worker_urls(inv.get_host("b200-02")) == []
    assert fleet.unit_urls(inv.get_host("b200-01")) == {"sglang.service":
                                                        "http://10.0.0.11:30000"}


def test_a_rank_1_rejoins_no_router() -> None:
    host = inventory().get_host("b200-02")
    prof = hostconfig.profile_for(host)
    launches = render_all(prof)
    assert fleet.urls(host, prof, launches) == ["http://10.0.0.12:30000"]  # its dummy server
    assert fleet.routed_urls(host, prof, launches) == []
    assert fleet.routed_unit_urls(host, prof, launches) == {}


def test_batch_instances_counts_only_hosts_that_route() -> None:
    planning._fits(1, {"b200-01": ["http://10.0.0.11:30000"], "b200-02": []})


def test_status_shows_rank_1_as_a_group_member_not_a_worker() -> None:
    inv = inventory()
    [rank0] = status.server_rows(inv.get_host("b200-01"))
    [rank1] = status.server_rows(inv.get_host("b200-02"))
    assert (rank0.kind, rank0.group) == ("server", "group tp16 rank 0 of 2")
    assert (rank1.kind, rank1.group) == ("member", "group tp16 rank 1 of 2: serves through "
                                         "b200-01")
    rank1.health, rank1.state = "ok", "active/running"
    assert status_view.cells(rank1)[-1].startswith("group tp16 rank 1 of 2")
    fleet_rows = status.Fleet([rank0, rank1])
    names = [name for name, _ in fleet_rows.estimate().not_counted] + \
        [s.name for s in fleet_rows.estimate().capacity]
    assert not any(name.startswith("b200-02") for name in names)  # no worker, no capacity
