"""The host-data table of docs/host-data.md, made from the declaration (``keys.py``): one row a
key, in declaration order, between two markers in that file.

    print(TABLE.text())                   # python -m sglang_fleet.hostconfig
    TABLE.write(Path("docs/host-data.md"))
"""

from __future__ import annotations

from typing import Any

from sglang_fleet.config.keys import Declared, Table
from sglang_fleet.hostconfig.keys import HostConfig


def _default(value: Any) -> str:
    """A default as the table shows it: ``none``, or the value as one would write it."""
    if value is None:
        return "none"
    if isinstance(value, tuple | list):
        return f"`{list(value)!r}`"
    return f"`{value}`" if isinstance(value, bool | int | str) else f"`{value!r}`"


def row(key: Declared) -> tuple[str, ...]:
    """(key, default, meaning) of one key.

        row(declared(HostConfig)[0])  # ('`sglang_profile`', 'none: required on serving hosts', ...)
    """
    shown = key.shown if key.shown is not None else _default(key.default)
    return f"`{key.name}`" + (" (group)" if key.group else ""), shown, key.doc


TABLE = Table("host-data", ("host data", "default", "meaning"), row, HostConfig)
