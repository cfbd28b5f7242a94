"""B200 hosts, as a pyinfra inventory: copy this file and list your own servers.

    pyinfra -y inventories/b200.py deploys/sglang.py

Every host here is in the group ``b200`` (this file's name), whose data lives in
``group_data/b200.py``; per-host data (address, GPUs, overrides of profile keys with the
``sglang.`` prefix) goes in the tuples below.
"""

b200_hosts = [
    ("b200-01", {"ssh_hostname": "10.0.0.11", "gpu_count": 8}),
    ("b200-02", {"ssh_hostname": "10.0.0.12", "gpu_count": 8,
                 # one host may differ from its group, one key at a time:
                 "sglang.memory.max_mamba_cache_size": 240}),
]

# sglang-router (deploys/router.py) beside the first server; clients and `sglang-fleet roll`
# reach it at http://10.0.0.11:30080. A router-only host would set "sglang_profile": None.
routers = ["b200-01"]
