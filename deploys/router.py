"""The SGLang router on the hosts of the group ``routers``, in front of every serving host:

    pyinfra -y inventories/b200.py deploys/router.py

A host that left ``routers`` loses the router, its keys and its worker list. Running it again
changes nothing; a host added to or removed from the inventory is added to or removed from the
running router without a restart.
"""

from sglang_fleet import converge

converge.router()
