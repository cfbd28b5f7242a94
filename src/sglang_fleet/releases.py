"""SGLang releases this product supports and how to compare them."""

from __future__ import annotations

import json
from functools import cache
from importlib import resources

from packaging.version import InvalidVersion, Version

DATA = resources.files("sglang_fleet") / "data"


@cache
def _catalog() -> dict[str, object]:
    catalog: dict[str, object] = json.loads((DATA / "releases.json").read_text())
    return catalog


def pinned() -> str:
    """The release new profiles are rendered for unless they pin another."""
    return str(_catalog()["pinned"])


def supported() -> list[str]:
    """Every release with a committed flag table, oldest first."""
    versions = _catalog()["supported"]
    assert isinstance(versions, list)
    return [str(v) for v in versions]


def parse(version: str) -> Version | None:
    try:
        return Version(version)
    except InvalidVersion:
        return None


def at_least(version: str, floor: str) -> bool:
    """``at_least("0.5.13.post1", "0.5.14")`` is False; post releases sort after their base."""
    return Version(version) >= Version(floor)
