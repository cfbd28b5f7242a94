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
