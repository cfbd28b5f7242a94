"""A host's config, built and checked once per host (``HostConfig``): what every stage,
report and roll reads host data through.

    from sglang_fleet import hostconfig
    hostconfig.of(host).startup_budget_seconds     # 1800
"""

from __future__ import annotations

import contextlib
from typing import Any
from weakref import WeakKeyDictionary

from pyinfra.api.host import Host

from sglang_fleet.hostconfig.keys import HostConfig

# By the host's data object: pyinfra makes one per host and keeps it; the config goes with it.
_BUILT: WeakKeyDictionary[Any, HostConfig] = WeakKeyDictionary()


def of(host: Host) -> HostConfig:
    """``host``'s data, checked and typed (InputError listing every problem), built once.

        of(host).gpu_count     # 8
    """
    data = host.data
    try:
        return _BUILT[data]
    except (KeyError, TypeError):  # TypeError: a plain dict (a test's host), built each time
        pass
    built = HostConfig.from_data(data, host.name, getattr(host, "groups", ()))
    with contextlib.suppress(TypeError):
        _BUILT[data] = built
    return built


def lenient(host: Host) -> tuple[HostConfig, list[str]]:
    """``host``'s data with each refused key at its default, and the refused keys: what
    ``check --inventory`` reads to go on checking a host's profile past its data's problems
    (``of`` says them).

        lenient(host)[1]     # ['gpu_count']
    """
    return HostConfig.from_data_all(host.data, host.name, getattr(host, "groups", ()))


def check_host(host: Host) -> None:
    """Stop before any host changes when ``host``'s data is wrong (InputError listing all)."""
    of(host)


def is_serving(host: Host) -> bool:
    """Whether the host runs SGLang servers (router-only hosts set no ``sglang_profile``).

    The one key read without checking the rest: listing the serving hosts must not stop at
    the first host with a problem; each host's data is checked when its profile is read, so
    that a roll reports every host's problems together.

        is_serving(host)     # True
    """
    return bool(host.data.get("sglang_profile"))
