"""Put the last release that passed the gate back on hosts, and gate it (health, smoke):

    pyinfra -y inventories/b200.py deploys/restore.py --limit b200-01

``sglang-fleet roll`` runs this on a host whose new release failed; it changes nothing on a
host already serving its last good release, apart from gating it again.
"""

from sglang_fleet import converge

converge.restore()
