"""Serving profiles: YAML → validated, typed ``Profile``.

    profile = load("profiles/qwen3.6-27b-mtp.yaml", overrides={"memory.max_running_requests": 64})

Overrides come from pyinfra host or group data, as a nested mapping or dotted keys; an error in
an override names the data source that set it, an error in the file names the file.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import yaml

from sglang_fleet.errors import InputError, Problem
from sglang_fleet.schema import REQUIRED, SCHEMA, SECTION_WIDE, Field, Located


@dataclass(frozen=True)
class Engine:
    version: str
    package: str
    extras: tuple[str, ...]
    index_url: str | None
    launcher: str


@dataclass(frozen=True)
class Model:
    source: str
    served_name: str
    architecture: str | None
    config: str | None
    trust_remote_code: bool


@dataclass(frozen=True)
class Speculative:
    algorithm: str | None
    num_steps: int | None
    eagle_topk: int | None
    num_draft_tokens: int | None


@dataclass(frozen=True)
class Mamba:
    strategy: str
    track_interval: int | None
    full_memory_ratio: float | None


@dataclass(frozen=True)
class Memory:
    mem_fraction_static: float | None
    max_running_requests: int | None
    max_mamba_cache_size: int | None
    context_length: int | None
    page_size: int | None
    chunked_prefill_size: int | None


@dataclass(frozen=True)
class Scheduler:
    radix_cache: bool
    overlap_schedule: bool
    attention_backend: str | None
    linear_attn_backend: str | None


@dataclass(frozen=True)
class Parallel:
    tp: int
    dp: int
    nnodes: int
    instances: int

    @property
    def gpus_per_instance(self) -> int:
        return self.tp * self.dp


@dataclass(frozen=True)
class Parsers:
    reasoning: str | None
    tool: str | None


@dataclass(frozen=True)
class Server:
    host: str
    port: int
    api_key_secret: str | None
    admin_api_key_secret: str | None
    metrics: bool


@dataclass(frozen=True)
class Profile:
    """One serving setup, described semantically; ``render`` turns it into a command line."""

    path: str
    engine: Engine
    model: Model
    speculative: Speculative
    mamba: Mamba
    memory: Memory
    scheduler: Scheduler
    parallel: Parallel
    parsers: Parsers
    server: Server
    env: Mapping[str, str] = field(default_factory=dict)
    extra_args: tuple[str, ...] = ()
    origin: Located = field(default_factory=lambda: Located(""), compare=False)

    def source_of(self, key: str) -> str:
        """The file or data source that set ``key`` (dotted path)."""
        return self.origin.of(key)


def _suggest(word: str, options: list[str]) -> str:
    close = difflib.get_close_matches(word, options, n=1, cutoff=0.6)
    return f"did you mean {close[0]!r}?" if close else f"known keys: {', '.join(options)}"


def _read_yaml(path: Path) -> dict[str, Any]:
    source = str(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise InputError.one(source, "", f"cannot read the profile: {exc.strerror}",
                             "pass the path of a profile YAML file, e.g. profiles/*.yaml") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise InputError.one(source, "", f"not valid YAML: {where}{problem}",
                             "fix the YAML syntax at that position") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise InputError.one(source, "", "the top level must be a mapping of sections",
                             f"start with sections such as {', '.join(SCHEMA)}")
    return data


def _merge(base: dict[str, Any], overrides: Mapping[str, Any], source: str,
           located: Located, prefix: str = "") -> None:
    for key, value in overrides.items():
        head, dot, rest = key.partition(".")
        if dot:  # dotted keys, as pyinfra's --data gives them: memory.page_size=64
            _merge(base, {head: {rest: value}}, source, located, prefix)
            continue
        path = f"{prefix}{key}"
        current = base.get(key)
        if isinstance(value, Mapping) and isinstance(current, dict):
            _merge(current, value, source, located, f"{path}.")
        else:
            base[key] = dict(value) if isinstance(value, Mapping) else value
            located.sources[path] = source


def _coerce(value: Any, spec: Field) -> Any:
    """Values from ``pyinfra --data key=value`` arrive as strings: read them as YAML scalars."""
    if isinstance(value, str) and str not in spec.types:
        try:
            return yaml.safe_load(value)
        except yaml.YAMLError:
            return value
    return value


def _type_ok(value: object, spec: Field) -> bool:
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


def _validate_leaf(raw: Any, key: str, spec: Field, located: Located,
                   problems: list[Problem]) -> Any:
    if raw is REQUIRED:
        problems.append(Problem(located.of(key), key, "is required but missing",
                                f"add it: {spec.fix or spec.type_name}"))
        return None
    value = _coerce(raw, spec)
    if not _type_ok(value, spec):
        problems.append(Problem(located.of(key), key,
                                f"must be {spec.type_name}, got {type(value).__name__} {value!r}",
                                spec.fix or f"write {spec.type_name}"))
        return None
    if value is not None and spec.check is not None:
        wrong = spec.check(value)
        if wrong:
            problems.append(Problem(located.of(key), key, wrong, spec.fix or "correct the value"))
    if float in spec.types and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    return value


def validate(data: Mapping[str, Any], located: Located) -> Profile:
    """Check every key against SCHEMA and build the typed profile; raise InputError listing all."""
    problems: list[Problem] = []
    values: dict[str, Any] = {}
    for section in data:
        if section not in SCHEMA:
            problems.append(Problem(located.of(section), section, "unknown section",
                                    _suggest(section, list(SCHEMA))))
    for section, fields in SCHEMA.items():
        raw = data.get(section, {} if SECTION_WIDE not in fields else fields[SECTION_WIDE].default)
        if SECTION_WIDE in fields:
            values[section] = _validate_leaf(raw, section, fields[SECTION_WIDE], located, problems)
            continue
        if raw is None:
            raw = {}
        if not isinstance(raw, Mapping):
            problems.append(Problem(located.of(section), section,
                                    f"must be a mapping, got {type(raw).__name__}",
                                    f"write keys under it: {', '.join(fields)}"))
            continue
        for key in raw:
            if key not in fields:
                problems.append(Problem(located.of(f"{section}.{key}"), f"{section}.{key}",
                                        "unknown key", _suggest(str(key), list(fields))))
        values[section] = {
            key: _validate_leaf(raw.get(key, spec.default), f"{section}.{key}", spec, located,
                                problems)
            for key, spec in fields.items()
        }
    if problems:
        raise InputError(problems)
    return Profile(
        path=located.default_source,
        engine=Engine(**{**values["engine"], "extras": tuple(values["engine"]["extras"])}),
        model=Model(**values["model"]),
        speculative=Speculative(**values["speculative"]),
        mamba=Mamba(**values["mamba"]),
        memory=Memory(**values["memory"]),
        scheduler=Scheduler(**values["scheduler"]),
        parallel=Parallel(**values["parallel"]),
        parsers=Parsers(**values["parsers"]),
        server=Server(**values["server"]),
        env=dict(values["env"]),
        extra_args=tuple(values["extra_args"]),
        origin=located,
    )


def load(path: str | Path, overrides: Mapping[str, Any] | None = None,
         overrides_source: str = "host data") -> Profile:
    """Read, merge and validate a profile. Raises InputError naming file, key and fix."""
    path = Path(path)
    data = _read_yaml(path)
    located = Located(str(path))
    if overrides:
        _merge(data, overrides, overrides_source, located)
    return validate(data, located)
