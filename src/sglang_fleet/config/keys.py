"""How a key is declared, for a profile (``config/profile.py``) and host data
(``hostconfig/keys.py``): a field of a frozen dataclass, declared with ``key()``; its annotation
is its type (``int | None`` is "an integer or null"), the rest is in the declaration.

    page_size: int | None = key(None, check=checks.count(), flag="--page-size",
                                doc="Tokens per KV cache page.", fix="e.g. 64")
"""

from __future__ import annotations

import copy
import types
from collections.abc import Callable, Iterator, Mapping
from dataclasses import MISSING, Field, dataclass, field, fields, is_dataclass, replace
from functools import cache, partial
from pathlib import Path
from typing import Any, Union, get_args, get_origin, get_type_hints

KEY = "sglang_fleet.key"  # the field metadata entry that holds a key's declaration


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Any = _Required()  # the default of a key a profile must write


@dataclass(frozen=True)
class Wrong:
    """What a check found, with its own fix and key where the declared ones do not fit."""

    message: str
    fix: str | None = None
    key: str | None = None


Found = str | Wrong | list[Wrong] | None
# A check takes a value the data gives (never None) and the data it came from (``.get`` reads
# another key: ``allow_insecure_urls`` for a URL), and says what is wrong, or None.
Check = Callable[[Any, Any], Found]


def wrongs(found: Found) -> list[Wrong]:
    if found is None:
        return []
    if isinstance(found, str):
        return [Wrong(found)]
    return found if isinstance(found, list) else [found]


@dataclass(frozen=True)
class Key:
    """What ``key()`` records on a field besides its default."""

    doc: str
    check: Check | None = None
    fix: str = ""
    flag: str | None = None
    negated: bool = False
    accepts: tuple[type, ...] = ()
    parse: Callable[[Any], Any] | None = None
    lookup: Callable[[Any, str], Any] | None = None
    shown: str | None = None
    group: bool = False


def key(default: Any = REQUIRED, *, doc: str, check: Check | None = None, fix: str = "",
        flag: str | None = None, negated: bool = False, accepts: tuple[type, ...] = (),
        parse: Callable[[Any], Any] | None = None, lookup: Callable[[Any, str], Any] | None = None,
        shown: str | None = None, group: bool = False, secret: bool = False) -> Any:
    """Declare a key (a dataclass field's default). ``flag``: the SGLang option, newest
    spelling (render asks each release's table for its destination's); ``negated``: a
    ``--disable-X`` given when false; ``accepts``: YAML types besides the annotation's;
    ``parse``: a checked value as the annotation's type. Host data: ``lookup`` reads the value
    (default ``.get``), ``shown`` is the table's default, ``group`` an inventory group, and
    ``secret`` keeps the value out of the repr (tracebacks, logs)."""
    metadata = {KEY: Key(doc, check, fix, flag, negated, accepts, parse, lookup, shown, group)}
    if default is REQUIRED:
        return field(metadata=metadata)
    if isinstance(default, dict | list | set):  # a dataclass shares no mutable default
        return field(default_factory=partial(copy.copy, default), metadata=metadata,
                     repr=not secret)
    return field(default=default, metadata=metadata, repr=not secret)


_TYPE_NAMES = {bool: "true/false", int: "an integer", float: "a number", str: "a string",
               list: "a list", dict: "a mapping"}


@dataclass(frozen=True, kw_only=True)
class Declared(Key):
    """One key's declaration, with its (dotted) name, default and the YAML types it takes."""

    name: str
    default: Any  # REQUIRED when a profile must write the key
    types: tuple[type, ...]  # YAML's types: a list for a tuple, a mapping for a Mapping
    nullable: bool
    item: type | None  # the element type of a list, the value type of a mapping

    @property
    def dest(self) -> str | None:
        return self.flag.removeprefix("--").replace("-", "_") if self.flag else None

    @property
    def type_name(self) -> str:
        """How errors and the docs name the type: ``an integer or null``."""
        shown = [t for t in self.types if not (t is int and float in self.types)]
        name = " or ".join(_TYPE_NAMES[t] for t in shown if t in _TYPE_NAMES)
        if self.item is not None:
            name += f" of {_TYPE_NAMES[self.item].removeprefix('a ')}s"
        return name + (" or null" if self.nullable else "")

    def read(self, value: Any) -> Any:
        """A validated YAML value as the dataclass holds it: a list as a tuple, 1 as 1.0."""
        if self.parse is not None:
            return self.parse(value)
        if isinstance(value, list):
            return tuple(value)
        if isinstance(value, dict):
            return dict(value)
        if float in self.types and isinstance(value, int) and not isinstance(value, bool):
            return float(value)
        return value

    @property
    def fresh(self) -> Any:
        return copy.copy(self.default)


