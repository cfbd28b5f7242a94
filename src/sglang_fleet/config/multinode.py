"""One server over several hosts (``parallel.nnodes`` > 1): what each member renders besides
the profile, and the rules SGLang holds such a launch to.

Every member runs the same command with its own ``--node-rank``; ``--dist-init-addr`` is rank
0's address and ``parallel.dist_port`` on every member: rank 0's first scheduler opens torch's
TCPStore there and every rank (rank 0's own too) connects to it. The rank and rank 0's address
come from the inventory (``hostconfig.groups``), not from the profile:

    launch = render(profile, rank=Rank(1, "10.0.0.11"))
    launch.args["node_rank"], launch.args["dist_init_addr"]     # (1, '10.0.0.11:20000')

The rules are each release's ``check_server_args`` (0.5.10 - 0.5.18 server_args.py,
0.5.19+ arg_groups/validation_hook.py), with the release's own messages.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from sglang_fleet.config import flags, validators
from sglang_fleet.config.profile import Profile
from sglang_fleet.config.releases import at_least
from sglang_fleet.errors import Problem

# The destinations a member's rank renders: set from the group, never from extra_args.
GROUP_DESTS = ("node_rank", "dist_init_addr")
GROUP_KEY = "sglang_group"  # the host-data key that makes a host a member
# 0.5.22 refuses every dp_size > 1 across nodes, after rewriting the deprecated
# --dp-size N --enable-dp-attention into --attn-dp-size N (parallel_hook.py).
DP_REPLICAS_REFUSED_FROM = "0.5.22"
# The ports SGLang derives from --port with DP attention: port + 1 .. port + 13 (the DP
# handshake, data_parallel_controller.py DP_ATTENTION_HANDSHAKE_PORT_DELTA).
DERIVED_PORTS = 13
WARMUP_PORTS = (1000, 1020)  # warmup.PORT_OFFSET and the ports it tries after it


@dataclass(frozen=True)
class Rank:
    """A member's place in its group: its ``--node-rank`` and how every member reaches rank 0
    (an IP address or a host name: host data ``sglang_address``, else ``ssh_hostname``)."""

    node_rank: int
    rank0_address: str

    def dist_init_addr(self, port: int) -> str:
        """``ADDRESS:PORT`` as SGLang's NetworkAddress.parse reads it: ``[fd00::1]:20000``."""
        try:
            v6 = ipaddress.ip_address(self.rank0_address).version == 6
        except ValueError:
            v6 = False
        return f"[{self.rank0_address}]:{port}" if v6 else f"{self.rank0_address}:{port}"


def group_args(profile: Profile, table: flags.FlagTable, rank: Rank | None,
               problems: list[Problem]) -> list[str]:
    """``--node-rank N --dist-init-addr ADDRESS:PORT`` for a member; nothing for one host, or
    without its group (``check`` and ``render``: every member's launch but the rank)."""
    nnodes = profile.parallel.nnodes
    if rank is None or nnodes == 1:
        return []
    source = profile.source_of("parallel.nnodes")
    wrong = validators.host_problem(rank.rank0_address)
    if wrong or not 0 <= rank.node_rank < nnodes:
        problems.append(Problem(source, GROUP_KEY, f"rank {rank.node_rank} of {nnodes} at "
                                f"{rank.rank0_address!r}: {wrong or 'no such rank'}",
                                "give the group's hosts addresses (sglang_address) and list "
                                "exactly parallel.nnodes of them"))
        return []
    args = []
    for dest, value in (("node_rank", str(rank.node_rank)),
                        ("dist_init_addr", rank.dist_init_addr(profile.parallel.dist_port))):
        option = table.option_for(dest)
        if option is None:  # every supported release has both (flag tables)
            problems.append(Problem(source, "parallel.nnodes",
                                    f"SGLang {table.version} has no flag for {dest}",
                                    "pin a release that runs multi-node servers"))
            continue
        args += [option, value]
    return args


def _problem(profile: Profile, key: str, message: str, fix: str) -> Problem:
    return Problem(profile.source_of(key), key, message, fix)


def _size(args: dict[str, Any], *dests: str) -> int:
    return next((int(args[d]) for d in dests if args.get(d) is not None), 1)


