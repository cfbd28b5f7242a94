"""The driver stage alone: ``pyinfra -y inventories/lab.py deploys/driver.py``."""

from pyinfra.context import host

from sglang_fleet import hostdata
from sglang_fleet.driver import install_driver
from sglang_fleet.gpucheck import require_gpu_health

hostdata.check_host(host)  # bad host data stops the run before any host changes
require_gpu_health()  # a GPU unfit to serve refuses the host before any change
install_driver()
