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

from sglang_fleet.config import docs, preflight, profile, releases, sizing, validators
from sglang_fleet.config.render import Launch, render
from sglang_fleet.errors import InputError


def _load(args: argparse.Namespace) -> tuple[profile.Profile, Launch]:
    """The profile and its first server's launch as a first start on a host of ``--gpus`` runs
    it (a target's size is the host's)."""
    prof = profile.load(args.profile, allow_insecure_urls=args.allow_insecure_urls)
    prof = sizing.apply(prof.for_gpus(args.gpus, f"a host of --gpus {args.gpus}"), None)
    return prof, render(prof, args.sglang_version)


def _gpus(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 1024:
        raise argparse.ArgumentTypeError(f"must be a number of GPUs from 1 to 1024, got {text!r}")
    return int(text)


def cmd_render(args: argparse.Namespace) -> int:
    _, launch = _load(args)
    if args.format == "json":
        print(json.dumps(launch.as_json(), indent=2))
    else:
        print(launch.as_shell())
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    prof, launch = _load(args)
    arch = preflight.resolve_architecture(prof, args.model_config)
    source = args.model_config or prof.model.config  # the profile's architecture: by render
    wrong = releases.architecture_problem(arch, launch.version) if arch and source else None
    if wrong and not any(w.startswith("--model-impl") for w in prof.extra_args):
        raise InputError.one(str(source), "architectures", wrong,
                             "check the model's config.json, or pin a release that serves it")
    preflight.require(prof, launch, arch)
    moves = validators.revision_warning(prof.model.source)
    if moves:  # valid, but not the same weights on every host: said, not refused
        print(f"warning: {prof.source_of('model.source')}: model.source: {moves}\n"
              f"    fix: {validators.REVISION_FIX}", file=sys.stderr)
    print(f"{args.profile}: ok for SGLang {launch.version}"
          + (f" ({arch})" if arch else " (no architecture known: hybrid-model rules skipped)"))
    return 0


def cmd_keys(args: argparse.Namespace) -> int:
    """Every profile key as a Markdown table, or the named keys' help (from their declarations,
    config/profile.py)."""
    for name in args.keys:
        fix = docs.unknown(name)
        if fix:
            raise InputError.one("sglang-fleet keys", name, "is not a profile key", fix)
    if not args.keys:
        print(docs.table(), end="")
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

    p = sub.add_parser("render", help="print the launch command and environment of a profile")
    p.add_argument("profile", help="a profile YAML file, or a shipped profile's name, e.g. "
                   "qwen3.6-27b-mtp")
    p.add_argument("--sglang-version", help=version_help)
    p.add_argument("--format", choices=["shell", "json"], default="shell")
    p.add_argument("--allow-insecure-urls", action="store_true", help=insecure_help)
    p.add_argument("--gpus", type=_gpus, default=8, help=gpus_help)
    p.set_defaults(func=cmd_render)

    p = sub.add_parser("check", help="validate a profile and apply SGLang's startup rules")
    p.add_argument("profile", help="a profile YAML file, or a shipped profile's name")
    p.add_argument("--sglang-version", help=version_help)
    p.add_argument("--allow-insecure-urls", action="store_true", help=insecure_help)
    p.add_argument("--model-config", help="the model's config.json (or its directory)")
    p.add_argument("--gpus", type=_gpus, default=8, help=gpus_help)
    p.set_defaults(func=cmd_check)

    p = sub.add_parser("keys", help="every profile key (type, default, SGLang flag, meaning), "
                       "or the named ones")
    p.add_argument("keys", nargs="*", metavar="KEY", help="a key, dotted, e.g. memory.page_size")
    p.set_defaults(func=cmd_keys)
