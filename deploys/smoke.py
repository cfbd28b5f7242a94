"""A smoke generation against every server of the inventory, changing nothing:

    pyinfra -y inventories/b200.py deploys/smoke.py
"""

from pyinfra.context import host

from sglang_fleet import hostdata
from sglang_fleet.gate import smoke_test
from sglang_fleet.render import render_all

profile = hostdata.profile_for(host)
smoke_test(profile, render_all(profile))
