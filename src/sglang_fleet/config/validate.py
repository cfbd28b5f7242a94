"""A merged profile's data → typed values, every key checked as it is declared.

    validate_all(Profile, {"model": {"source": "/m", "served_name": "m"}}, Located("my.yaml"))

Each key: present, its type, its strings, finiteness, its own check; then the rules between
keys (``_consistency``), each only when the keys it reads are valid themselves.
"""

from __future__ import annotations

import datetime
import difflib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, cast

from sglang_fleet.config import safeyaml, validators
from sglang_fleet.config.checks import AUTO
from sglang_fleet.config.keys import (
    REQUIRED,
    Declared,
    Located,
    Wrong,
    declared,
    parts,
    top_level,
    wrongs,
)
from sglang_fleet.errors import InputError, Problem

# Only meaningful with speculative.algorithm set (not *_KEYS: test_table.py reads those).
NEED_ALGORITHM = ("num_steps", "eagle_topk", "num_draft_tokens")


def _suggest(word: str, options: list[str]) -> str:
    close = difflib.get_close_matches(word, options, n=1, cutoff=0.6)
    return f"did you mean {close[0]!r}?" if close else f"known keys: {', '.join(options)}"


class _Empty:
    """An empty string where a number, a flag or a list belongs (``--data KEY=``)."""

    def __repr__(self) -> str:
        return "an empty value"


def _coerce(value: Any, spec: Declared) -> Any:
    """Values from ``pyinfra --data key=value`` arrive as strings: read them as YAML scalars.
    An empty string stays an error: it must not quietly become null and unset the key."""
    if isinstance(value, str) and (str not in spec.types
                                   or (int in spec.types and value.strip().isdigit())):
        if not value.strip():
            return _Empty()
        try:
            return safeyaml.load(value, "")
        except InputError:
            return value
    return value


def _type_ok(value: object, spec: Declared) -> bool:
    if value is None:
        return spec.nullable
    if isinstance(value, bool) and bool not in spec.types:
        return False
    if not isinstance(value, spec.types):
        return False
    if spec.item is not None:
        items = value.values() if isinstance(value, dict) else cast(list[Any], value)
        return all(isinstance(v, spec.item) and not isinstance(v, bool) for v in items)
    return True


