"""The profile schema: every key a serving profile may set, its type, default and limits."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sglang_fleet import paths
from sglang_fleet.config import releases, validators

REQUIRED = object()
Check = Callable[[Any], str | None]


@dataclass(frozen=True)
class Field:
    """A leaf key. ``check`` returns what is wrong with a well-typed value, or None."""

    types: tuple[type, ...]
    default: Any = REQUIRED
    check: Check | None = None
    fix: str = ""
    nullable: bool = False
    item: type | None = None  # element type of a list, value type of a mapping

    @property
    def type_name(self) -> str:
        names = {bool: "true/false", int: "an integer", float: "a number", str: "a string",
                 list: "a list", dict: "a mapping"}
        types = [t for t in self.types if not (t is int and float in self.types)]
        name = " or ".join(names[t] for t in types if t in names)
        if self.item is not None:
            name += f" of {names[self.item].removeprefix('a ')}s"
        return name + (" or null" if self.nullable else "")


def _range(low: float | None = None, high: float | None = None, *, open_low: bool = False) -> Check:
    def check(value: Any) -> str | None:
        if low is not None and (value <= low if open_low else value < low):
            return f"must be {'greater than' if open_low else 'at least'} {low}, got {value}"
        if high is not None and value > high:
            return f"must be at most {high}, got {value}"
        return None

    return check


def _one_of(*choices: str) -> Check:
    def check(value: Any) -> str | None:
        return None if value in choices else f"must be one of {', '.join(choices)}; got {value!r}"

    return check


def _release(value: Any) -> str | None:
    return releases.version_problem(value)


def _model_source(value: Any) -> str | None:
    return validators.model_source_problem(value)


def _form(check: Callable[[str], str | None]) -> Check:
    """A check of a string's form (the value is a str once its type is checked)."""
    return lambda value: check(value)


def _names(check: Callable[[str], str | None]) -> Check:
    def each(value: Any) -> str | None:
        for item in value:
            wrong = check(item)
            if wrong:
                return wrong
        return None

    return each


def _port(value: Any) -> str | None:
    if value < 1024:
        return (f"port {value} is privileged (below 1024): the server runs as the unprivileged "
                "user sglang, without capabilities, and could not bind it")
    if value > 65535:
        return f"must be at most 65535, got {value}"
    return None


_SECRET_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,63}$")


def _secret_name(value: Any) -> str | None:
    if _SECRET_NAME.match(value):
        return None
    return "must be the NAME of a secret (lower-case letters, digits, . _ -), never the key itself"


_ENV_NAME = re.compile(r"^[A-Z_][A-Z0-9_]*$")


# Set by the product itself: a profile may not override them.
RESERVED_ENV = {paths.API_KEY_VAR: "server.api_key_secret",
                paths.ADMIN_API_KEY_VAR: "server.admin_api_key_secret"}
MAX_ENV = 128
MAX_EXTRA_ARGS = 256


def _env(value: Any) -> str | None:
    bad = [k for k in value if not _ENV_NAME.fullmatch(k)]
    if bad:
        return (f"invalid variable names: {', '.join(map(repr, bad))} (POSIX names: upper-case "
                "letters, digits and _, not starting with a digit)")
    reserved = [k for k in value if k in RESERVED_ENV]
    if reserved:
        return f"{reserved[0]} is set by the product (from {RESERVED_ENV[reserved[0]]})"
    if len(value) > MAX_ENV:
        return f"has {len(value)} variables; at most {MAX_ENV}"
    return None


def _flags(value: Any) -> str | None:
    if value and not value[0].startswith("--"):
        return f"must start with a --flag, got {value[0]!r}"
    if len(value) > MAX_EXTRA_ARGS:
        return f"has {len(value)} words; at most {MAX_EXTRA_ARGS}"
    return None


MAX_INT = 2**31 - 1  # no count, size or length SGLang takes is larger


def _int(default: Any = None, low: int = 1, high: int | None = MAX_INT, fix: str = "") -> Field:
    return Field((int,), default, _range(low, high), fix, nullable=default is None)


def _opt_str(fix: str = "", check: Check | None = None) -> Field:
    return Field((str,), None, check, fix, nullable=True)


AUTO = "auto"
MAX_INSTANCES = 64


def _instances(value: Any) -> str | None:
    """``auto`` or a number of servers per host."""
    if isinstance(value, str):
        return None if value == AUTO else f"must be auto or a number, got {value!r}"
    return _range(1, MAX_INSTANCES)(value)


MAMBA_STRATEGIES = ("auto", "no_buffer", "extra_buffer", "extra_buffer_lazy")
WARMUP_MODES = ("off", "compile", "full")


def _warmup(value: Any) -> str | None:
    if value is False:  # YAML reads a bare ``off`` as false
        return None
    return _one_of(*WARMUP_MODES)(value)

