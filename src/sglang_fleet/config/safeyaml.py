"""Reading operator files safely: a size limit, strict UTF-8 and a YAML loader that refuses
what a profile never needs (aliases, duplicate keys, non-string keys, deep nesting).

    text = read_text("profiles/x.yaml", "the profile", MAX_PROFILE_BYTES)   # InputError if bad
    data = load(text, "profiles/x.yaml")

PyYAML's ``safe_load`` expands aliases without bound (469 bytes became a 498 MiB value), lets
a duplicate key silently replace the first, accepts ``1:`` or ``~:`` as keys, and recurses once
per nesting level (20,000 ``[`` end in a RecursionError); this loader stops at each of them
with the line and column.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from yaml.composer import ComposerError
from yaml.constructor import ConstructorError
from yaml.nodes import MappingNode, Node

from sglang_fleet.errors import InputError

MAX_PROFILE_BYTES = 256 * 1024  # a profile is a few hundred bytes; documented in docs/profile.md
MAX_DEPTH = 32  # nesting levels; a profile needs 3


class StrictLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` without aliases, duplicate or non-string keys, or deep nesting."""

    depth = 0

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:
        if self.check_event(yaml.AliasEvent):
            raise ComposerError(None, None, "aliases (*name) are not allowed: write the value "
                                "out where it is used", self._mark())
        if self.depth >= MAX_DEPTH:
            raise ComposerError(None, None, f"nested deeper than {MAX_DEPTH} levels",
                                self._mark())
        self.depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1

    def _mark(self) -> Any:
        return self.peek_event().start_mark  # type: ignore[no-untyped-call]

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[str, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            if not isinstance(key, str):
                raise ConstructorError(None, None, f"the key {key!r} is {type(key).__name__}, "
                                       "not a string (quote it: '\"...\": value')",
                                       key_node.start_mark)
            if key in seen:
                raise ConstructorError(None, None, f"duplicate key {key!r} (first at line "
                                       f"{seen[key]}); the second would silently replace it",
                                       key_node.start_mark)
            seen[key] = line
        return super().construct_mapping(node, deep)


def load(text: str, source: str, key: str = "") -> Any:
    """Parse ``text`` with StrictLoader; InputError naming ``source`` with line and column."""
    try:
        return yaml.load(text, Loader=StrictLoader)  # StrictLoader is a SafeLoader
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise InputError.one(source, key, f"not valid YAML: {where}{problem}",
                             "fix the YAML at that position") from None
    except RecursionError:
        raise InputError.one(source, key, "not valid YAML: nested too deeply",
                             f"a profile needs at most {MAX_DEPTH} levels") from None


_BOMS = ((b"\xff\xfe\x00\x00", "UTF-32"), (b"\x00\x00\xfe\xff", "UTF-32"),
         (b"\xff\xfe", "UTF-16"), (b"\xfe\xff", "UTF-16"))


def decode(raw: bytes, source: str, what: str) -> str:
    """Strict UTF-8 (a UTF-8 byte-order mark is dropped); InputError naming the problem."""
    fix = f"save {what} as UTF-8 (e.g. iconv -f LATIN1 -t UTF-8)"
    for bom, name in _BOMS:
        if raw.startswith(bom):
            raise InputError.one(source, "", f"{what} is {name} (it starts with a {name} "
                                 "byte-order mark), not UTF-8",
                                 f"save it as UTF-8: iconv -f {name} -t UTF-8")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[:exc.start].count(b"\n") + 1
        column = exc.start - (raw.rfind(b"\n", 0, exc.start) + 1) + 1
        raise InputError.one(source, "", f"{what} is not UTF-8: byte 0x{raw[exc.start]:02x} "
                             f"at line {line}, column {column} ({exc.reason}); Latin-1 or "
                             "another encoding?", fix) from None
    if "\x00" in text:
        raise InputError.one(source, "", f"{what} holds NUL bytes (UTF-16 without a "
                             "byte-order mark, or a binary file?)", fix)
    return text.removeprefix("\ufeff")


def read_bytes(path: str | Path, source: str, what: str, limit: int) -> bytes:
    """At most ``limit`` bytes of ``path`` (so /dev/zero or a huge file fails fast)."""
    try:
        with open(path, "rb") as handle:
            raw = handle.read(limit + 1)
    except OSError as exc:
        raise InputError.one(source, "", f"cannot read {what}: {exc.strerror or exc}",
                             f"pass the path of {what}") from None
    except ValueError as exc:  # an embedded NUL in the path
        raise InputError.one(source, "", f"cannot read {what}: {exc}",
                             f"pass the path of {what}") from None
    if len(raw) > limit:
        raise InputError.one(source, "", f"{what} is larger than {limit // 1024} KiB",
                             f"pass {what} itself (the limit is {limit // 1024} KiB)")
    return raw


def read_text(path: str | Path, source: str, what: str, limit: int) -> str:
    """``read_bytes`` decoded as strict UTF-8."""
    return decode(read_bytes(path, source, what, limit), source, what)
