"""The checks keys declare (``key(check=...)``): each takes a value (never None; a profile
key's already of its type) and the data it came from, and says what is wrong, or None.

    between(1, 64)(0, {})     # 'must be at least 1, got 0'
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Mapping
from typing import Any

from sglang_fleet import paths
from sglang_fleet.config import profile_yaml, validators
from sglang_fleet.config.keys import Check, Found, Wrong

MAX_INT = 2**31 - 1  # no count, size or length SGLang takes is larger
AUTO = "auto"  # parallel.instances: one server per tp x dp GPUs of each host
MAX_INSTANCES = 64
MAMBA_STRATEGIES = ("auto", "no_buffer", "extra_buffer", "extra_buffer_lazy")
WARMUP_MODES = ("off", "compile", "full")
CONNECTIONS = ("http", "grpc")  # server.router_connection
# Set by the product itself: a profile may not override them.
RESERVED_ENV = {paths.API_KEY_VAR: "server.api_key_secret",
                paths.ADMIN_API_KEY_VAR: "server.admin_api_key_secret"}
MAX_ENV = 128
MAX_EXTRA_ARGS = 256


def between(low: float | None = None, high: float | None = None, *,
            open_low: bool = False) -> Check:
    """A number from ``low`` to ``high`` (above ``low`` when ``open_low``)."""
    def check(value: Any, data: Any) -> Found:
        if low is not None and (value <= low if open_low else value < low):
            return f"must be {'greater than' if open_low else 'at least'} {low}, got {value}"
        if high is not None and value > high:
            return f"must be at most {high}, got {value}"
        return None

    return check


def count(low: int = 1) -> Check:
    """A count, size or length: ``low`` (usually 1) up to ``MAX_INT``."""
    return between(low, MAX_INT)


fraction = between(0, 1, open_low=True)  # in (0, 1]: 1 is all, 0 would be nothing


def one_of(*choices: str) -> Check:
    def check(value: Any, data: Any) -> Found:
        return None if value in choices else f"must be one of {', '.join(choices)}; got {value!r}"

    return check


def each(check: Check) -> Check:
    def every(value: Any, data: Any) -> Found:
        for item in value:
            wrong = check(item, data)
            if wrong:
                return wrong
        return None

    return every


def port(value: Any, data: Any) -> Found:
    if value < 1024:
        return (f"port {value} is privileged (below 1024): the server runs as the unprivileged "
                "user sglang, without capabilities, and could not bind it")
    if value > 65535:
        return f"must be at most 65535, got {value}"
    return None


# parallel.dist_port: below Linux's ephemeral ports (32768 and up: any outgoing connection may
# hold one), and none the product uses itself: the servers (30000 + instance, and SGLang's
# DP-attention ports up to + 13), their warm-ups (+ 1000), the router (30080) and its metrics
# (29000), DCGM's exporter (9400), nor torch's customary MASTER_PORT 29500.
EPHEMERAL = 32768
DIST_PORT = 20000


def dist_port(value: Any, data: Any) -> Found:
    if value >= EPHEMERAL:
        return (f"port {value} is in Linux's ephemeral range ({EPHEMERAL} and up): an outgoing "
                "connection may hold it when rank 0 binds it")
    return port(value, data)


SECRET_NAME = re.compile(r"[a-z0-9][a-z0-9_.-]{0,63}")  # what names a secret


def secret_name(value: Any, data: Any) -> Found:
    """A secret's NAME, never the key pasted in its place."""
    if SECRET_NAME.fullmatch(value) and not validators.key_shaped(value):
        return None
    return "must be the NAME of a secret (lower-case letters, digits, . _ -), never the key itself"


def plain(problem: Callable[[Any], str | None]) -> Check:
    return lambda value, data: problem(value)


_ENV_NAME = re.compile(r"^[A-Z_][A-Z0-9_]*$")


def environment(value: Any, data: Any) -> Found:
    """A mapping of POSIX variable names, none of them one the product sets itself."""
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


def flag_words(value: Any, data: Any) -> Found:
    """Raw command-line words: a --flag first, and not too many (render checks each flag)."""
    if value and not value[0].startswith("--"):
        return f"must start with a --flag, got {value[0]!r}"
    if len(value) > MAX_EXTRA_ARGS:
        return f"has {len(value)} words; at most {MAX_EXTRA_ARGS}"
    return None


