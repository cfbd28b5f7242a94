"""What the unit of a multi-node group's member holds besides a server's: its group's members
in the IP allow-list, the host's InfiniBand devices in the device allow-list.

    files.template(..., **group_unit(launch, allowed_clients()))
"""

from __future__ import annotations

from pyinfra.context import host

from sglang_fleet.config.exposure import spans_hosts
from sglang_fleet.config.render import Launch
from sglang_fleet.facts.infiniband import InfinibandDevices
from sglang_fleet.hostconfig import groups


def group_unit(launch: Launch, allowed_clients: list[str]) -> dict[str, list[str]]:
    """The template's ``group_peers`` and ``infiniband``: empty for a server on one host.

    The peers: every member's address, when the unit has an allow-list at all: the
    rendezvous, NCCL's bootstrap and gloo's sockets run between all members, each way, and
    systemd's filter drops any packet to or from an address it does not list (rank 0's own
    too). The devices: ``DevicePolicy=closed`` shuts out /dev/infiniband/*, which NCCL's IB
    transport opens.
    """
    if not spans_hosts(launch):
        return {"group_peers": [], "infiniband": []}
    devices: list[str] = host.get_fact(InfinibandDevices)
    return {"group_peers": groups.peer_networks(host) if allowed_clients else [],
            "infiniband": devices or []}
