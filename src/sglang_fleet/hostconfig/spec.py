"""How a host-data key is declared, and how a host's data becomes a checked, typed object.

A key is a field of ``HostConfig`` (``keys.py``) whose default is ``key(...)``: the field's name
is the key, its annotation the type, and ``key`` holds the rest (default, check, fix, the
README's text). ``checked`` reads every declared key of a host, checks it and lists every problem
at once:

    gpu_count: int | None = key(None, check=whole(1, 1024, "must be a positive integer"),
                                fix="the number of GPUs the host must show, e.g. 8",
                                doc="GPUs the host must show (8 on HGX)")
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from sglang_fleet.errors import InputError, Problem

T = TypeVar("T")
SPEC = "sglang_fleet.hostconfig"  # the metadata key of a declared field


@dataclass(frozen=True)
class Raw:
    """One host's data as pyinfra holds it (``host.data``, or a plain mapping in tests), for
    the checks that look at another key (``allow_insecure_urls`` for URLs, the branch for the
    driver version).

        Raw({"gpu_count": 8}, "b200-01").get("gpu_count")     # 8
    """

    data: Any  # pyinfra's HostData or a mapping: both have .get
    host: str
    groups: tuple[str, ...] = ()

    @property
    def source(self) -> str:
        return f"pyinfra data of {self.host}"

    def get(self, key: str) -> Any:
        return self.data.get(key)

    def levels(self) -> list[Mapping[str, Any]]:
        """Each data level, lowest priority first (pyinfra lists them highest first); a plain
        mapping is one level."""
        datas = getattr(self.data, "datas", None)
        if datas is None:
            return [self.data]
        return [level() if callable(level) else level for level in reversed(datas)]


@dataclass(frozen=True)
class Wrong:
    """What a check found: the message, and when the key's declared fix or the key itself
    does not fit, the fix and the key to name (``secrets.NAME`` for one secret)."""

    message: str
    fix: str | None = None
    key: str | None = None


Found = str | Wrong | list[Wrong] | None
Check = Callable[[Any, Raw], Found]


@dataclass(frozen=True)
class Key:
    """A host-data key's declaration besides its name, type and default."""

    doc: str  # docs/host-data.md's table's "meaning"
    fix: str  # what the error says to do, unless the check says more precisely
    check: Check | None  # run on a value the data gives (not on None)
    parse: Callable[[Any], Any] | None  # the checked value, typed (None: as given)
    read: Callable[[Raw, str], Any] | None  # how the value is read (None: the data's .get)
    shown: str | None  # the table's "default", where the default alone says too little
    group: bool  # an inventory group, not a data key


def key(default: T, *, doc: str, fix: str = "", check: Check | None = None,
        parse: Callable[[Any], Any] | None = None, read: Callable[[Raw, str], Any] | None = None,
        shown: str | None = None, group: bool = False, secret: bool = False) -> T:
    """A declared field (typed as its default, so the dataclass field keeps its annotation);
    ``secret``: its value is left out of the object's repr (tracebacks, logs).

        purge: tuple[str, ...] = key((), check=subset_of(PURGEABLE), doc="teardown: ...")
    """
    spec = {SPEC: Key(doc, fix, check, parse, read, shown, group)}
    if isinstance(default, dict | list | set):  # a dataclass takes no mutable default
        made: T = dataclasses.field(default_factory=lambda: copy.copy(default), metadata=spec,
                                    repr=not secret)
        return made
    fixed: T = dataclasses.field(default=default, metadata=spec, repr=not secret)
    return fixed


def declared(cls: type) -> Iterator[tuple[dataclasses.Field[Any], Key]]:
    """Each declared field of ``cls`` with its declaration, in declaration order."""
    for f in dataclasses.fields(cls):
        if SPEC in f.metadata:
            yield f, f.metadata[SPEC]


def default_of(f: dataclasses.Field[Any]) -> Any:
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return f.default


def _wrongs(found: Found) -> list[Wrong]:
    if found is None:
        return []
    if isinstance(found, str):
        return [Wrong(found)]
    return found if isinstance(found, list) else [found]


def _value(f: dataclasses.Field[Any], spec: Key, raw: Raw) -> tuple[Any, list[Problem]]:
    """The typed value of one key, or the problems with it."""
    value = spec.read(raw, f.name) if spec.read else raw.get(f.name)
    if value is None:
        return default_of(f), []
    wrongs = _wrongs(spec.check(value, raw)) if spec.check else []
    if wrongs:
        return None, [Problem(raw.source, w.key or f.name, w.message, w.fix or spec.fix)
                      for w in wrongs]
    return (spec.parse(value) if spec.parse else value), []


def checked(fields: type, raw: Raw) -> dict[str, Any]:
    """Every key ``fields`` declares, read from ``raw``, checked and typed; InputError listing
    every problem of the host when any key is wrong.

        checked(HostConfig, Raw({"gpu_count": 0}, "h"))
        # InputError: pyinfra data of h: gpu_count: must be a positive integer, got 0 ...
    """
    values, problems, _ = checked_all(fields, raw)
    if problems:
        raise InputError(problems)
    return values


def checked_all(fields: type, raw: Raw) -> tuple[dict[str, Any], list[Problem], list[str]]:
    """Every key, with a refused one at its default; the problems; the refused keys (what
    ``check --inventory`` reads to go on checking a host's profile past its data).

        checked_all(HostConfig, Raw({"gpu_count": 0}, "h"))[2]     # ['gpu_count']
    """
    values: dict[str, Any] = {}
    problems: list[Problem] = []
    refused: list[str] = []
    for f, spec in declared(fields):
        value, found = _value(f, spec, raw)
        values[f.name] = default_of(f) if found else value
        problems += found
        refused += [f.name] if found else []
    return values, problems, refused