def instances(value: Any, data: Any) -> Found:
    """``auto`` or a number of servers per host."""
    if isinstance(value, str):
        return None if value == AUTO else f"must be auto or a number, got {value!r}"
    return between(1, MAX_INSTANCES)(value, data)


def warmup_mode(value: Any, data: Any) -> Found:
    if value is False:  # YAML reads a bare ``off`` as false
        return None
    return one_of(*WARMUP_MODES)(value, data)


# --- host data's checks: its values come untyped (no annotation checks them first), so each of
# these checks the type it needs itself ---

INSECURE_KEY = "allow_insecure_urls"


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)  # True is an int in Python


def whole(low: int, high: int | None, must: str) -> Check:
    def check(value: Any, data: Any) -> Found:
        fits = _is_int(value) and low <= value and (high is None or value <= high)
        return None if fits else f"{must}, got {value!r}"
    return check


def profile_fix() -> str:
    return (f"set sglang_profile = 'path/to/profile.yaml' (or a shipped profile's name: "
            f"{', '.join(profile_yaml.shipped())}) in group data")


def profile_path(value: Any, data: Any) -> Found:
    """A profile's path or shipped name; none on a host that only routes."""
    if not value:
        return None
    if not isinstance(value, str) or not value.strip():
        return Wrong(f"no serving profile for this host ({value!r} is not a path)", profile_fix())
    return validators.text_problem(value)


def listen_port(value: Any, data: Any) -> Found:
    """A port a service may bind without privileges (host data's: its type unchecked)."""
    if not _is_int(value) or value < 1:
        return f"must be a positive integer, a port from 1024 to 65535, got {value!r}"
    return None if 1024 <= value <= 65535 else \
        f"must be a port from 1024 to 65535, got {value!r}"


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


# A yes/no key's words, in any case: data files write True or False, and pyinfra's --data passes
# true/false as bools, 1/0 as ints and any other word as text (a bare bool() made "no" a yes).
_TRUTH = {"true": True, "yes": True, "on": True, "1": True,
          "false": False, "no": False, "off": False, "0": False}
FLAG_WORDS = "true/false, yes/no, on/off or 1/0"


def truth(value: Any) -> bool | None:
    """A yes/no key's value as a bool; None when it is none of its words."""
    if isinstance(value, bool):
        return value
    return _TRUTH.get(str(value).lower()) if isinstance(value, int | str) else None


def flag(value: Any, data: Any) -> Found:
    return None if truth(value) is not None else f"must be {FLAG_WORDS}, got {_shown(value)}"


def form(pattern: re.Pattern[str] | str, example: str) -> Check:
    """A value that ends up in package names, paths or commands: its strict form. ``example``
    is "WHAT, e.g. VALUE" (the fix)."""
    compiled = re.compile(pattern) if isinstance(pattern, str) else pattern
    what = example.partition(", e.g.")[0]

    def check(value: Any, data: Any) -> Found:
        if isinstance(value, bool):
            return Wrong(f"must be {what}, got {value!r}", example)
        text = str(value) if isinstance(value, int | str) else None  # a branch may be 580
        if text is not None and compiled.fullmatch(text):
            return None
        return Wrong(f"{_shown(value)} is not {what}", example)
    return check


def _name_problem(value: Any) -> str | None:
    """What is wrong with a secret's NAME, never saying the value: the key itself may have been
    pasted in its place."""
    if not isinstance(value, str) or not SECRET_NAME.fullmatch(value):
        return "is not the NAME of a secret (lower-case letters, digits, . _ -; at most 64)"
    if validators.key_shaped(value):
        return "is not the NAME of a secret: it looks like a key or token"
    return None


def secret_for(example: str) -> Check:
    def check(value: Any, data: Any) -> Found:
        wrong = _name_problem(value)
        return Wrong(f"the value {wrong}", f"the NAME of a secret, e.g. {example}, with its "
                     f"value in secrets = {{'{example}': ...}}") if wrong else None
    return check


