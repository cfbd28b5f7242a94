"""The InfiniBand (and RoCE) character devices a host has: ``/dev/infiniband/uverbsN`` (the
verbs NCCL's IB transport opens), ``rdma_cm``, ``umadN``, ``issmN``. The server's unit shuts
every device out (``DevicePolicy=closed``) but those it allows: a member of a multi-node group
is allowed these, on hosts that have them.

    host.get_fact(InfinibandDevices)     # ['/dev/infiniband/rdma_cm', '/dev/infiniband/uverbs0']
"""

from __future__ import annotations

import re

from pyinfra.api.facts import FactBase

DIRECTORY = "/dev/infiniband"
# The kernel's names (uverbs0, umad1, issm0, rdma_cm): anything else is not written into a unit.
_NAME = re.compile(r"[a-z][a-z_]{0,15}[0-9]{0,4}")


def parse(lines: list[str]) -> list[str]:
    """The devices' paths, from their names (one a line), sorted; other lines left out."""
    return sorted(f"{DIRECTORY}/{line}" for line in lines if _NAME.fullmatch(line))


class InfinibandDevices(FactBase[list[str]]):
    """The character devices under /dev/infiniband (none: no RDMA adapter, or no driver)."""

    default = list

    def command(self) -> str:
        return f"find {DIRECTORY} -maxdepth 1 -type c -printf '%f\\n' 2>/dev/null || true"

    def process(self, output: list[str]) -> list[str]:
        return parse(output)
