"""The lab's hosts serving in gRPC mode (``server.router_connection: grpc``) behind smg
(``sglang-fleet lab up --hosts 2 --gpus 1``, or more of either): smg tokenizes and parses at
the gateway, the servers answer gRPC on their ports and ``/metrics`` on their side ports
(port + 100).

    pyinfra -y inventories/lab_grpc.py deploys/sglang.py
    pyinfra -y inventories/lab_grpc.py deploys/router.py
    sglang-fleet roll inventories/lab_grpc.py

The hosts are in the group ``lab``, so ``group_data/lab.py`` is theirs as it is
``inventories/lab.py``'s, and each host is reached as there. Their gRPC ports check no key: the
servers carry none (``server.api_key_secret``), the router keeps its own, and
``sglang_allowed_clients`` keeps other hosts off them (the units let loopback in, and every lab
host is a loopback address, so the lab's hosts still reach one another).
"""

import runpy
from pathlib import Path

# The lab's hosts and how to reach them, from the lab's own inventory (one place for both).
_lab_hosts = runpy.run_path(str(Path(__file__).with_name("lab.py")))["lab_hosts"]

_grpc = {
    "sglang.server.router_connection": "grpc",
    "sglang.server.api_key_secret": None,
    "sglang_allowed_clients": ["10.20.0.0/16"],
    # The servicer's planned warm-up at its fast level: readiness waits for it, and the full
    # level (the default) takes about a minute per server start in the lab.
    "sglang.env.SMG_SGLANG_SERVICER_WARMUP": "fast",
}
lab = [(name, {**data, **_grpc}) for name, data in _lab_hosts]

# The router (deploys/router.py) on the first host, beside its server, as in inventories/lab.py.
routers = [name for name, _ in lab[:1]]