SCHEMA: dict[str, dict[str, Field]] = {
    "engine": {
        "version": Field((str,), releases.pinned(), _release,
                         "pin a release listed in src/sglang_fleet/data/releases.json"),
        "package": Field((str,), "sglang", _form(validators.pep508_problem),
                         "a PyPI project name, e.g. sglang"),
        "extras": Field((list,), [], _names(validators.pep508_problem),
                        "a list of extras names, e.g. [blackwell]", item=str),
        "index_url": _opt_str("an index URL such as https://pypi.org/simple"),
        "launcher": Field((str,), "sglang.launch_server", _form(validators.module_problem),
                          "a module run as python -m MODULE"),
    },
    "model": {
        "source": Field((str,), REQUIRED, _model_source,
                        "write hf://org/name@revision, s3://bucket/prefix or /abs/path"),
        "served_name": Field((str,), REQUIRED, _form(validators.served_name_problem),
                             "the model id clients send, e.g. qwen3.6-27b"),
        "architecture": _opt_str("the architectures[0] value of the model's config.json",
                                 _form(validators.identifier_problem)),
        "config": _opt_str("path to the model's config.json, read by preflight"),
        "trust_remote_code": Field((bool,), False),
    },
    "speculative": {
        "algorithm": _opt_str("NEXTN or EAGLE for MTP; null turns speculative decoding off",
                              _form(validators.word_problem)),
        "num_steps": _int(fix="e.g. 3"),
        "eagle_topk": _int(fix="e.g. 1"),
        "num_draft_tokens": _int(low=2, fix="num_steps + 1 when eagle_topk is 1"),
    },
    "mamba": {
        "strategy": Field((str,), "auto", _one_of(*MAMBA_STRATEGIES),
                          f"one of {', '.join(MAMBA_STRATEGIES)}"),
        "track_interval": _int(fix="a multiple of page_size, at least num_draft_tokens"),
        "full_memory_ratio": Field((float, int), None, _range(0, 1, open_low=True),
                                   "a ratio in (0, 1], e.g. 0.9", nullable=True),
    },
    "memory": {
        "mem_fraction_static": Field((float, int), None, _range(0, 1, open_low=True),
                                     "a fraction in (0, 1], e.g. 0.85", nullable=True),
        "max_running_requests": _int(fix="e.g. 48"),
        "max_mamba_cache_size": _int(fix="mamba state slots, e.g. 240"),
        # Not an SGLang flag: the deploy sizes --max-mamba-cache-size for it (sizing.py).
        "target_running_requests": _int(fix="running requests the deploy guarantees, e.g. 48"),
        "context_length": _int(fix="tokens, e.g. 262144"),
        "page_size": _int(fix="tokens per KV page, e.g. 64"),
        "chunked_prefill_size": _int(low=-1, fix="tokens per prefill chunk, -1 to disable"),
    },
    "scheduler": {
        "radix_cache": Field((bool,), True),
        "overlap_schedule": Field((bool,), True),
        "attention_backend": _opt_str("a backend the release accepts, e.g. triton",
                                      _form(validators.word_problem)),
        "linear_attn_backend": _opt_str("a backend the release accepts, e.g. triton",
                                        _form(validators.word_problem)),
    },
    "parallel": {
        "tp": _int(1, fix="GPUs per tensor-parallel group"),
        "dp": _int(1, fix="data-parallel replicas"),
        "nnodes": _int(1, fix="hosts in one server"),
        "instances": Field((int, str), 1, _instances,
                           "auto (one server per tp x dp GPUs of each host) or a number of "
                           "servers per host, 1 to 64"),
    },
    "parsers": {
        "reasoning": _opt_str("a reasoning parser the release knows, e.g. qwen3",
                              _form(validators.word_problem)),
        "tool": _opt_str("a tool-call parser the release knows, e.g. qwen3_coder",
                         _form(validators.word_problem)),
    },
    "server": {
        "host": Field((str,), "0.0.0.0", _form(validators.host_problem),
                      "an IP address (0.0.0.0 for every interface) or a host name"),
        "port": Field((int,), 30000, _port, "a TCP port from 1024 to 65535, e.g. 30000"),
        "api_key_secret": _opt_str("e.g. sglang-api-key", _secret_name),
        "admin_api_key_secret": _opt_str("e.g. sglang-admin-api-key", _secret_name),
        "metrics": Field((bool,), False),
    },
    # What a deploy that changes the kernels does before the old server stops: nothing, the
    # release's precompile entry point, or a whole warm-up start, on GPUs no server uses.
    "warmup": {"*": Field((str, bool), "compile", _warmup, "off, compile or full")},
    "env": {"*": Field((dict,), {}, _env, "UPPER_CASE names with string values", item=str)},
    "extra_args": {"*": Field((list,), [], _flags, "a list of strings, e.g. ['--flag', 'value']",
                              item=str)},
}
SECTION_WIDE = "*"  # a section that is one leaf value (env, extra_args)


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
