"""Serving profiles: YAML → validated, typed ``Profile``.

    profile = load("qwen3.6-27b-mtp", overrides={"memory.max_running_requests": 64})

Overrides come from pyinfra host or group data, as a nested mapping or dotted keys; an error in
an override names the data source that set it, an error in the file names the file.
"""

from __future__ import annotations

import datetime
import difflib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import Any, cast

from sglang_fleet.config import safeyaml, validators
from sglang_fleet.config.checks import AUTO, REQUIRED, SCHEMA, SECTION_WIDE, Field, Located
from sglang_fleet.errors import InputError, Problem

# Keys that only mean something with speculative.algorithm set.
SPECULATIVE_KEYS = ("num_steps", "eagle_topk", "num_draft_tokens")


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
    target_running_requests: int | None = None  # the deploy sizes the mamba cache for it


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
    instances: int | str  # a number, or AUTO until ``for_gpus`` resolves it for one host

    @property
    def gpus_per_instance(self) -> int:
        return self.tp * self.dp

    @property
    def servers(self) -> int:
        """Servers per host; a profile with ``instances: auto`` must be resolved for its host
        first (``Profile.for_gpus``, which ``hostdata.profile_for`` calls)."""
        if not isinstance(self.instances, int):
            raise ValueError("parallel.instances is auto: resolve it for a host (for_gpus)")
        return self.instances


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
    warmup: str = "compile"  # off | compile | full
    env: Mapping[str, str] = field(default_factory=dict)
    extra_args: tuple[str, ...] = ()
    origin: Located = field(default_factory=lambda: Located(""), compare=False)

    def source_of(self, key: str) -> str:
        """The file or data source that set ``key`` (dotted path)."""
        return self.origin.of(key)

    def for_gpus(self, gpus: int, where: str) -> Profile:
        """The profile for a host with ``gpus`` GPUs: ``instances: auto`` becomes one server per
        tp x dp of them (a number stays as it is). ``where`` names the host and what counted
        its GPUs, for the error when not even one server fits.

        >>> load("qwen3.6-27b-mtp").for_gpus(8, "b200-01").parallel.instances
        8
        """
        parallel = self.parallel
        if parallel.instances != AUTO:
            return self
        servers = gpus // parallel.gpus_per_instance
        key = "parallel.instances"
        if servers < 1:
            raise InputError.one(self.source_of(key), key,
                                 f"auto: {where} has {gpus} GPU(s), fewer than one server's "
                                 f"tp x dp = {parallel.gpus_per_instance}",
                                 "lower parallel.tp or parallel.dp, or serve from a larger host")
        if self.server.port + servers - 1 > 65535:
            raise InputError.one(self.source_of("server.port"), "server.port",
                                 f"auto: {where}'s {servers} servers would listen up to port "
                                 f"{self.server.port + servers - 1}, above 65535",
                                 f"set server.port to at most {65536 - servers}")
        return replace(self, parallel=replace(parallel, instances=servers))


def _suggest(word: str, options: list[str]) -> str:
    close = difflib.get_close_matches(word, options, n=1, cutoff=0.6)
    return f"did you mean {close[0]!r}?" if close else f"known keys: {', '.join(options)}"


def _read_yaml(path: Path) -> dict[str, Any]:
    """The profile's top-level mapping, read with the limits and loader of ``safeyaml``."""
    source = str(path)
    text = safeyaml.read_text(path, source, "the profile", safeyaml.MAX_PROFILE_BYTES)
    data = safeyaml.load(text, source)
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


class _Empty:
    """An empty string where a number, a flag or a list belongs (``--data KEY=``)."""

    def __repr__(self) -> str:
        return "an empty value"


def _coerce(value: Any, spec: Field) -> Any:
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