def url(value: Any, data: Any) -> Found:
    """A repository, index or endpoint the hosts fetch from as root: https, unless host data
    ``allow_insecure_urls`` is yes."""
    if not isinstance(value, str):
        return Wrong(f"must be a URL string, got {type(value).__name__} {value!r}",
                     "write https://HOST[:PORT]/PATH")
    wrong = validators.url_problem(value, truth(data.get(INSECURE_KEY)) is True)
    if wrong is None:
        return None
    fix = (f"use https://, or set {INSECURE_KEY} = True in host data where plain http is "
           "intended (a lab)" if wrong.endswith("tampered with")
           else "write https://HOST[:PORT]/PATH")
    return Wrong(wrong, fix)


def http_url(value: Any, data: Any) -> Found:
    if not isinstance(value, str):
        return f"must be a URL string, got {type(value).__name__}"
    return validators.url_problem(value, allow_http=True)


def address(value: Any, data: Any) -> Found:
    if isinstance(value, str) and not validators.host_problem(value):
        return None
    return f"{value!r} is neither an IP address nor a host name"


def known(choices: Collection[str], what: str, fix_default: str = "") -> Check:
    def check(value: Any, data: Any) -> Found:
        if isinstance(value, str | int) and str(value) in choices:
            return None
        name = str(value) if isinstance(value, str | int) else value
        return Wrong(f"unknown {what} {name!r}", f"one of {', '.join(choices)}{fix_default}")
    return check


def secret_value(value: Any, data: Any) -> Found:
    """Secrets go into root-only files one per line and into HTTP headers: one line of
    printable ASCII, without surrounding spaces (a trailing newline is a copy-paste slip)."""
    if not isinstance(value, str):
        return f"must be a string, got {type(value).__name__}"
    if not value.strip():
        return "is empty"
    wrong = validators.control_char(value)
    if wrong:
        return wrong + " (strip the value read from its file)"
    if not value.isascii() or value != value.strip():
        return "must be printable ASCII without surrounding spaces"
    return None


# What AWS access keys and Hugging Face tokens are made of: one line, nothing an INI file or a
# shell reads specially.
_CREDENTIAL = re.compile(r"[A-Za-z0-9/+=_.-]{8,256}")
CREDENTIAL_FORM = "must be one line of 8 to 256 letters, digits or / + = _ . -"


def credential(name: str, needs: str | None = None) -> Check:
    """A credential written to a root-only file (AWS's is INI); ``needs``: the key that must
    come with it (an AWS key id needs its secret)."""
    def check(value: Any, data: Any) -> Found:
        wrong = secret_value(value, data)
        if wrong is None and not _CREDENTIAL.fullmatch(value):
            return Wrong(CREDENTIAL_FORM, f"set {name} to the credential exactly as issued")
        if wrong is None and needs and data.get(needs) is None:
            return Wrong(CREDENTIAL_FORM, f"set {needs} to the credential exactly as issued",
                         key=needs)
        return wrong
    return check


def secret_map(value: Any, data: Any) -> Found:
    """Secret names to values (neither printed: a key may have been pasted as a name)."""
    if not isinstance(value, Mapping):
        return f"must be a mapping of secret names to values, got {type(value).__name__}"
    found = []
    for name, secret in value.items():
        named = _name_problem(name)
        if named:
            found.append(Wrong(f"a name in it {named}", "name each secret, e.g. "
                               "sglang-api-key, and give the key as its value", key="secrets"))
            continue
        wrong = secret_value(secret, data)
        if wrong:
            found.append(Wrong(str(wrong), "one line: the value itself, read from a file, "
                               "never committed", key=f"secrets.{name}"))
    return found


def list_of(pattern: str, what: str, fix: str | None = None) -> Check:
    """A list of ``what`` in ``pattern``'s form; none (a falsy value): none."""
    compiled = re.compile(pattern)

    def check(value: Any, data: Any) -> Found:
        if not value:
            return None
        if isinstance(value, str) or not isinstance(value, list | tuple):
            return f"must be a list of {what}s, got {value!r}"
        wrong = [v for v in value if not isinstance(v, str) or not compiled.fullmatch(v)]
        if not wrong:
            return None
        said = f"{repr(wrong[0])[:60]} is not a {what}"
        return Wrong(said, fix) if fix else said
    return check


