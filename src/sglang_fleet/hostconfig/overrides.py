"""Profile overrides in host data: ``sglang_overrides`` mappings and ``sglang.KEY`` data, merged
key by key across every data level (group data, host data, ``--data``), so a host can change
one key without repeating the rest of its group's overrides. Each override remembers where
it was written (the inventory, a group_data file, --data), and an error about it names that.

    # inventories/group_data/b200.py
    sglang_overrides = {"memory": {"max_running_requests": 64}}
    # on the command line
    pyinfra inventories/b200.py deploys/sglang.py --data sglang.memory.page_size=64
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any
from weakref import WeakKeyDictionary

from sglang_fleet.config.keys import Found

OVERRIDES_KEY = "sglang_overrides"
DOTTED_PREFIX = "sglang."
Levels = list[tuple[str, Mapping[str, Any]]]  # each level of a host's data, and where it is from
# The file each inventory was loaded from (``read_from``): pyinfra's Inventory does not keep it.
_FILES: WeakKeyDictionary[Any, str] = WeakKeyDictionary()


class Overrides(dict[str, Any]):
    """Profile keys by dotted name, and ``sources``: where each was written."""

    sources: dict[str, str]

    def __init__(self, values: Mapping[str, Any] | None = None,
                 sources: Mapping[str, str] | None = None) -> None:
        super().__init__(values or {})
        self.sources = dict(sources or {})


NONE = Overrides()  # no host data overrides a key


def read_from(inventory: Any, path: str) -> None:
    _FILES[inventory] = path


def _group_file(inventory: str | None, group: str) -> str:
    """Where a group's data is written: its group_data file (pyinfra reads the one beside the
    inventory, and the working directory's), else the inventory file itself."""
    if inventory is None:
        return f"group data of {group}"
    for folder in (Path(inventory).parent, Path()):
        path = folder / "group_data" / f"{group}.py"
        if path.is_file():
            return str(path)
    return inventory


def levels(data: Any, source: str) -> Levels:
    """Every level of a host's data (``source``: what a plain mapping is called) and where it
    was written, lowest priority first: pyinfra's @deploy defaults, the group ``all``'s, each
    of the host's groups', the host's own in the inventory, ``--data``, and what the deploy set.
    """
    host = getattr(data, "host", None)
    inventory = getattr(host, "inventory", None)
    if host is None or inventory is None:
        return [(source, data)]
    file = _FILES.get(inventory)
    return [("the deploy's defaults", host.get_deploy_data()),
            (_group_file(file, "all"), inventory.get_data()),
            *((_group_file(file, group), inventory.get_group_data(group))
              for group in host.groups),
            (file or source, inventory.get_host_data(host.name)),
            ("--data", inventory.get_override_data()),
            ("the deploy", data.override_datas)]


def check(value: Levels, data: Any) -> Found:
    """Each level's ``sglang_overrides`` is a mapping (``sglang.KEY`` values are checked with
    the profile)."""
    for _, level in value:
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


def merged(value: Levels) -> Overrides:
    """Every override, by dotted profile key, the highest level's winning, and where it was
    written (``.sources``)."""
    out = Overrides()
    for where, level in value:
        found = _flatten(level.get(OVERRIDES_KEY) or {})
        found.update({key.removeprefix(DOTTED_PREFIX): item for key, item in level.items()
                      if key.startswith(DOTTED_PREFIX)})
        out.update(found)
        out.sources.update(dict.fromkeys(found, where))
    return out
