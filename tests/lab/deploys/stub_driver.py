"""Install the lab's stub NVIDIA open driver from the lab repository, then reboot to load it.

The driver stage of the product does this properly; this deploy only proves that the lab's
repository, apt and reboots behave like a real site's.
"""

from pyinfra.context import host
from pyinfra.operations import apt, files, server

base = f"{host.data.nvidia_repo_base_url}/debian12/x86_64"
keyring = files.download(name="NVIDIA repository keyring", src=f"{base}/cuda-keyring_1.1-1_all.deb",
                         dest="/root/cuda-keyring_1.1-1_all.deb")
apt.deb(name="Install the keyring", src="/root/cuda-keyring_1.1-1_all.deb")
apt.update(name="Read the NVIDIA repository")
driver = apt.packages(name="Open driver", packages=["nvidia-open-580=580.95.05-1",
                                                     "nvidia-driver-580-open=580.95.05-1"])
server.reboot(name="Load the driver", reboot_timeout=120, _if=driver.did_change)
