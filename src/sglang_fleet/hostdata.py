"""The profile a pyinfra host serves: its profile file plus overrides from host and group data.

    # inventories/group_data/all.py
    sglang_profile = "profiles/qwen3.6-27b-mtp.yaml"
    # inventories/group_data/b200.py
    sglang_overrides = {"memory": {"max_running_requests": 64}}
    # on the command line
    pyinfra inventories/b200.py deploys/sglang.py --data sglang.memory.page_size=64

Overrides merge key by key across every data level (group data, host data, ``--data``), so a
host can change one key without repeating the rest of its group's overrides.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from pyinfra.api.host import Host

from sglang_fleet import profile
from sglang_fleet.errors import InputError

PROFILE_KEY = "sglang_profile"
OVERRIDES_KEY = "sglang_overrides"
DOTTED_PREFIX = "sglang."


def _levels(host: Host) -> Iterable[Mapping[str, Any]]:
    """Each data level of the host, lowest priority first (pyinfra lists highest first)."""
    for level in reversed(host.data.datas):
        yield level() if callable(level) else level


def _flatten(nested: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in nested.items():
        if isinstance(value, Mapping) and value:
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def overrides(host: Host) -> dict[str, Any]:
    """Every profile override that applies to ``host``, merged across data levels."""
    merged: dict[str, Any] = {}
    for level in _levels(host):
        nested = level.get(OVERRIDES_KEY)
        if nested is not None and not isinstance(nested, Mapping):
            raise InputError.one(f"pyinfra data of {host.name}", OVERRIDES_KEY,
                                 f"must be a mapping of profile keys, got {nested!r}",
                                 "write e.g. {'memory': {'max_running_requests': 64}}")
        merged.update(_flatten(nested or {}))
        for key, value in level.items():
            if key.startswith(DOTTED_PREFIX):
                merged[key.removeprefix(DOTTED_PREFIX)] = value
    return merged


def profile_for(host: Host) -> profile.Profile:
    """Load, override and validate the profile ``host`` serves."""
    source = f"pyinfra data of {host.name}"
    path = host.data.get(PROFILE_KEY)
    if not isinstance(path, str):
        raise InputError.one(source, PROFILE_KEY, "no serving profile for this host",
                             f"set {PROFILE_KEY} = 'profiles/<name>.yaml' in group data")
    return profile.load(path, overrides(host), source)
