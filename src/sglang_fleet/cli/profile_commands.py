"""``sglang-fleet render`` and ``check``: a serving profile rendered into the launch a host
runs, and checked against SGLang's startup rules (nothing is contacted); ``keys``: what each
profile key is.

    sglang-fleet render qwen3.6-27b-mtp --format json
    sglang-fleet check my-profile.yaml --model-config config.json
    sglang-fleet keys memory.page_size
"""

from __future__ import annotations

import argparse
import json
import sys

from sglang_fleet.cli import output, usage
from sglang_fleet.config import checking, docs, releases
from sglang_fleet.errors import InputError

DEFAULT_GPUS = 8  # a B200 host


def _gpus(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 1024:
        raise argparse.ArgumentTypeError(f"must be a number of GPUs from 1 to 1024, got {text!r}")
    return int(text)


def _check(args: argparse.Namespace) -> checking.Report:
    """Every phase of ``check`` on the profile: what render refuses, check refuses."""
    return checking.check_profile(args.profile, version=args.sglang_version,
                                  config=args.model_config, gpus=args.gpus or DEFAULT_GPUS,
                                  allow_insecure_urls=args.allow_insecure_urls)


def cmd_render(args: argparse.Namespace) -> int:
    """The launch, once the profile passes every check ``check`` makes (its warnings and
    notes on stderr: standard output is the launch alone)."""
    report = _check(args)
    output.show(report.errors, "error", sys.stderr)
    output.show(report.warnings, "warning", sys.stderr)
    if not report.ok or report.launch is None:
        output.show(report.notes, "note", sys.stderr)
        return 1
    if args.format == "json":
        print(json.dumps(report.launch.as_json(), indent=2))
    else:
        print(report.launch.as_shell())
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    """Every problem of every phase, on standard error; warnings, notes and the verdict on
    standard output (or all of it as one JSON object)."""
    _usage(args)
    if args.inventory is not None:
        from sglang_fleet.cli import fleet_check

        return fleet_check.main(args.inventory, args.data, args.json)
    report = _check(args)
    if args.json:
        print(json.dumps({"profile": args.profile, **output.report_json(report)}, indent=2))
        return 0 if report.ok else 1
    output.show_report(report)
    if not report.ok or report.launch is None:
        return 1
    arch = report.architecture
    print(f"{args.profile}: ok for SGLang {report.launch.version}"
          + (f" ({arch})" if arch else " (no architecture known: hybrid-model rules skipped)"))
    return 0


def _usage(args: argparse.Namespace) -> None:
    """A profile, or --inventory with the options that go with it: else a usage error."""
    error = args.parser.error
    if args.inventory is None:
        if args.profile is None:
            error("give a profile (a file or a shipped profile's name), or --inventory "
                  "INVENTORY")
        if args.data:
            error("--data goes with --inventory (a profile's keys: write them in it)")
        return
    if args.profile is not None:
        error("give a profile or --inventory, not both")
    given = [option for option, value in (
        ("--sglang-version", args.sglang_version), ("--model-config", args.model_config),
        ("--gpus", args.gpus), ("--allow-insecure-urls", args.allow_insecure_urls)) if value]
    if given:
        error(f"{', '.join(given)}: for one profile; with --inventory each host's data "
              "decides (engine.version, model.config, gpu_count, allow_insecure_urls: "
              "--data sets them for a check)")


def cmd_keys(args: argparse.Namespace) -> int:
    """Every profile key as a Markdown table, or the named keys' help (from their declarations,
    config/profile.py)."""
    for name in args.keys:
        fix = docs.unknown(name)
        if fix:
            raise InputError.one("sglang-fleet keys", name, "is not a profile key", fix)
    if not args.keys:
        print(docs.TABLE.text(), end="")
    for name in args.keys:
        print(docs.describe(name))
    return 0


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The profile commands' parsers, in the order ``--help`` lists them."""
    insecure_help = ("accept a plain http:// engine.index_url (as host data "
                     "allow_insecure_urls does for a deploy)")
    gpus_help = ("the host's GPU count, which parallel.instances: auto divides into servers "
                 "(default 8, a B200 host); the first server's launch is shown")
    version_help = f"SGLang release to render for (default: the profile's pin; known: " \
                   f"{releases.supported()[0]} … {releases.supported()[-1]})"
    profile_help = "a profile YAML file, or a shipped profile's name, e.g. qwen3.6-27b-mtp"
    config_help = ("the model's config.json (or its directory): its architectures[0] picks "
                   "the hybrid-model rules (default: the profile's model.config, else "
                   "model.architecture)")

    p = usage.command(
        sub, "render", help="print the launch command and environment of a profile",
        description="Print the command line and environment SGLang is started with for a "
        "profile: its first server on a host of --gpus GPUs, for the profile's release (or "
        "--sglang-version). It runs every check that check runs first, and prints nothing "
        "for a profile that fails one. Nothing is contacted. Exit status: 0 printed, 1 a "
        "problem in the profile, 2 a usage error.",
        examples=["sglang-fleet render qwen3.6-27b-mtp",
                  "sglang-fleet render my-profile.yaml --sglang-version 0.5.12 --format json"])
    usage.files(p.add_argument("profile", help=profile_help))
    p.add_argument("--sglang-version", type=usage.release, help=version_help)
    p.add_argument("--format", choices=["shell", "json"], default="shell")
    p.add_argument("--allow-insecure-urls", action="store_true", help=insecure_help)
    usage.files(p.add_argument("--model-config", help=config_help))
    p.add_argument("--gpus", type=_gpus, help=gpus_help)
    p.set_defaults(func=cmd_render)

    p = usage.command(
        sub, "check", help="validate a profile (or an inventory's) and apply SGLang's "
        "startup rules",
        description="Validate a profile and apply the startup rules of its SGLang release "
        "(for hybrid models with speculative decoding) without contacting anything: every "
        "problem of every phase in one run (errors on stderr, each with its fix; warnings, "
        "notes on what could not be checked, and the verdict on stdout). With --inventory, "
        "every host's profile and host data as a deploy or a roll reads them (without "
        "connecting), each problem once with the hosts that share it. Exit status: 0 fine "
        "(warnings allowed), 1 a problem, 2 a usage error; --json prints one JSON object "
        "(errors, warnings, notes) with the same status.",
        examples=["sglang-fleet check qwen3.6-27b-mtp",
                  "sglang-fleet check my-profile.yaml --model-config /models/m/config.json",
                  "sglang-fleet check --inventory inventories/b200.py "
                  "--data sglang.engine.version=0.5.23 --json"])
    usage.files(p.add_argument("profile", nargs="?", help=profile_help))
    usage.files(p.add_argument("--inventory", metavar="INVENTORY",
                               help="check every host of a pyinfra inventory instead"))
    p.add_argument("--data", action="append", default=[], metavar="KEY=VALUE",
                   type=usage.data_pair, help="with --inventory: pyinfra data as a deploy "
                   "or roll --data gives it, e.g. sglang.memory.page_size=64")
    p.add_argument("--sglang-version", type=usage.release, help=version_help)
    p.add_argument("--allow-insecure-urls", action="store_true", help=insecure_help)
    usage.files(p.add_argument("--model-config", help=config_help))
    p.add_argument("--gpus", type=_gpus, help=gpus_help)
    p.add_argument("--json", action="store_true", help="print the report as one JSON object")
    p.set_defaults(func=cmd_check, parser=p)

    p = usage.command(
        sub, "keys", help="every profile key (type, default, SGLang flag, meaning), "
        "or the named ones",
        description="Print every profile key as a Markdown table (type, default, SGLang "
        "flag, meaning), or each named key's help. Exit status: 0, or 1 for a name that is "
        "not a profile key.",
        examples=["sglang-fleet keys", "sglang-fleet keys memory.page_size parallel.tp"])
    p.add_argument("keys", nargs="*", metavar="KEY", help="a key, dotted, e.g. memory.page_size")
    p.set_defaults(func=cmd_keys)
