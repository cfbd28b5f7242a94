"""The lab's first two hosts as one multi-node server: the shipped profile at tp 16 over both
(``parallel.nnodes`` 2), 8 GPUs each (``sglang-fleet lab up --hosts 2 --gpus 8``).

    pyinfra -y inventories/lab_multinode.py deploys/sglang.py
    sglang-fleet roll inventories/lab_multinode.py

The hosts are in the group ``lab`` (the list's name), so ``group_data/lab.py`` is theirs as
it is ``inventories/lab.py``'s: the overrides below are ``sglang.KEY`` host data, which the
product merges key by key with that file's ``sglang_overrides`` (the lab's engine, launcher and
model source stay). Each host is reached as ``inventories/lab.py`` reaches it.

A host after the first two (``lab up --hosts 3``) serves on its own beside the group, one
server: a second worker in the router, so that a roll of the group keeps the fleet serving.
"""

import runpy
from pathlib import Path

# The lab's hosts and how to reach them, from the lab's own inventory (one place for both).
_lab_hosts = runpy.run_path(str(Path(__file__).with_name("lab.py")))["lab_hosts"]

# One server over two hosts; inventory order is rank order (lab1: rank 0, the rendezvous and
# the routers' only worker of the group).
_group = {
    "sglang_group": "lab-tp16",
    "sglang.parallel.tp": 16,
    "sglang.parallel.nnodes": 2,
    # The rendezvous waits this long for a missing rank (torch's 10 minutes otherwise): a
    # member that never starts fails the group's start within a minute, not ten.
    "sglang.parallel.dist_timeout": 60,
}
# One server is enough beside the group (instances: auto would run eight on the lab's 8 GPUs).
_alone = {"sglang.parallel.instances": 1}

lab = [(name, {**data, **(_group if i < 2 else _alone)})
       for i, (name, data) in enumerate(_lab_hosts)]

# The router (deploys/router.py) on rank 0's host, beside it, as in inventories/lab.py.
routers = [name for name, _ in lab[:1]]
