"""SGLang releases this product supports and how to compare them."""

from __future__ import annotations

import difflib
import json
from functools import cache
from importlib import resources

from packaging.version import Version

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


def at_least(version: str, floor: str) -> bool:
    """``at_least("0.5.13.post1", "0.5.14")`` is False; post releases sort after their base."""
    return Version(version) >= Version(floor)


def version_problem(version: str) -> str | None:
    """What is wrong with ``version`` as a release to render for (None if it is supported).

    Only the releases listed in releases.json count: never a path or an empty string."""
    if not version.strip():
        return "is empty"
    if version in supported():
        return None
    close = difflib.get_close_matches(version, supported(), n=1, cutoff=0.6)
    shown = version if len(version) <= 40 and version.isprintable() else repr(version[:40])
    hint = f"did you mean {close[0]}? " if close else ""
    return (f"SGLang {shown} is not a supported release ({hint}supported: "
            f"{', '.join(supported())})")


VERSION_FIX = ("name a supported release, or add one: list it in "
               "src/sglang_fleet/data/releases.json and run "
               "python3 scripts/sglang_oracle.py extract RELEASE (docs/releases.md)")


@cache
def architectures(version: str) -> frozenset[str]:
    """The model classes ``version`` serves natively (its ``ModelRegistry``), from
    data/architectures.json written by scripts/extract_architectures.py."""
    table: dict[str, list[str]] = json.loads((DATA / "architectures.json").read_text())
    return frozenset(table.get(version, ()))


def architecture_problem(arch: str, version: str) -> str | None:
    """Why SGLang ``version`` would not serve ``arch`` natively, with a did-you-mean."""
    known = architectures(version)
    if not known or arch in known:
        return None
    close = difflib.get_close_matches(arch, sorted(known), n=3, cutoff=0.6)
    hint = f"did you mean {' or '.join(close)}?" if close else \
        f"it knows {len(known)} others (data/architectures.json)"
    return f"SGLang {version} has no model class {arch!r}: {hint}"
