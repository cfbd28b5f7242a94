"""The lab's hosts paired in order into multi-node servers: the shipped profile at tp 16 over
each pair (``parallel.nnodes`` 2), 8 GPUs each (``sglang-fleet lab up --hosts 4 --gpus 8``).

    pyinfra -y inventories/lab_multinode.py deploys/sglang.py
    sglang-fleet roll inventories/lab_multinode.py

lab1 and lab2 are the group ``lab-tp16``, lab3 and lab4 the group ``lab-tp16-b`` (a further
pair would be ``lab-tp16-c``, and so on): in each, inventory order is rank order, and rank 0
(lab1, lab3) is the rendezvous and the routers' only worker of its group. Each group has a
rendezvous port of its own, as the lab's hosts share one network. An odd last host (``lab up
--hosts 3``: lab3) serves on its own beside the group, one server. Either way the router has a
second worker, so that a roll of one group keeps the fleet serving.

The hosts are in the group ``lab`` (the list's name), so ``group_data/lab.py`` is theirs as
it is ``inventories/lab.py``'s: the overrides below are ``sglang.KEY`` host data, which the
product merges key by key with that file's ``sglang_overrides`` (the lab's engine, launcher and
model source stay). Each host is reached as ``inventories/lab.py`` reaches it.
"""

import runpy
from pathlib import Path

# The lab's hosts and how to reach them, from the lab's own inventory (one place for both).
_lab_hosts = runpy.run_path(str(Path(__file__).with_name("lab.py")))["lab_hosts"]

# One server over two hosts.
_tp16 = {
    "sglang.parallel.tp": 16,
    "sglang.parallel.nnodes": 2,
    # The rendezvous waits this long for a missing rank (torch's 10 minutes otherwise): a
    # member that never starts fails the group's start within a minute, not ten.
    "sglang.parallel.dist_timeout": 60,
    # A group needs an allow-list: its members are let in by address, per port. The units let
    # loopback in, and the lab's hosts reach one another from it: they share one network.
    "sglang_allowed_clients": ["10.20.0.0/16"],
}
# One server is enough beside the groups (instances: auto would run eight on the lab's 8 GPUs).
_alone = {"sglang.parallel.instances": 1}


def _pair(k: int) -> dict[str, object]:
    """The k-th pair's data (k from 0): group lab-tp16, then lab-tp16-b, lab-tp16-c, ...; each
    with a rendezvous port of its own (20000, 20001, ...): torch's store listens on every
    address of its host, and the lab's hosts share this machine's network, so a second rank 0
    on port 20000 could not listen (Address already in use). Hosts of their own need none."""
    return {"sglang_group": "lab-tp16" + ("" if k == 0 else f"-{chr(ord('a') + k)}"),
            **_tp16, "sglang.parallel.dist_port": 20000 + k}


_paired = len(_lab_hosts) // 2 * 2  # the hosts before it are in pairs; an odd last one alone
lab = [(name, {**data, **(_pair(i // 2) if i < _paired else _alone)})
       for i, (name, data) in enumerate(_lab_hosts)]

# The router (deploys/router.py) on the first host, beside its server, as in inventories/lab.py.
routers = [name for name, _ in lab[:1]]
