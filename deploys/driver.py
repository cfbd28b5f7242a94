"""The driver stage alone: ``pyinfra -y inventories/lab.py deploys/driver.py``."""

from pyinfra.context import host

from sglang_fleet import hostdata
from sglang_fleet.driver import install_driver

hostdata.check_host(host)  # bad host data stops the run before any host changes
install_driver()
