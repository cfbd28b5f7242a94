"""``sglang-fleet check --inventory INVENTORY``: every host's profile and host data, read as a
deploy and a roll read them, checked by every phase of ``check`` without connecting; a problem
several hosts share is said once, naming them.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from sglang_fleet.cli import output
from sglang_fleet.config import checking, profile, profile_yaml
from sglang_fleet.config.checks import AUTO
from sglang_fleet.errors import InputError, Problem

if TYPE_CHECKING:
    from pyinfra.api.host import Host


def main(inventory: str, data: list[str], as_json: bool) -> int:
    hosts, reports = check(inventory, data)
    merged = merge(reports)
    if as_json:
        print(json.dumps({
            "inventory": inventory, "ok": merged.ok,
            "hosts": [{"host": name, "serving": serving, "ok": reports[name].ok,
                       "sglang_version": launch.version if (launch := reports[name].launch)
                       else None,
                       "architecture": reports[name].architecture}
                      for name, serving in hosts.items()],
            **{kind: output.as_json(getattr(merged, kind))
               for kind in ("errors", "warnings", "notes")}}, indent=2))
        return 0 if merged.ok else 1
    output.show_report(merged)
    if not merged.ok:
        return 1
    serving = [name for name, is_serving in hosts.items() if is_serving]
    print(f"{inventory}: ok: {len(serving)} serving host{'s' if len(serving) > 1 else ''} "
          f"({', '.join(serving)})" + _versions(reports, serving))
    return 0


def _versions(reports: dict[str, checking.Report], serving: list[str]) -> str:
    """``, SGLang 0.5.23`` (each release the hosts render for, once)."""
    found = sorted({r.launch.version for n in serving if (r := reports[n]).launch})
    return f", SGLang {', '.join(found)}" if found else ""


def check(inventory: str, data: list[str]) -> tuple[dict[str, bool], dict[str, checking.Report]]:
    """Every host of the inventory (name -> serving) and what the check found on each."""
    from sglang_fleet.fleet import inventory as fleet

    loaded = fleet.load(inventory, fleet.parse_data(data))
    if not fleet.serving_hosts(loaded):
        raise InputError.one(inventory, "sglang_profile", "no serving hosts",
                             "give hosts a serving profile in their group data")
    hosts = {host.name: fleet.is_serving(host) for host in loaded}
    reports = {host.name: serving_host(host) if fleet.is_serving(host) else other_host(host)
               for host in loaded}
    for router in loaded.get_group(fleet.ROUTERS_GROUP, None) or []:
        try:  # what deploys/router.py and a roll read of a router host (its keys, its URL)
            fleet.RouterConfig.from_host(router)
        except InputError as err:
            reports[router.name].add(err.problems)
    return hosts, reports


def other_host(host: Host) -> checking.Report:
    """A host that serves nothing (a router's): its host data."""
    from sglang_fleet import hostconfig as hostdata

    report = checking.Report()
    try:
        hostdata.check_host(host)
    except InputError as err:
        report.add(err.problems)
    return report


def serving_host(host: Host) -> checking.Report:
    """A serving host: its profile as the deploy reads it, then every phase of ``check``; where
    the deploy's reading stops, the profile's own phases still run."""
    from sglang_fleet import hostconfig as hostdata
    from sglang_fleet.hostconfig import preflight

    report = checking.Report()
    try:
        prof = hostdata.profile_for(host)
    except InputError as err:
        report.add(err.problems)
        _rest_of(report, host)
        _blame_overrides(report, host)
        return report
    checking.check_loaded(report, prof, set(), lambda p: p)  # its instances resolved already
    try:  # and the deploy's own checks (its group, its GPUs, its ports), as a roll runs them
        preflight.launches(host, prof, preflight.Facts(gpu_count=hostdata.gpu_count(host)))
    except InputError as err:
        report.add(err.problems)
    _blame_overrides(report, host)
    return report


def _blame_overrides(report: checking.Report, host: Host) -> None:
    """An error about a key the profile file set, which the file alone does not have, is the
    overrides' doing (a rule between keys, the sizing, the release's rules): it names where
    they were written, not the file, which would be edited in vain."""
    from sglang_fleet import hostconfig

    cfg = hostconfig.lenient(host)[0]
    written = list(dict.fromkeys(cfg.sglang_overrides.sources.values()))
    if not written or not cfg.sglang_profile:
        return
    path = str(profile_yaml.locate(cfg.sglang_profile))
    if all(p.source != path for p in report.errors):
        return
    alone = checking.check_profile(path, gpus=cfg.gpu_count or 8,
                                   allow_insecure_urls=cfg.allow_insecure_urls)
    own = {p.key for p in alone.errors}
    report.errors = [dataclasses.replace(p, source=", ".join(written))
                     if p.source == path and p.key not in own else p
                     for p in report.errors]


def _rest_of(report: checking.Report, host: Host) -> None:
    """The phases the deploy's reading did not reach, with the host's data as far as it is
    right."""
    from sglang_fleet import hostconfig

    cfg, refused = hostconfig.lenient(host)
    if "sglang_overrides" in refused:
        report.note(cfg.source, "sglang_profile", "the profile was not checked: it is read "
                    "with the host data's overrides, which must be right first (above)")
        return
    if not cfg.sglang_profile:
        return  # said: no profile to read
    try:
        loaded = profile.load_all(cfg.sglang_profile, cfg.sglang_overrides,
                                  cfg.sglang_overrides.sources,
                                  allow_insecure_urls=cfg.allow_insecure_urls)
    except InputError as err:
        report.add(err.problems)
        return
    report.add(loaded.problems)
    checking.check_loaded(report, loaded.profile, set(loaded.refused),
                          _sized_for(report, cfg.gpu_count, cfg.source))


def _sized_for(report: checking.Report, gpus: int | None,
               source: str) -> Callable[[Any], Any]:
    """``parallel.instances: auto`` for the host's gpu_count; without one (said by the
    deploy's reading) the host's first server stands for them all."""
    def resolve(prof: profile.Profile) -> profile.Profile:
        if prof.parallel.instances != AUTO:
            return prof
        if gpus is not None:
            return prof.for_gpus(gpus, f"{source.removeprefix('pyinfra data of ')} "
                                       "(host data gpu_count)")
        report.note(source, "parallel.instances", "auto, and no usable gpu_count (above): "
                    "the rules were applied to one server")
        return checking.with_defaults(prof, ["parallel.instances"])

    return resolve


def merge(reports: dict[str, checking.Report]) -> checking.Report:
    """The hosts' reports as one: each problem once, naming the hosts that share it."""
    from sglang_fleet.roll.planning import grouped

    merged = checking.Report()
    for kind in ("errors", "warnings", "notes"):
        found: dict[str, list[Problem]] = {name: getattr(r, kind) for name, r in reports.items()
                                           if getattr(r, kind)}
        problems = grouped({n: InputError(p) for n, p in found.items()}).problems if found \
            else []
        setattr(merged, kind, problems)
    return merged
