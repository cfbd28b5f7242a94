"""The driver stage alone: ``pyinfra -y inventories/lab.py deploys/driver.py``."""

from sglang_fleet.driver import install_driver

install_driver()