def _strings(value: Any) -> list[str]:
    """Every string inside a value: itself, list items, mapping keys and values."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [str(k) for k in value] + [v for v in value.values() if isinstance(v, str)]
    if isinstance(value, list):
        return [v for v in value if isinstance(v, str)]
    return []


def _value_problem(value: Any, spec: Declared) -> list[Wrong]:
    """What is wrong with a well-typed value alone: its strings, finiteness, its own check."""
    for text in _strings(value):
        wrong = validators.text_problem(text)
        if wrong:
            return wrongs(wrong if isinstance(value, str) else f"{text[:60]!r} {wrong}")
    if isinstance(value, float):
        wrong = validators.finite_problem(value)
        if wrong:
            return wrongs(wrong)
    return wrongs(spec.check(value, {})) if spec.check is not None else []


def _type_fix(value: Any, spec: Declared, name: str, from_data: bool) -> str:
    """The fix for a mistyped value; a number or flag where a string belongs must be quoted."""
    scalar = isinstance(value, int | float | bool | datetime.date)  # YAML read a non-string
    if str in spec.types and scalar and from_data:
        return (f"quote it so it stays a string: --data 'sglang.{name}=\"{value}\"' "
                "(or as a string in the data file)")
    if str in spec.types and scalar:
        return f"quote it so YAML reads a string: {name.rpartition('.')[2]}: \"{value}\""
    return spec.fix or f"write {spec.type_name}"


def _validate_key(raw: Any, name: str, spec: Declared, located: Located,
                  problems: list[Problem]) -> Any:
    """The value of key ``name`` as its dataclass holds it, or None after adding a problem
    (a default is taken as it is: test_keys.py checks every default against its key)."""
    if raw is REQUIRED:
        if spec.default is not REQUIRED:
            return spec.read(spec.default)  # read: a mapping copied, never shared
        problems.append(Problem(located.of(name), name, "is required but missing",
                                f"add it: {spec.fix or spec.type_name}"))
        return None
    # Only data sources (pyinfra --data) give every value as a string; a file means what it says.
    from_data = located.of(name) != located.default_source
    value = _coerce(raw, spec) if from_data else raw
    if isinstance(value, _Empty):
        problems.append(Problem(located.of(name), name, f"is empty; {spec.type_name} is needed",
                                f"give a value, or null to leave it to SGLang ({spec.fix})"
                                if spec.nullable else spec.fix or f"write {spec.type_name}"))
        return None
    if not _type_ok(value, spec):
        shown = repr(value) if len(repr(value)) < 80 else repr(value)[:77] + "..."
        problems.append(Problem(located.of(name), name,
                                f"must be {spec.type_name}, got {type(value).__name__} {shown}",
                                _type_fix(value, spec, name, from_data)))
        return None
    if value is not None:
        found = _value_problem(value, spec)
        problems += [Problem(located.of(name), w.key or name, w.message,
                             w.fix or spec.fix or "correct the value") for w in found]
        if found:
            return None
    return spec.read(value) if value is not None else None


def _unknown_names(raw: Mapping[Any, Any], known: list[str], where: str, located: Located,
                   problems: list[Problem]) -> None:
    """A problem for each name in ``raw`` that ``known`` lacks (``where``: its section)."""
    prefix = f"{where}." if where else ""
    for name in raw:
        if not isinstance(name, str):
            problems.append(Problem(located.of(where) if where else located.default_source,
                                    where or str(name),
                                    f"the {'key' if where else 'section name'} {name!r} is not "
                                    "a string", _suggest(str(name), known)))
        elif name not in known:
            shown = name if len(name) <= 60 else name[:57] + "..."
            problems.append(Problem(located.of(f"{prefix}{name}"), f"{prefix}{shown}",
                                    "unknown key" if where else "unknown section",
                                    _suggest(name[:100], known)))


def _section(cls: type, name: str, raw: Any, located: Located,
             problems: list[Problem], refused: set[str]) -> dict[str, Any] | None:
    """A section's keys, validated (None when it is not even a mapping), refused ones added to
    ``refused``."""
    keys = declared(cls)
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        problems.append(Problem(located.of(name), name, f"must be a mapping, got "
                                f"{type(raw).__name__}",
                                f"write keys under it: {', '.join(k.name for k in keys)}"))
        refused.update(f"{name}.{k.name}" for k in keys)
        return None
    _unknown_names(raw, [k.name for k in keys], name, located, problems)
    return {k.name: _checked(raw.get(k.name, REQUIRED), f"{name}.{k.name}", k, located,
                             problems, refused)
            for k in keys}


def _checked(raw: Any, name: str, spec: Declared, located: Located, problems: list[Problem],
             refused: set[str]) -> Any:
    """``_validate_key``, noting in ``refused`` a key whose value it refused."""
    before = len(problems)
    value = _validate_key(raw, name, spec, located, problems)
    if len(problems) > before:
        refused.add(name)
    return value


@dataclass(frozen=True)
class Checked:
    """Every problem, the keys they refuse, and the values with each refused key at its
    default (a required one at its stand-in), for the later checks."""

    values: dict[str, Any]
    problems: list[Problem]
    refused: frozenset[str]


def validate_all(root: type, data: Mapping[Any, Any], located: Located,
                 allow_insecure_urls: bool = False,
                 stand_ins: Mapping[str, Any] | None = None) -> Checked:
    """``data`` checked against the keys ``root`` declares, without raising: each refused key
    at its default or, for a required one, at ``stand_ins[key]``."""
    problems: list[Problem] = []
    refused: set[str] = set()
    _unknown_names(data, top_level(root), "", located, problems)
    raw: dict[str, Any] = {}  # each part as validated, for the rules between keys
    for name, part in parts(root):
        if isinstance(part, Declared):
            raw[name] = _checked(data.get(name, REQUIRED), name, part, located, problems,
                                 refused)
        else:
            raw[name] = _section(part, name, data.get(name, {}), located, problems, refused)
    before = len(problems)
    _consistency(raw, located, allow_insecure_urls, problems)
    refused.update(p.key for p in problems[before:])  # the rules between keys refuse them
    return Checked(_with_defaults(root, raw, refused, stand_ins or {}), problems,
                   frozenset(refused))


def _with_defaults(root: type, raw: dict[str, Any], refused: set[str],
                   stand_ins: Mapping[str, Any]) -> dict[str, Any]:
    """The validated values, each refused key at its default (or stand-in)."""
    def default(spec: Declared, name: str) -> Any:
        if spec.default is REQUIRED:
            return stand_ins.get(name)
        return spec.read(spec.default)

    values: dict[str, Any] = {}
    for name, part in parts(root):
        if isinstance(part, Declared):
            values[name] = default(part, name) if name in refused else raw[name]
            continue
        given = raw[name] or {}
        values[name] = part(**{
            k.name: default(k, f"{name}.{k.name}") if f"{name}.{k.name}" in refused
            else given[k.name] for k in declared(part)})
    return values


def _consistency(values: dict[str, Any], located: Located, allow_insecure_urls: bool,
                 problems: list[Problem]) -> None:
    """Rules between keys: each checked only when the keys it reads are valid themselves."""
    def problem(key: str, message: str, fix: str) -> None:
        problems.append(Problem(located.of(key), key, message, fix))

    invalid = {p.key for p in problems}  # None there means "refused", not "null"
    spec = values.get("speculative") or {}
    if "algorithm" in spec and spec["algorithm"] is None \
            and "speculative.algorithm" not in invalid:
        for name in NEED_ALGORITHM:
            if spec.get(name) is not None:
                problem(f"speculative.{name}", "is set but speculative.algorithm is null, so "
                        "speculative decoding is off and the value would mean nothing",
                        "set speculative.algorithm (NEXTN or EAGLE for MTP) or remove "
                        f"speculative.{name}")
    server, parallel = values.get("server") or {}, values.get("parallel") or {}
    port, instances = server.get("port"), parallel.get("instances")
    if isinstance(port, int) and isinstance(instances, int) and port + instances - 1 > 65535:
        problem("server.port", f"instance {instances - 1} would listen on port "
                f"{port + instances - 1} (port + instance number), above 65535",
                f"set server.port to at most {65536 - instances}")
    env = values.get("env") or {}
    if (instances == AUTO or (isinstance(instances, int) and instances > 1)) \
            and "CUDA_VISIBLE_DEVICES" in env:
        problem("env", "CUDA_VISIBLE_DEVICES is set per instance by parallel.instances",
                "remove CUDA_VISIBLE_DEVICES from env")
    _target_consistency(values.get("memory") or {}, invalid, problem)
    url = (values.get("engine") or {}).get("index_url")
    if isinstance(url, str):
        wrong = validators.url_problem(url, allow_insecure_urls)
        if wrong:
            problem("engine.index_url", wrong,
                    "use an https:// index; an http one only with allow_insecure_urls "
                    "(host data) or --allow-insecure-urls (check, render)"
                    if url.startswith("http://") else "write an https:// URL")


def _target_consistency(memory: dict[str, Any], invalid: set[str],
                        problem: Callable[[str, str, str], None]) -> None:
    """memory.target_running_requests against the keys that would defeat it."""
    target = memory.get("target_running_requests")
    if not isinstance(target, int) or "memory.target_running_requests" in invalid:
        return
    if memory.get("max_mamba_cache_size") is not None:
        problem("memory.max_mamba_cache_size", "is set with memory.target_running_requests: "
                "both decide the mamba cache's size",
                "remove memory.max_mamba_cache_size (the deploy sizes the cache for "
                f"{target} running requests and remembers it), or remove "
                "memory.target_running_requests")
    mrr = memory.get("max_running_requests")
    if isinstance(mrr, int) and mrr < target:
        problem("memory.max_running_requests", f"{mrr} is below memory.target_running_requests "
                f"{target}: SGLang would never run that many",
                f"raise it to at least {target}, or leave it null (the deploy then passes "
                f"--max-running-requests {target})")
