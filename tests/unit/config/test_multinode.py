"""A server over several hosts: the flags a member renders, the GPUs each host needs, and the
releases' own rules for such a launch."""

from __future__ import annotations

from typing import Any

import pytest

from sglang_fleet.config import flags, multinode, preflight, profile, releases
from sglang_fleet.config.multinode import Rank
from sglang_fleet.config.render import render, render_all
from sglang_fleet.errors import InputError
from tests.conftest import field_profile

QWEN = "Qwen3_5ForConditionalGeneration"


def tp16(extra: dict[str, Any] | None = None, gpus: int = 8) -> profile.Profile:
    return field_profile({"parallel.tp": 16, "parallel.nnodes": 2, **(extra or {})}, gpus)


def test_tp16_on_two_8_gpu_hosts_is_accepted() -> None:
    p = tp16()
    assert p.parallel.servers == 1 and p.parallel.gpus_per_instance == 8
    preflight.require_host(p, render_all(p, rank=Rank(1, "10.0.0.11")), "b200-02", 8)


def test_each_member_needs_its_share_and_one_host_still_needs_all() -> None:
    with pytest.raises(InputError, match=r"tp x dp / nnodes = 16 / 2 = 8 GPUs need 8, b200-02 "
                       r"has 4"):
        p = tp16({"parallel.instances": 1})
        preflight.require_host(p, render_all(p), "b200-02", 4)
    single = field_profile({"parallel.tp": 16, "parallel.instances": 1})
    with pytest.raises(InputError, match=r"1 instance\(s\) of tp x dp = 16 GPUs need 16, b1 "
                       r"has 8"):
        preflight.require_host(single, render_all(single), "b1", 8)


def test_auto_instances_of_a_member_is_one_server() -> None:
    p = field_profile({"parallel.tp": 8, "parallel.nnodes": 2})  # 4 GPUs of 8: still one rank
    assert p.parallel.servers == 1
    with pytest.raises(InputError, match=r"fewer than one server's tp x dp / nnodes 2 = 8"):
        field_profile({"parallel.tp": 16, "parallel.nnodes": 2}, gpus=4)


@pytest.mark.parametrize("version", ["0.5.10", "0.5.12", "0.5.18", "0.5.23"])
def test_a_member_renders_rank_and_rendezvous_the_release_parses(version: str) -> None:
    launch = render(tp16({"parallel.dist_timeout": 900}), version, rank=Rank(1, "10.0.0.11"))
    assert launch.args["nnodes"] == 2 and launch.args["node_rank"] == 1
    assert launch.args["dist_init_addr"] == "10.0.0.11:20000"
    assert launch.args["dist_timeout"] == 900
    assert flags.load(version).parse(list(launch.argv[3:]))["node_rank"] == 1
    assert launch.rank == Rank(1, "10.0.0.11")  # a sized restart renders it again with it


def test_without_its_group_a_multinode_launch_has_no_rank() -> None:
    """``check`` and ``render`` (no inventory): every member's launch but the rank."""
    launch = render(tp16())
    assert "--node-rank" not in launch.argv and "--dist-init-addr" not in launch.argv
    assert "--nnodes" in launch.argv


def test_an_ipv6_rank0_is_bracketed_and_a_port_is_the_profiles() -> None:
    launch = render(tp16({"parallel.dist_port": 21000}), rank=Rank(0, "fd00::11"))
    assert launch.args["dist_init_addr"] == "[fd00::11]:21000"


@pytest.mark.parametrize("word", ["--node-rank", "--dist-init-addr", "--nccl-init-addr"])
def test_extra_args_cannot_set_what_the_group_sets(word: str) -> None:
    with pytest.raises(InputError, match=rf"extra_args: {word} is set by the inventory \(its "
                       r"key sglang_group\)"):
        render(tp16({"extra_args": [word, "1"]}))


@pytest.mark.parametrize(("rank", "why"), [(Rank(2, "10.0.0.11"), "no such rank"),
                                           (Rank(0, "a b"), "host"),
                                           (Rank(0, "$(id)"), "host")])
def test_a_rank_out_of_place_is_refused(rank: Rank, why: str) -> None:
    with pytest.raises(InputError, match=rf"sglang_group: rank {rank.node_rank} of 2 .*{why}"):
        render(tp16(), rank=rank)


def rules(version: str, overrides: dict[str, Any]) -> list[str]:
    p = field_profile({"parallel.nnodes": 2, **overrides})
    return [x.message for x in preflight.check(p, render(p, version), QWEN)]


