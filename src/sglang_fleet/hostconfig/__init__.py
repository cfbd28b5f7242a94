"""Host data: every key read from pyinfra's host and group data, declared once (``keys.py``),
checked once per host, and read typed.

    hostconfig.of(host).router_port           # 30080
    profile = hostconfig.profile_for(host)  # the profile it serves, with its overrides
"""

from __future__ import annotations

from sglang_fleet.hostconfig.access import check_host, is_serving, lenient, of
from sglang_fleet.hostconfig.keys import (
    DRIVER_FLOOR,
    PURGEABLE,
    REBOOT_TIMEOUT,
    ROUTER_METRICS_PORT,
    ROUTER_PACKAGE,
    ROUTER_PACKAGES,
    ROUTER_PORT,
    ROUTERS_GROUP,
    HostConfig,
)
from sglang_fleet.hostconfig.serving import PROFILE_KEY, gpu_count, profile_for

__all__ = ["DRIVER_FLOOR", "PROFILE_KEY", "PURGEABLE", "REBOOT_TIMEOUT", "ROUTERS_GROUP",
           "ROUTER_METRICS_PORT", "ROUTER_PACKAGE", "ROUTER_PACKAGES", "ROUTER_PORT",
           "HostConfig", "check_host", "gpu_count", "is_serving", "lenient", "of", "profile_for"]
