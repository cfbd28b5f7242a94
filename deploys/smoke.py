"""A smoke generation against every server of the inventory, changing nothing:

    pyinfra -y inventories/b200.py deploys/smoke.py
"""

from sglang_fleet import converge

converge.smoke()