@pytest.mark.parametrize("version", ["0.5.10", "0.5.12", "0.5.21", "0.5.22", "0.5.23"])
def test_tp_must_divide_by_nnodes(version: str) -> None:
    assert rules(version, {"parallel.tp": 3, "parallel.instances": 1}) == \
        ["tp_size must be divisible by number of nodes"]
    assert rules(version, {"parallel.tp": 16}) == []


def test_dp_across_nodes_needs_dp_attention_until_0_5_21() -> None:
    dp = {"parallel.tp": 8, "parallel.dp": 2}
    attention = {**dp, "extra_args": ["--enable-dp-attention"]}
    assert rules("0.5.12", dp) == ["multi-node data parallel is not supported unless dp "
                                   "attention!"]
    assert rules("0.5.12", attention) == []
    assert rules("0.5.21", attention) == []


@pytest.mark.parametrize("version", ["0.5.22", "0.5.23"])
def test_dp_replicas_across_nodes_are_refused_from_0_5_22(version: str) -> None:
    refused = ["multi-node data-parallel replicas are not supported; use attention DP "
               "(--attn-dp-size) across nodes"]
    assert rules(version, {"parallel.tp": 8, "parallel.dp": 2}) == refused
    assert rules(version, {"parallel.tp": 8, "parallel.dp": 2,
                           "extra_args": ["--attn-dp-size", "2"]}) == refused
    assert rules(version, {"parallel.tp": 8, "extra_args": ["--attn-dp-size", "2"]}) == []


def test_the_deprecated_dp_attention_spelling_is_rewritten_first_from_0_5_22() -> None:
    """SGLang turns --dp-size N --enable-dp-attention into --attn-dp-size N before the rule
    (extra_args refuses the deprecated flag itself: rules() alone shows the rewrite)."""
    p = field_profile({"parallel.nnodes": 2, "parallel.tp": 8, "parallel.dp": 2})
    args = {"nnodes": 2, "tp_size": 8, "dp_size": 2, "enable_dp_attention": True,
            "attn_dp_size": 1}
    assert list(multinode.rules(p, "0.5.22", args)) == []
    assert [x.message for x in multinode.rules(p, "0.5.22", {**args, "attn_dp_size": 2})] == \
        ["multi-node data-parallel replicas are not supported; use attention DP "
         "(--attn-dp-size) across nodes"]
    assert list(multinode.rules(p, "0.5.16", {**args, "tp_size": 3, "ep_join_mode": "scale",
                                               "dp_size": 1})) == []


def test_a_member_runs_one_server_on_a_port_of_its_own() -> None:
    assert rules(releases.pinned(), {"parallel.tp": 8, "parallel.instances": 2}) == [
        "2 servers per host with parallel.nnodes 2: a host serves one rank of one multi-node "
        "server"]
    clash = rules(releases.pinned(), {"parallel.tp": 16, "parallel.dist_port": 30005})
    assert clash == ["30005 is one of the ports of server.port (the servers and SGLang's "
                     "DP-attention ports): 30000 - 30013"]
    assert rules(releases.pinned(), {"parallel.tp": 16, "parallel.dist_port": 31000})[0] \
        .startswith("31000 is one of the ports of server.port + 1000 (the warm-up's)")


def test_dist_port_stays_below_the_ephemeral_range() -> None:
    with pytest.raises(InputError, match=r"parallel.dist_port: port 40000 is in Linux's "
                       r"ephemeral range"):
        tp16({"parallel.dist_port": 40000})
    with pytest.raises(InputError, match=r"parallel.dist_timeout"):
        tp16({"parallel.dist_timeout": 0})


def test_same_launch_names_the_member_that_differs() -> None:
    a = render(tp16(), rank=Rank(0, "10.0.0.11")).argv
    b = render(tp16(), rank=Rank(1, "10.0.0.11")).argv
    c = render(tp16({"memory.context_length": 8192}), rank=Rank(1, "10.0.0.11")).argv
    assert multinode.same_launch({"h1": a, "h2": b}, "h1") == []
    own = render(tp16({"server.host": "10.0.0.12"}), rank=Rank(1, "10.0.0.11")).argv
    assert multinode.same_launch({"h1": a, "h2": own}, "h1") == []  # its own listen address
    [problem] = multinode.same_launch({"h1": a, "h2": b, "h3": c}, "h1")
    assert problem.source == "pyinfra data of h3"
    assert "h3 renders another launch than h1 (rank 0): '8192' where h1 has '262144'" in \
        problem.message
