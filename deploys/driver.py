"""The driver stage alone: ``pyinfra -y inventories/lab.py deploys/driver.py``."""

from sglang_fleet import converge

converge.driver()
