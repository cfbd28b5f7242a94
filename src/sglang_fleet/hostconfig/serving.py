"""The profile a pyinfra host serves: its profile file plus overrides from host and group data.

    # inventories/group_data/all.py
    sglang_profile = "qwen3.6-27b-mtp"      # or a path to your own profile
    # inventories/group_data/b200.py
    sglang_overrides = {"memory": {"max_running_requests": 64}}
    # on the command line
    pyinfra inventories/b200.py deploys/sglang.py --data sglang.memory.page_size=64

Overrides merge key by key across every data level (group data, host data, ``--data``), so a
host can change one key without repeating the rest of its group's overrides.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from pyinfra.api.host import Host

from sglang_fleet.config import profile, validators
from sglang_fleet.config.schema import AUTO
from sglang_fleet.errors import InputError, Problem
from sglang_fleet.facts.nvidia import SmiReport
from sglang_fleet.ops.secretfile import SECRET_NAME

PROFILE_KEY = "sglang_profile"
OVERRIDES_KEY = "sglang_overrides"
DOTTED_PREFIX = "sglang."
INSECURE_KEY = "allow_insecure_urls"
# Host data URLs: repositories, indexes and endpoints the hosts fetch from as root.
URL_KEYS = ("engine_find_links", "nvidia_repo_base_url", "s3_endpoint_url", "router_index_url",
            "router_find_links")
# Seconds, with the largest value that still makes sense (a day).
SECONDS_KEYS = ("startup_budget_seconds", "drain_budget_seconds")
# Secret values: written to root-only files, one line each.
SECRET_VALUE_KEYS = ("aws_access_key_id", "aws_secret_access_key", "hf_token")


def _levels(host: Host) -> Iterable[Mapping[str, Any]]:
    """Each data level of the host, lowest priority first (pyinfra lists highest first)."""
    for level in reversed(host.data.datas):
        yield level() if callable(level) else level


def _flatten(nested: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in nested.items():
        if isinstance(value, Mapping) and value:
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def overrides(host: Host) -> dict[str, Any]:
    """Every profile override that applies to ``host``, merged across data levels."""
    merged: dict[str, Any] = {}
    for level in _levels(host):
        nested = level.get(OVERRIDES_KEY)
        if nested is not None and not isinstance(nested, Mapping):
            raise InputError.one(f"pyinfra data of {host.name}", OVERRIDES_KEY,
                                 f"must be a mapping of profile keys, got {nested!r}",
                                 "write e.g. {'memory': {'max_running_requests': 64}}")
        merged.update(_flatten(nested or {}))
        for key, value in level.items():
            if key.startswith(DOTTED_PREFIX):
                merged[key.removeprefix(DOTTED_PREFIX)] = value
    return merged


def allow_insecure_urls(host: Host) -> bool:
    """Host data ``allow_insecure_urls``: plain http for repositories, indexes and endpoints
    (the lab serves http; a B200 site should not)."""
    value = host.data.get(INSECURE_KEY)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise InputError.one(f"pyinfra data of {host.name}", INSECURE_KEY,
                             f"must be True or False, got {value!r}",
                             f"{INSECURE_KEY} = True (only where plain http is intended)")
    return value


def _secret_value_problem(value: object) -> str | None:
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


def _url_problems(host: Host, insecure: bool) -> list[tuple[str, str, str]]:
    found = []
    for key in URL_KEYS:
        value = host.data.get(key)
        if value is None:
            continue
        wrong = (validators.url_problem(value, insecure) if isinstance(value, str)
                 else f"must be a URL string, got {type(value).__name__} {value!r}")
        if wrong:
            fix = (f"use https://, or set {INSECURE_KEY} = True in host data where plain http "
                   "is intended (a lab)" if wrong.endswith("tampered with")
                   else "write https://HOST[:PORT]/PATH")
            found.append((key, wrong, fix))
    return found


def _value_problems(host: Host) -> list[tuple[str, str, str]]:
    data, found = host.data, []
    for key in SECONDS_KEYS:
        value = data.get(key)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                                  or not 1 <= value <= 86400):
            found.append((key, f"must be a whole number of seconds from 1 to 86400, got "
                          f"{value!r}", "e.g. 1800"))
    count = data.get("gpu_count")
    if count is not None and (not isinstance(count, int) or isinstance(count, bool)
                              or not 1 <= count <= 1024):
        found.append(("gpu_count", f"must be a positive integer, got {count!r}",
                      "the number of GPUs the host must show, e.g. 8"))
    for key in SECRET_VALUE_KEYS:
        value = data.get(key)
        wrong = _secret_value_problem(value) if value is not None else None
        if wrong:
            found.append((key, wrong, "one line: the value itself, read from a file"))
    secrets = data.get("secrets")
    if secrets is not None and not isinstance(secrets, Mapping):
        found.append(("secrets", f"must be a mapping of secret names to values, got "
                      f"{type(secrets).__name__}", "secrets = {'sglang-api-key': ...}"))
    for name, value in (secrets or {}).items() if isinstance(secrets, Mapping) else ():
        wrong = _secret_value_problem(value)
        if wrong:
            found.append((f"secrets.{name}", wrong, "one line: the value itself, read from "
                          "a file, never committed"))
    address = data.get("sglang_address")
    if address is not None and (not isinstance(address, str) or validators.host_problem(address)):
        found.append(("sglang_address", f"{address!r} is neither an IP address nor a host "
                      "name", "the address other machines reach this host at"))
    return found


# Host data that ends up in package names, paths or commands: the strict form of each.
FORMS: dict[str, tuple[re.Pattern[str], str]] = {
    "nvidia_driver_branch": (re.compile(r"[0-9]{3,4}"), "a driver branch, e.g. 580"),
    "nvidia_driver_version": (re.compile(r"[0-9]{3,4}(\.[0-9]{1,4}){1,3}"),
                              "an exact driver version, e.g. 580.95.05"),
    "cuda_toolkit": (re.compile(r"[0-9]{1,2}-[0-9]{1,2}"), "a toolkit package suffix, e.g. 12-9"),
    "engine_cuda": (re.compile(r"[0-9]{1,2}\.[0-9]{1,2}"), "a CUDA release, e.g. 13.0"),
    "job_estimate": (re.compile(r"[0-9]{1,12},[0-9]{1,9}"),
                     "COMPLETIONS,TOKENS, e.g. 900000,1000"),
    "router_version": (re.compile(r"[0-9]{1,4}(\.[0-9]{1,6}){1,3}((a|b|rc)[0-9]{1,4})?"
                                  r"(\.post[0-9]{1,4})?"), "a release, e.g. 0.3.2"),
    "router_api_key_secret": (SECRET_NAME, "the NAME of a secret, e.g. sglang-api-key"),
    "router_admin_api_key_secret": (SECRET_NAME,
                                    "the NAME of a secret, e.g. sglang-router-admin-key"),
}


def _form_problems(host: Host) -> list[tuple[str, str, str]]:
    found = []
    for key, (form, example) in FORMS.items():
        value = host.data.get(key)
        if value is None or isinstance(value, bool):
            if isinstance(value, bool):
                found.append((key, f"must be {example.partition(', e.g.')[0]}, got {value!r}",
                              example))
            continue
        text = str(value) if isinstance(value, int | str) else None
        if text is None or not form.fullmatch(text):
            shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."
            if key.endswith("_secret"):  # it may be the key itself: never print it
                shown = "the value"
            found.append((key, f"{shown} is not {example.partition(', e.g.')[0]}", example))
    for key in ("router_host",):
        value = host.data.get(key)
        if value is not None and (not isinstance(value, str) or validators.host_problem(value)):
            found.append((key, f"{value!r} is neither an IP address nor a host name",
                          "the address the router listens on, e.g. 0.0.0.0"))
    url = host.data.get("router_url")
    if url is not None:
        wrong = (validators.url_problem(url, allow_http=True) if isinstance(url, str)
                 else f"must be a URL string, got {type(url).__name__}")
        if wrong:
            found.append(("router_url", wrong, "e.g. http://10.0.0.11:30080"))
    for key, usual in (("router_port", 30080), ("router_metrics_port", 29000)):
        port = host.data.get(key)
        if port is not None and (not isinstance(port, int) or isinstance(port, bool)
                                 or not 1024 <= port <= 65535):
            found.append((key, f"must be a port from 1024 to 65535, got {port!r}",
                          f"e.g. {usual} (ports below 1024 are privileged)"))
    return found


def check_host(host: Host) -> None:
    """Host data a deploy reads, validated before any host changes (InputError listing all)."""
    source = f"pyinfra data of {host.name}"
    insecure = allow_insecure_urls(host)
    found = _url_problems(host, insecure) + _value_problems(host) + _form_problems(host)
    if found:
        raise InputError([Problem(source, key, wrong, fix) for key, wrong, fix in found])


GPU_COUNT_KEY = "gpu_count"


def gpu_count(host: Host, smi: SmiReport | None = None) -> int | None:
    """How many GPUs ``host`` has: what nvidia-smi lists there (``smi``, when the caller is
    connected to it and it works), else host data ``gpu_count``; the two must agree.

        gpu_count(host, host.get_fact(NvidiaSmi))   # 8
    """
    declared = host.data.get(GPU_COUNT_KEY)
    seen = len(smi.gpus) if smi is not None and smi.ok else None
    if seen is not None and declared is not None and seen != declared:
        raise InputError.one(f"pyinfra data of {host.name}", GPU_COUNT_KEY,
                             f"nvidia-smi on {host.name} lists {seen} GPU(s), host data says "
                             f"{declared}", "find the missing GPU first (nvidia-smi -q, the "
                             "kernel log for an Xid 79: fallen off the bus), or set gpu_count "
                             f"to {seen} to serve from what the host has")
    return seen if seen is not None else declared


def _auto_gpus(host: Host, smi: SmiReport | None, loaded: profile.Profile) -> tuple[int, str]:
    """The GPU count ``instances: auto`` divides, and what it was read from."""
    count = gpu_count(host, smi)
    if count is not None:
        seen = smi is not None and smi.ok
        return count, f"{host.name} ({'nvidia-smi' if seen else 'host data gpu_count'})"
    why = (f"nvidia-smi on {host.name}: {smi.error}," if smi is not None and smi.error
           else "the fleet's plan (router workers, roll, status) is read before connecting,")
    raise InputError.one(loaded.source_of("parallel.instances"), "parallel.instances",
                         f"auto needs {host.name}'s GPU count: {why} and host data has no "
                         f"{GPU_COUNT_KEY}", f"set {GPU_COUNT_KEY} = 8 (the host's GPUs) in "
                         "host data, or parallel.instances to a number")


def profile_for(host: Host, smi: SmiReport | None = None) -> profile.Profile:
    """Check ``host``'s data, then load, override and validate the profile it serves, for its
    GPUs (``parallel.instances: auto``: one server per tp x dp of them; ``smi`` is nvidia-smi's
    list when the caller is connected to the host, ``gpu_count`` in host data otherwise)."""
    source = f"pyinfra data of {host.name}"
    path = host.data.get(PROFILE_KEY)
    if not isinstance(path, str) or not path.strip():
        raise InputError.one(source, PROFILE_KEY, "no serving profile for this host"
                             + (f" ({path!r} is not a path)" if path else ""),
                             f"set {PROFILE_KEY} = 'path/to/profile.yaml' (or a shipped profile's "
                             f"name: {', '.join(profile.shipped())}) in group data")
    wrong = validators.text_problem(path)
    if wrong:
        raise InputError.one(source, PROFILE_KEY, wrong, "the path of a profile YAML file")
    check_host(host)
    loaded = profile.load(path, overrides(host), source,
                          allow_insecure_urls=allow_insecure_urls(host))
    if loaded.parallel.instances != AUTO:
        gpu_count(host, smi)  # a host that lost a GPU is said so whatever the profile asks
        return loaded
    return loaded.for_gpus(*_auto_gpus(host, smi, loaded))
