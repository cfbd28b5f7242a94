"""Per-release SGLang flag tables (written by ``scripts/sglang_oracle.py extract`` from each
release's argparse definitions), and a parser rebuilt from them that accepts, rejects and
abbreviates exactly like that release's ``sglang.launch_server``.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

from sglang_fleet.config import argtypes, releases

_ACTIONS = {
    "_StoreAction": "store",
    "_StoreTrueAction": "store_true",
    "_StoreFalseAction": "store_false",
    "_StoreConstAction": "store_const",
    "_AppendAction": "append",
    "_AppendConstAction": "append_const",
    "_CountAction": "count",
}


@dataclass(frozen=True)
class Flag:
    """One option string of the release's parser (an alias is a Flag of its own)."""

    option: str
    dest: str
    action: str
    type: str | None
    nargs: int | str | None
    choices: tuple[Any, ...] | None
    default: Any
    deprecated: bool
    alias_of: str | None

    @property
    def takes_value(self) -> bool:
        return self.nargs != 0 and self.action not in {
            "_StoreTrueAction", "_StoreFalseAction", "_StoreConstAction", "BooleanOptionalAction"}


class ArgvError(ValueError):
    """The release's parser rejects an argv; the message is argparse's own."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # argparse would exit; callers want the message
        raise ArgvError(message)


@dataclass(frozen=True)
class FlagTable:
    version: str
    flags: dict[str, Flag]
    raw: tuple[dict[str, Any], ...]
    speculative_names: frozenset[str]
    speculative_aliases: frozenset[str]

    def get(self, option: str) -> Flag | None:
        """The flag spelled exactly ``option`` (never a prefix match)."""
        return self.flags.get(option)

    def option_for(self, dest: str) -> str | None:
        """The current (non-deprecated) spelling of ``dest``, if the release has one."""
        for flag in self.flags.values():
            if flag.dest == dest and not flag.deprecated and flag.alias_of is None:
                return flag.option
        return None

    def parse(self, argv: Sequence[str]) -> dict[str, Any]:
        """Parse like SGLang's own parser: unknown, ambiguous or mistyped flags raise ArgvError."""
        return vars(_build_parser(self.version).parse_args(list(argv)))


def _add(parser: argparse.ArgumentParser, entry: dict[str, Any]) -> None:
    kind = entry["action"]
    kwargs: dict[str, Any] = {"dest": entry["dest"], "default": entry["default"]}
    options = entry["options"]
    if kind == "BooleanOptionalAction":
        options = [o for o in options if not o.startswith("--no-")]
        kwargs["action"] = argparse.BooleanOptionalAction
    elif kind in _ACTIONS:
        kwargs["action"] = _ACTIONS[kind]
    elif entry["nargs"] == 0:
        # A custom action that takes no value (deprecated switches): behaves like store_const.
        kwargs["action"] = "store_const"
        kwargs["const"] = entry["const"]
    else:
        kwargs["action"] = "store"
    action = kwargs["action"]
    if action in ("store", "append"):
        if entry["type"]:
            kwargs["type"] = argtypes.BY_NAME[entry["type"]]
        if entry["nargs"] is not None:
            kwargs["nargs"] = entry["nargs"]
        if entry["choices"] is not None:
            kwargs["choices"] = entry["choices"]
    if action in ("store_const", "append_const"):
        kwargs["const"] = entry["const"]
    parser.add_argument(*options, **kwargs)


@cache
def _build_parser(version: str) -> _Parser:
    parser = _Parser(prog="sglang.launch_server", add_help=False)
    for entry in load(version).raw:
        _add(parser, entry)
    return parser


@cache
def load(version: str) -> FlagTable:
    """The flag table of ``version``; KeyError when the release has no table."""
    path = releases.DATA / "flags" / f"{version}.json"
    if not path.is_file():
        raise KeyError(version)
    data = json.loads(path.read_text())
    flags: dict[str, Flag] = {}
    for entry in data["flags"]:
        for option in entry["options"]:
            flags[option] = Flag(option, entry["dest"], entry["action"], entry["type"],
                                 entry["nargs"], None if entry["choices"] is None
                                 else tuple(entry["choices"]), entry["default"],
                                 entry["deprecated"], entry["alias_of"])
    spec = data["speculative_algorithms"]
    return FlagTable(version, flags, tuple(data["flags"]), frozenset(spec["names"]),
                     frozenset(spec["aliases_of_eagle"]))
