"""The SGLang router on the hosts of the group ``routers``, in front of every serving host:

    pyinfra -y inventories/b200.py deploys/router.py

A host that left ``routers`` loses the router, its keys and its worker list. Running it again
changes nothing; a host added to or removed from the inventory is added to or removed from the
running router without a restart.
"""

from pyinfra.context import host, inventory

from sglang_fleet import fleet, hostdata
from sglang_fleet.router import install_router, remove_router

hostdata.check_host(host)  # bad host data stops the run before any host changes
if fleet.ROUTERS_GROUP in host.groups:
    install_router(fleet.RouterConfig.from_host(host), fleet.all_worker_urls(inventory))
else:
    remove_router()
