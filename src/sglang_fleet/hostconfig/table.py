"""The host-data table of docs/host-data.md, made from the declaration (``keys.py``)."""

from __future__ import annotations

from typing import Any

from sglang_fleet.config.keys import Declared, Table
from sglang_fleet.hostconfig.keys import HostConfig


def _default(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, tuple | list):
        return f"`{list(value)!r}`"
    return f"`{value}`" if isinstance(value, bool | int | str) else f"`{value!r}`"


def row(key: Declared) -> tuple[str, ...]:
    """(key, default, meaning) of one key."""
    shown = key.shown if key.shown is not None else _default(key.default)
    return f"`{key.name}`" + (" (group)" if key.group else ""), shown, key.doc


TABLE = Table("host-data", ("host data", "default", "meaning"), row, HostConfig)
