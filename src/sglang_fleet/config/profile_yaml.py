"""A profile's YAML: the file (a path, or a shipped profile's name), read with ``safeyaml``'s
limits, and the host data that overrides it merged in; ``profile.load`` validates the result.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

from sglang_fleet.config import safeyaml
from sglang_fleet.config.keys import Located
from sglang_fleet.errors import InputError


def read(path: Path, sections: Sequence[str]) -> dict[str, Any]:
    """The profile's top-level mapping; ``sections``: the names it may hold, for the error."""
    source = str(path)
    text = safeyaml.read_text(path, source, "the profile", safeyaml.MAX_PROFILE_BYTES)
    data = safeyaml.load(text, source)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise InputError.one(source, "", "the top level must be a mapping of sections",
                             f"start with sections such as {', '.join(sections)}")
    return data


def merge(base: dict[str, Any], overrides: Mapping[str, Any], source: str,
          located: Located, prefix: str = "") -> None:
    """Merge ``overrides`` from ``source`` into ``base`` key by key, noting in ``located``
    where each value came from.

    >>> data, located = {"memory": {"page_size": 64}}, Located("my.yaml")
    >>> merge(data, {"memory.context_length": "8192"}, "host data", located)
    >>> data, located.of("memory.context_length"), located.of("memory.page_size")
    ({'memory': {'page_size': 64, 'context_length': '8192'}}, 'host data', 'my.yaml')
    """
    for name, value in overrides.items():
        head, dot, rest = name.partition(".")
        if dot:  # dotted keys, as pyinfra's --data gives them: memory.page_size=64
            merge(base, {head: {rest: value}}, source, located, prefix)
            continue
        path = f"{prefix}{name}"
        current = base.get(name)
        if isinstance(value, Mapping) and isinstance(current, dict):
            merge(current, value, source, located, f"{path}.")
        else:
            base[name] = dict(value) if isinstance(value, Mapping) else value
            located.sources[path] = source


SHIPPED = resources.files("sglang_fleet") / "profiles"


def shipped() -> list[str]:
    return sorted(p.name.removesuffix(".yaml") for p in SHIPPED.iterdir()
                  if p.name.endswith(".yaml"))


def locate(ref: str | Path) -> Path:
    """A profile file: a path as given, or the shipped profile a bare name (no ``/``, no
    ``.yaml``) names, found wherever the product runs from.

    >>> locate("qwen3.6-27b-mtp").name, str(locate("my/own.yaml"))
    ('qwen3.6-27b-mtp.yaml', 'my/own.yaml')
    """
    text = str(ref)
    if isinstance(ref, Path) or "/" in text or text.endswith((".yaml", ".yml")):
        return Path(ref)
    if text not in shipped():
        raise InputError.one(text, "profile", "neither a file path nor a shipped profile",
                             f"give a path to a profile YAML file, or one of: "
                             f"{', '.join(shipped())}")
    return Path(str(SHIPPED / f"{text}.yaml"))