def _accepted(hint: Any) -> tuple[tuple[type, ...], bool, type | None]:
    """(YAML types, nullable, item type) of an annotation such as ``tuple[str, ...] | None``."""
    options = get_args(hint) if get_origin(hint) in (Union, types.UnionType) else (hint,)
    accepted: list[type] = []
    item = None
    for option in options:
        origin = get_origin(option) or option
        if option is type(None):
            continue
        if origin is tuple:  # a YAML list, held immutable
            accepted.append(list)
            item = get_args(option)[0]
        elif origin in (Mapping, dict):
            accepted.append(dict)
            item = get_args(option)[1]
        elif option is float:  # an integer is a number too: 1 means 1.0
            accepted += [float, int]
        else:
            accepted.append(option)
    return tuple(accepted), type(None) in options, item


def _declared(name: str, member: Field[Any], hint: Any, declaration: Key) -> Declared:
    accepted, nullable, item = _accepted(hint)
    if member.default is not MISSING:
        default = member.default
    elif member.default_factory is not MISSING:
        default = member.default_factory()
    else:
        default = REQUIRED
    own = {f.name: getattr(declaration, f.name) for f in fields(Key)}
    return Declared(**own, name=name, default=default, types=declaration.accepts or accepted,
                    nullable=nullable, item=item)


@cache
def parts(cls: type) -> tuple[tuple[str, type | Declared], ...]:
    """``cls``'s sections (a dataclass of keys) and keys (a Declared), in declaration order."""
    hints = get_type_hints(cls)
    found: list[tuple[str, type | Declared]] = []
    for member in fields(cls):
        hint = hints[member.name]
        declaration = member.metadata.get(KEY)
        if isinstance(hint, type) and is_dataclass(hint) and parts(hint):
            found.append((member.name, hint))  # a section (a dataclass of no keys is not one)
        elif isinstance(declaration, Key):
            found.append((member.name, _declared(member.name, member, hint, declaration)))
    return tuple(found)


def top_level(cls: type) -> list[str]:
    """The names a profile's top level may hold: its sections and its own keys, in order."""
    return [name for name, _ in parts(cls)]


@cache
def declared(cls: type) -> tuple[Declared, ...]:
    """Every key of ``cls`` and of its sections, dotted (``memory.page_size``), in order."""
    found: list[Declared] = []
    for name, part in parts(cls):
        if isinstance(part, Declared):
            found.append(part)
        else:
            found += [replace(d, name=f"{name}.{d.name}") for d in declared(part)]
    return tuple(found)


def values(obj: object) -> Iterator[tuple[Declared, Any]]:
    """Every key of a profile (or a section) with the value ``obj`` holds for it."""
    cls: type = type(obj)
    for spec in declared(cls):
        value: Any = obj
        for part in spec.name.split("."):
            value = getattr(value, part)
        yield spec, value


@dataclass
class Located:
    """Where each key of a merged profile came from (file or data source)."""

    default_source: str
    sources: dict[str, str] = field(default_factory=dict)

    def of(self, key: str) -> str:
        while key:
            if key in self.sources:
                return self.sources[key]
            key = key.rpartition(".")[0]
        return self.default_source


@dataclass(frozen=True)
class Table:
    """A schema's keys as a Markdown table, one ``row`` a key, held in a doc between two
    markers (a test compares them)."""

    marker: str
    header: tuple[str, ...]
    row: Callable[[Declared], tuple[str, ...]]
    schema: type

    @property
    def begin(self) -> str:
        return f"<!-- {self.marker}:begin -->"

    @property
    def end(self) -> str:
        return f"<!-- {self.marker}:end -->"

    def text(self) -> str:
        lines = [self.header, ("---",) * len(self.header), *map(self.row, declared(self.schema))]
        return "".join("| " + " | ".join(c.replace("|", "\\|") for c in line) + " |\n"
                       for line in lines)  # a pipe would end the cell

    def in_doc(self, text: str) -> str | None:
        """What ``text`` holds between the markers (None: no markers)."""
        if self.begin not in text or self.end not in text:
            return None
        return text.split(self.begin, 1)[1].split(self.end, 1)[0].strip("\n") + "\n"

    def with_table(self, text: str) -> str:
        """``text`` with the table between its markers made anew; ValueError without them."""
        if self.in_doc(text) is None:
            raise ValueError(f"no {self.begin} ... {self.end} to write the table between")
        head, rest = text.split(self.begin, 1)
        return f"{head}{self.begin}\n{self.text()}{self.end}{rest.split(self.end, 1)[1]}"

    def write(self, path: Path) -> str | None:
        """Write the table into the doc at ``path``; what went wrong, or None."""
        try:
            path.write_text(self.with_table(path.read_text()))
        except (OSError, ValueError) as err:
            return f"{path}: {err}"
        return None
