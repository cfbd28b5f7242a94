"""The lab's hosts (``sglang-fleet lab up``), as a pyinfra inventory.

    pyinfra -y inventories/lab.py exec -- nvidia-smi -L

Every host is in the group ``lab`` (this file's name), whose data lives in
``group_data/lab.py``: the one place where the lab differs from a B200 site. Both read the lab
of the slot ``SGLANG_FLEET_LAB_SLOT`` names (0 when unset), as ``sglang-fleet lab`` does:

    SGLANG_FLEET_LAB_SLOT=1 pyinfra -y inventories/lab.py deploys/sglang.py
"""

from sglang_fleet_lab.state import load

_lab = load()
# A lab made with --sudo-user refuses root's SSH login, as cloud images do: log in as that user
# and become root with sudo for every operation.
_ssh = {
    "ssh_user": _lab.login,
    **({"_sudo": True} if _lab.sudo_user else {}),
    "ssh_key": str(_lab.ssh_key),
    "ssh_known_hosts_file": str(_lab.known_hosts),
    "ssh_strict_host_key_checking": "accept-new",
}

# Lab hosts share the machine's network: each server listens on its host's own address.
lab_hosts = [(h.name, {"ssh_hostname": h.address, "gpu_count": h.gpus,
                       "sglang.server.host": h.address, "router_host": h.address, **_ssh})
             for h in _lab.hosts]

# The router (deploys/router.py) runs on the first host, beside its server, on port 30080.
routers = [name for name, _ in lab_hosts[:1]]