def _strings(value: Any) -> list[str]:
    """Every string inside a value: itself, list items, mapping keys and values."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [str(k) for k in value] + [v for v in value.values() if isinstance(v, str)]
    if isinstance(value, list):
        return [v for v in value if isinstance(v, str)]
    return []


def _value_problem(value: Any, spec: Field) -> str | None:
    """What is wrong with a well-typed value: its strings, its finiteness, its own check."""
    for text in _strings(value):
        wrong = validators.text_problem(text)
        if wrong:
            return wrong if isinstance(value, str) else f"{text[:60]!r} {wrong}"
    if isinstance(value, float):
        wrong = validators.finite_problem(value)
        if wrong:
            return wrong
    return spec.check(value) if spec.check is not None else None


def _type_fix(value: Any, spec: Field, key: str, from_data: bool) -> str:
    """The fix for a mistyped value; a number or flag where a string belongs must be quoted."""
    scalar = isinstance(value, int | float | bool | datetime.date)  # YAML read a non-string
    if str in spec.types and scalar and from_data:
        return (f"quote it so it stays a string: --data 'sglang.{key}=\"{value}\"' "
                "(or as a string in the data file)")
    if str in spec.types and scalar:
        return f"quote it so YAML reads a string: {key.rpartition('.')[2]}: \"{value}\""
    return spec.fix or f"write {spec.type_name}"


def _validate_leaf(raw: Any, key: str, spec: Field, located: Located,
                   problems: list[Problem]) -> Any:
    if raw is REQUIRED:
        problems.append(Problem(located.of(key), key, "is required but missing",
                                f"add it: {spec.fix or spec.type_name}"))
        return None
    # Only data sources (pyinfra --data) give every value as a string; a file means what it says.
    from_data = located.of(key) != located.default_source
    value = _coerce(raw, spec) if from_data else raw
    if isinstance(value, _Empty):
        problems.append(Problem(located.of(key), key, f"is empty; {spec.type_name} is needed",
                                f"give a value, or null to leave it to SGLang ({spec.fix})"
                                if spec.nullable else spec.fix or f"write {spec.type_name}"))
        return None
    if not _type_ok(value, spec):
        shown = repr(value) if len(repr(value)) < 80 else repr(value)[:77] + "..."
        problems.append(Problem(located.of(key), key,
                                f"must be {spec.type_name}, got {type(value).__name__} {shown}",
                                _type_fix(value, spec, key, from_data)))
        return None
    if value is not None:
        wrong = _value_problem(value, spec)
        if wrong:
            problems.append(Problem(located.of(key), key, wrong, spec.fix or "correct the value"))
            return None
    if float in spec.types and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    return value


def _consistency(values: dict[str, Any], located: Located, allow_insecure_urls: bool,
                 problems: list[Problem]) -> None:
    """Rules between keys: each checked only when the keys it reads are valid themselves."""
    def problem(key: str, message: str, fix: str) -> None:
        problems.append(Problem(located.of(key), key, message, fix))

    invalid = {p.key for p in problems}  # None there means "refused", not "null"
    spec = values.get("speculative") or {}
    if "algorithm" in spec and spec["algorithm"] is None \
            and "speculative.algorithm" not in invalid:
        for name in SPECULATIVE_KEYS:
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


def validate(data: Mapping[str, Any], located: Located,
             allow_insecure_urls: bool = False) -> Profile:
    """Check every key against SCHEMA and build the typed profile; raise InputError listing all."""
    problems: list[Problem] = []
    values: dict[str, Any] = {}
    for section in data:
        if not isinstance(section, str):
            problems.append(Problem(located.default_source, str(section),
                                    f"the section name {section!r} is not a string",
                                    _suggest(str(section), list(SCHEMA))))
        elif section not in SCHEMA:
            shown = section if len(section) <= 60 else section[:57] + "..."
            problems.append(Problem(located.of(section), shown, "unknown section",
                                    _suggest(section[:100], list(SCHEMA))))
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
            if not isinstance(key, str):
                problems.append(Problem(located.of(section), section,
                                        f"the key {key!r} is not a string",
                                        _suggest(str(key), list(fields))))
            elif key not in fields:
                shown = key if len(key) <= 60 else key[:57] + "..."
                problems.append(Problem(located.of(f"{section}.{key}"), f"{section}.{shown}",
                                        "unknown key", _suggest(key[:100], list(fields))))
        values[section] = {
            key: _validate_leaf(raw.get(key, spec.default), f"{section}.{key}", spec, located,
                                problems)
            for key, spec in fields.items()
        }
    _consistency(values, located, allow_insecure_urls, problems)
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
        warmup=values["warmup"] or "off",  # false: YAML's bare off
        env=dict(values["env"]),
        extra_args=tuple(values["extra_args"]),
        origin=located,
    )


SHIPPED = resources.files("sglang_fleet") / "profiles"


def shipped() -> list[str]:
    """The names of the profiles shipped with the product (``qwen3.6-27b-mtp``, ...)."""
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


def load(path: str | Path, overrides: Mapping[str, Any] | None = None,
         overrides_source: str = "host data", allow_insecure_urls: bool = False) -> Profile:
    """Read, merge and validate a profile. Raises InputError naming file, key and fix.

    ``allow_insecure_urls`` lets ``engine.index_url`` be plain http (host data
    ``allow_insecure_urls``, or ``--allow-insecure-urls`` for check and render)."""
    path = locate(path)
    data = _read_yaml(path)
    located = Located(str(path))
    if overrides:
        _merge(data, overrides, overrides_source, located)
    return validate(data, located, allow_insecure_urls)
