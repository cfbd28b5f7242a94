"""Take hosts out of service:

    pyinfra -y inventories/b200.py deploys/teardown.py
    pyinfra -y inventories/b200.py deploys/teardown.py --data purge=engine,weights,driver

Out of the routers, the router itself on router hosts, the server units and their environment
files. Engine releases, staged weights and the driver go only when ``purge`` names them; a full
purge leaves the host as it was before the first deploy. Running it again changes nothing.
"""

from sglang_fleet import converge

converge.take_down()