# GPU health finding ids such as ``xid-94``
finding_ids = list_of(r"[a-z][a-z0-9-]{1,40}", "finding id", "ids as the deploy names them: "
                      "xid-79, ecc-uncorrectable, remap-pending, remap-failure, fabric, ...")
user_names = list_of(r"[a-z_][a-z0-9_.-]{0,31}\$?", "user name")  # as useradd takes them


def names(value: Any) -> list[str]:
    """A comma-separated text, or a list, as the names it holds: ``engine, weights``."""
    if not value:
        return []
    words = value if isinstance(value, list | tuple) else str(value).split(",")
    return [str(w).strip() for w in words if str(w).strip()]


def subset_of(choices: tuple[str, ...]) -> Check:
    def check(value: Any, data: Any) -> Found:
        unknown = sorted(set(names(value)) - set(choices))
        return f"unknown {', '.join(map(repr, unknown))}" if unknown else None
    return check


def both(first: Check, then: Check) -> Check:
    def check(value: Any, data: Any) -> Found:
        return first(value, data) or then(value, data)
    return check


def listed(choices: Collection[str], what: str) -> Check:
    def check(value: Any, data: Any) -> Found:
        return None if str(value) in choices else \
            Wrong(f"unknown {what} {value}", f"one of {', '.join(choices)}")
    return check


def on_branch(branch_key: str, default: str) -> Check:
    def check(value: Any, data: Any) -> Found:
        branch = str(data.get(branch_key) or default)
        return None if str(value).startswith(f"{branch}.") else Wrong(
            f"{value} is not on branch {branch}",
            f"use a {branch}.x version or change {branch_key}")
    return check


def open_flavour(value: Any, data: Any) -> Found:
    if value == "open":
        return None
    return (f"{value!r} refused: B200 (Blackwell) runs only on NVIDIA's open kernel modules; "
            "the proprietary flavour loads, then fails (RmInitAdapter failed) and nvidia-smi "
            "finds no devices")


def sha256(value: Any, data: Any) -> Found:
    if re.fullmatch(r"[0-9a-f]{64}", str(value)):
        return None
    return f"{value!r} is not a sha256 (64 lower-case hex digits)"


_GROUP = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")


def group_name(value: Any, data: Any) -> Found:
    """Said in messages and compared, never run, but held to a file name's characters."""
    if isinstance(value, str) and _GROUP.fullmatch(value):
        return None
    return f"{_shown(value)} is not a group name (letters, digits, . _ -; at most 63)"


# A Linux interface name: at most 15 bytes (IFNAMSIZ - 1), no '/', ':' or white space; held to
# the characters interface names are made of in practice.
_IFNAME = r"[A-Za-z0-9][A-Za-z0-9_.-]{0,14}"
# NCCL's prefixes: '^' excludes the listed interfaces, '=' matches names exactly.
_NEGATABLE = re.compile(rf"[\^=]?{_IFNAME}(,{_IFNAME}){{0,15}}")
_PLAIN_IFNAMES = re.compile(rf"{_IFNAME}(,{_IFNAME}){{0,15}}")


def interfaces(negatable: bool) -> Check:
    """Network interface names, comma-separated; ``negatable``: with NCCL's ``^``/``=`` prefix
    (gloo takes names only)."""
    pattern = _NEGATABLE if negatable else _PLAIN_IFNAMES

    def check(value: Any, data: Any) -> Found:
        if isinstance(value, str) and pattern.fullmatch(value):
            return None
        return f"{_shown(value)} is not a comma-separated list of network interface names"
    return check


_HCA = r"[A-Za-z0-9][A-Za-z0-9_.-]{0,31}(:[0-9]{1,3})?"
_HCAS = re.compile(rf"[\^=]?{_HCA}(,{_HCA}){{0,31}}")


def hca_list(value: Any, data: Any) -> Found:
    """NCCL_IB_HCA: adapter names with optional ports (``mlx5_0:1``) and NCCL's ``^``/``=``."""
    if isinstance(value, str) and _HCAS.fullmatch(value):
        return None
    return f"{_shown(value)} is not a comma-separated list of InfiniBand adapters (mlx5_0[:PORT])"
