"""Host data: what the product reads from pyinfra's host and group data, and the profile a host
serves (``serving``).

    from sglang_fleet import hostconfig
    profile = hostconfig.profile_for(host)
"""

from __future__ import annotations

from sglang_fleet.hostconfig.serving import (
    PROFILE_KEY,
    allow_insecure_urls,
    check_host,
    gpu_count,
    overrides,
    profile_for,
)

__all__ = ["PROFILE_KEY", "allow_insecure_urls", "check_host", "gpu_count", "overrides",
           "profile_for"]
