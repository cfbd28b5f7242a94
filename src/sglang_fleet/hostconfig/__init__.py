"""Host data: every key the product reads from pyinfra's host and group data, declared once,
checked once per host, and read typed.

    from sglang_fleet import hostconfig
    cfg = hostconfig.of(host)               # HostConfig: checked, typed, built once per host
    cfg.gpu_count, cfg.router_port          # (8, 30080)
    profile = hostconfig.profile_for(host)  # the profile it serves, with its overrides

``keys.py`` declares the keys (the one place to add one) with ``config/keys.py``'s ``key()``
and ``config/checks.py``'s checks, and reads and checks them; ``overrides.py`` the profile
overrides (``sglang_overrides``, ``sglang.KEY``), ``serving.py`` the profile a host serves,
``table.py`` docs/host-data.md's table (``python -m sglang_fleet.hostconfig``).
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