def rules(profile: Profile, version: str, args: dict[str, Any]) -> Iterator[Problem]:
    """What the release's ``check_server_args`` refuses in a launch over several hosts, with
    its message: tp x pp divisible by nnodes (unless ``--ep-join-mode scale``, 0.5.16+), and
    dp > 1 across nodes (only with DP attention to 0.5.21; refused from 0.5.22, where the
    deprecated ``--dp-size N --enable-dp-attention`` is rewritten to ``--attn-dp-size N``)."""
    nnodes = int(args.get("nnodes") or 1)
    if nnodes == 1:
        return
    tp, pp = _size(args, "tp_size", "tensor_parallel_size"), \
        _size(args, "pp_size", "pipeline_parallel_size")
    if args.get("ep_join_mode") != "scale" and (tp * pp) % nnodes:
        yield _problem(profile, "parallel.tp", "tp_size must be divisible by number of nodes",
                       f"set parallel.tp to a multiple of parallel.nnodes {nnodes}")
    dp = _size(args, "dp_size", "data_parallel_size")
    if dp > 1:
        if at_least(version, DP_REPLICAS_REFUSED_FROM):
            rewritten = args.get("enable_dp_attention") and (args.get("attn_dp_size") or 1) == 1
            if not rewritten:
                yield _problem(profile, "parallel.dp", "multi-node data-parallel replicas are "
                               "not supported; use attention DP (--attn-dp-size) across nodes",
                               "set parallel.dp: 1 (attention DP across the hosts: extra_args "
                               "['--attn-dp-size', 'N'])")
        elif not args.get("enable_dp_attention"):
            yield _problem(profile, "parallel.dp",
                           "multi-node data parallel is not supported unless dp attention!",
                           "set parallel.dp: 1, or add --enable-dp-attention to extra_args")


def product_rules(profile: Profile) -> Iterator[Problem]:
    """What the product itself needs of a server over several hosts: one server per member
    (one unit, one rank), and a rendezvous port no other port of the product's takes."""
    par = profile.parallel
    if par.nnodes == 1:
        return
    if isinstance(par.instances, int) and par.instances > 1:
        yield _problem(profile, "parallel.instances",
                       f"{par.instances} servers per host with parallel.nnodes {par.nnodes}: a "
                       "host serves one rank of one multi-node server",
                       "set parallel.instances: 1 (or auto)")
    port, servers = profile.server.port, par.instances if isinstance(par.instances, int) else 1
    taken = {"server.port (the servers and SGLang's DP-attention ports)":
             range(port, port + servers + DERIVED_PORTS),
             "server.port + 1000 (the warm-up's)":
             range(port + WARMUP_PORTS[0], port + WARMUP_PORTS[1] + servers)}
    for what, ports in taken.items():
        if par.dist_port in ports:
            yield _problem(profile, "parallel.dist_port",
                           f"{par.dist_port} is one of the ports of {what}: {ports.start} - "
                           f"{ports.stop - 1}", "set parallel.dist_port outside them")


def gpu_problems(profile: Profile, host_name: str, gpu_count: int | None) -> list[Problem]:
    """Enough GPUs for the host's servers: tp x dp each, over ``nnodes`` hosts a share."""
    par = profile.parallel
    need = par.servers * par.gpus_per_instance
    if gpu_count is None or need <= gpu_count:
        return []
    each = f"tp x dp = {par.tp * par.dp}" if par.nnodes == 1 else \
        f"tp x dp / nnodes = {par.tp * par.dp} / {par.nnodes} = {par.gpus_per_instance}"
    return [_problem(profile, "parallel.instances", f"{par.servers} instance(s) of {each} GPUs "
                     f"need {need}, {host_name} has {gpu_count}",
                     "lower parallel.instances (or set it to auto), tp or dp"
                     + (", or raise parallel.nnodes" if par.nnodes > 1 else ""))]


# What a member may set for itself: its rank, and the address its own HTTP server (rank 0's
# API, a rank >= 1's dummy health server) listens on, which SGLang never shares between nodes.
OWN_FLAGS = ("--node-rank", "--host")


def same_launch(argvs: dict[str, tuple[str, ...]], rank0: str) -> list[Problem]:
    """Every member's argv (by host, rank order) is rank 0's but its ``OWN_FLAGS``."""
    def masked(argv: tuple[str, ...]) -> list[str]:
        words = list(argv)
        for flag in OWN_FLAGS:
            if flag in words:
                i = words.index(flag)
                del words[i:i + 2]
        return words

    first = masked(argvs[rank0])
    problems = []
    for name, argv in argvs.items():
        mine = masked(argv)
        if mine != first:
            differs = next((a, b) for a, b in zip([*mine, "(none)"], [*first, "(none)"],
                                                  strict=False) if a != b)
            problems.append(Problem(f"pyinfra data of {name}", GROUP_KEY,
                                    f"{name} renders another launch than {rank0} (rank 0): "
                                    f"{differs[0]!r} where {rank0} has {differs[1]!r}",
                                    "give every member of the group the same profile, "
                                    "overrides and release"))
    return problems
