"""Profile overrides in host data: ``sglang_overrides`` mappings and ``sglang.KEY`` data, merged
key by key across every data level (group data, host data, ``--data``), so a host can change
one key without repeating the rest of its group's overrides.

    # inventories/group_data/b200.py
    sglang_overrides = {"memory": {"max_running_requests": 64}}
    # on the command line
    pyinfra inventories/b200.py deploys/sglang.py --data sglang.memory.page_size=64
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sglang_fleet.config.keys import Found

OVERRIDES_KEY = "sglang_overrides"
DOTTED_PREFIX = "sglang."


def check(value: list[Mapping[str, Any]], data: Any) -> Found:
    """Each level's ``sglang_overrides`` is a mapping (``sglang.KEY`` values are checked with
    the profile)."""
    for level in value:
        nested = level.get(OVERRIDES_KEY)
        if nested is not None and not isinstance(nested, Mapping):
            return f"must be a mapping of profile keys, got {nested!r}"
    return None


def _flatten(nested: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in nested.items():
        if isinstance(value, Mapping) and value:
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def merged(value: list[Mapping[str, Any]]) -> dict[str, Any]:
    """Every override, by dotted profile key, the highest level's winning.

        merged([{"sglang_overrides": {"memory": {"page_size": 64}}},
                {"sglang.memory.page_size": 32}])            # {'memory.page_size': 32}
    """
    out: dict[str, Any] = {}
    for level in value:
        out.update(_flatten(level.get(OVERRIDES_KEY) or {}))
        for key, item in level.items():
            if key.startswith(DOTTED_PREFIX):
                out[key.removeprefix(DOTTED_PREFIX)] = item
    return out
