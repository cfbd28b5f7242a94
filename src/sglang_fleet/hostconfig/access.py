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
    """``host``'s data, checked and typed (InputError listing every problem), built once."""
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
    ``check --inventory`` reads to go on past its data's problems (``of`` says them)."""
    return HostConfig.from_data_all(host.data, host.name, getattr(host, "groups", ()))


def check_host(host: Host) -> None:
    """Stop before any host changes when ``host``'s data is wrong (InputError listing all)."""
    of(host)


def is_serving(host: Host) -> bool:
    """Whether the host runs SGLang servers (router-only hosts set no ``sglang_profile``):
    read unchecked, so that listing the serving hosts does not stop at the first problem
    and a roll reports every host's problems together."""
    return bool(host.data.get("sglang_profile"))
