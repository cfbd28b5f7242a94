"""Profile → the exact argv and environment of ``sglang.launch_server`` for one release.

    launch = render(profile, "0.5.23")
    launch.argv  # ['python', '-m', 'sglang.launch_server', '--model-path', ...]

Every flag is spelled in full as the release's own flag table spells it, checked against that
table, and the whole argv is parsed by a parser rebuilt from the table before it is returned.
"""

from __future__ import annotations

import difflib
import hashlib
import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any

from sglang_fleet import paths
from sglang_fleet.config import connection, flags, keys, multinode, releases
from sglang_fleet.config.multinode import Rank
from sglang_fleet.config.profile import Profile
from sglang_fleet.config.releases import at_least
from sglang_fleet.errors import InputError, Problem

# The keys' environment variables (from the host's root-only EnvironmentFile) and the flags the
# launcher (remote/start_server.py) hands them to SGLang as, in-process: never on the command line.
KEY_FLAGS = {paths.API_KEY_VAR: ("server.api_key_secret", "--api-key"),
             paths.ADMIN_API_KEY_VAR: ("server.admin_api_key_secret", "--admin-api-key")}
# 0.5.10 runs the overlap (spec v2) scheduler that extra_buffer needs only when this is set;
# 0.5.11 turned it on by default and 0.5.14 removed the variable (sglang/srt/environ.py).
SPEC_V2_ENV = "SGLANG_ENABLE_SPEC_V2"
SPEC_V2_DEFAULT_FROM = "0.5.11"

# Argument destinations that releases renamed, newest spelling first.
MAMBA_STRATEGY_DESTS = ("mamba_radix_cache_strategy", "mamba_scheduler_strategy")
RENAMED_DESTS = {
    MAMBA_STRATEGY_DESTS[0]: MAMBA_STRATEGY_DESTS,
    "tp_size": ("tp_size", "tensor_parallel_size"),
    "dp_size": ("dp_size", "data_parallel_size"),
}


@dataclass(frozen=True)
class Launch:
    """What to run: ``argv[0:3]`` is the launcher, ``env`` the extra environment, ``secrets``
    variable → secret name (the host's root-only environment file has the value), ``args``
    the argv as the release's parser reads it."""

    version: str
    argv: tuple[str, ...]
    env: dict[str, str]
    secrets: dict[str, str] = field(default_factory=dict)
    args: dict[str, Any] = field(default_factory=dict)
    instance: int = 0
    instances: int = 1
    rank: Rank | None = None  # a member of a multi-node group: rendered again with it

    @property
    def unit(self) -> str:
        return paths.server_unit(self.instance, self.instances)

    @property
    def port(self) -> int:
        return int(self.args["port"])

    def as_json(self) -> dict[str, Any]:
        return {"argv": list(self.argv), "env": dict(self.env)}

    def as_shell(self) -> str:
        env = [f"{k}={shlex.quote(v)}" for k, v in sorted(self.env.items())]
        words = [f"\"{w}\"" if w.startswith("${") else shlex.quote(w) for w in self.argv]
        lines, line = [], " ".join(["env", *env, *words[:3]] if env else words[:3])
        for word in words[3:]:
            if word.startswith("--"):
                lines.append(line)
                line = "  " + word
            else:
                line += " " + word
        lines.append(line)
        return " \\\n".join(lines)


def model_path(profile: Profile) -> str:
    """Where the weights are on the host: a host path as given, else ``staging_dir``."""
    source = profile.model.source
    return source if source.startswith("/") else staging_dir(source)


def normalized_source(source: str) -> str:
    """A staged source as the downloader reads it: ``s3://b/p/`` lists what ``s3://b/p`` does."""
    return source.rstrip("/") if source.startswith("s3://") else source


def _slug(source: str, limit: int | None = 96) -> str:
    """The source in file name characters, short enough for a name with its digest."""
    return re.sub(r"[^A-Za-z0-9._-]+", "--", source.split("://", 1)[1])[:limit].strip("-")


def staging_dir(source: str) -> str:
    """The directory a source is staged into: a slug and a digest of the normalized source.
    Slugs collide (``hf://org/model@v1`` and ``s3://org/model/v1`` are ``org--model--v1``):
    without the digest a change of source would keep serving the old weights."""
    source = normalized_source(source)
    digest = hashlib.sha256(source.encode()).hexdigest()[:12]
    return str(PurePosixPath(paths.MODELS) / f"{_slug(source)}-{digest}")


def legacy_staging_dir(source: str) -> str:
    """Where releases before the digest staged a source: reused when its manifest records the
    same source, so an upgrade does not download every model again."""
    return str(PurePosixPath(paths.MODELS) / _slug(source, None))


def _semantic_args(profile: Profile, instance: int) -> Iterator[tuple[str, str, Any]]:
    """(profile key, SGLang destination, value) for every key declared with a flag; a
    ``negated`` key's flag is set when it is false. Weights and port: the host's, instance's."""
    rendered = {"model.source": model_path(profile),
                "server.port": profile.server.port + instance}
    for key, value in keys.values(profile):
        if key.dest is not None:
            value = rendered.get(key.name, value)
            yield key.name, key.dest, (not value) if key.negated else value


def _resolve_dest(table: flags.FlagTable, dest: str) -> str | None:
    for candidate in RENAMED_DESTS.get(dest, (dest,)):
        option = table.option_for(candidate)
        if option:
            return option
    return None


def _value_problem(flag: flags.Flag, value: Any, version: str) -> str | None:
    if flag.choices is not None and value not in flag.choices:
        accepted = ", ".join(map(str, flag.choices))
        return f"SGLang {version} accepts {flag.option} {{{accepted}}}, not {value!r}"
    return None


def _render_semantic(profile: Profile, table: flags.FlagTable, instance: int,
                     problems: list[Problem]) -> list[str]:
    argv: list[str] = []
    for key, dest, value in _semantic_args(profile, instance):
        if value is None or value is False:
            continue
        option = _resolve_dest(table, dest)
        if option is None:
            problems.append(Problem(profile.source_of(key), key,
                                    f"SGLang {table.version} has no flag for {dest}",
                                    "remove the key or pin a release that has it"))
            continue
        flag = table.flags[option]
        if value is True and not flag.takes_value:
            argv.append(option)
            continue
        wrong = _value_problem(flag, value, table.version)
        if wrong:
            problems.append(Problem(profile.source_of(key), key, wrong,
                                    "use one of the accepted values"))
            continue
        argv += [option, str(value)]
    return argv


def _secrets(profile: Profile, table: flags.FlagTable, problems: list[Problem]) -> dict[str, str]:
    """Environment variable → secret name, for the keys the profile names."""
    names = {paths.API_KEY_VAR: profile.server.api_key_secret,
             paths.ADMIN_API_KEY_VAR: profile.server.admin_api_key_secret}
    secrets: dict[str, str] = {}
    for var, name in names.items():
        key, flag = KEY_FLAGS[var]
        if not name:
            continue
        if table.get(flag) is None:
            problems.append(Problem(profile.source_of(key), key,
                                    f"SGLang {table.version} has no {flag}",
                                    f"remove {key} or pin a release that has {flag}"))
        secrets[var] = name
    if len(secrets) == 2 and len(set(secrets.values())) == 1:
        problems.append(Problem(profile.source_of("server.admin_api_key_secret"),
                                "server.admin_api_key_secret",
                                "names the same secret as server.api_key_secret: every client "
                                "could then update weights or load adapters",
                                "name a secret of its own, e.g. sglang-admin-api-key"))
    return secrets


# Keys whose flag is the negation of the profile value (--disable-X for scheduler.X: true).
_INVERTED = {key.name for key in keys.declared(Profile) if key.negated}
# Flags that would write a key into the (world-readable) unit file.
_SECRET_FLAGS = ("--api-key", "--admin-api-key")
# gRPC in place of HTTP, or beside it (grpc_port); how each release with it refuses it with a key.
_GRPC_DESTS = ("smg_grpc_mode", "grpc_mode", "grpc_port")
GRPC_PORT_WITH_KEY = "the native gRPC listener bypasses HTTP auth middleware"
_REPEATABLE = ("_AppendAction", "_AppendConstAction", "_CountAction")


def _semantic_dests(profile: Profile) -> dict[str, str]:
    """SGLang destination -> the profile key that owns it (every spelling of renamed ones)."""
    owned = {dest: multinode.GROUP_KEY for dest in multinode.GROUP_DESTS}
    for key, dest, _ in _semantic_args(profile, 0):
        for spelling in RENAMED_DESTS.get(dest, (dest,)):
            owned[spelling] = key
    return owned


def _current_option(table: flags.FlagTable, dest: str) -> str | None:
    """How ``table``'s release spells the flag of ``dest`` (or of a renamed destination)."""
    for group in RENAMED_DESTS.values():
        if dest in group:
            return _resolve_dest(table, group[0])
    return table.option_for(dest)


def _unknown_hint(table: flags.FlagTable, option: str, owned: dict[str, str]) -> str:
    """The fix for a flag the release does not have: its new name, who has it, or a spelling."""
    holders = [v for v in releases.supported() if flags.load(v).get(option) is not None]
    if holders:
        dest = flags.load(holders[-1]).flags[option].dest
        renamed = _current_option(table, dest)
        if renamed:
            then = f"({option} is from SGLang {holders[0]} - {holders[-1]})"
            if dest in owned:
                return f"SGLang {table.version} spells it {renamed} {then}, and the profile " \
                       f"sets it: remove it from extra_args and set {owned[dest]}"
            return f"SGLang {table.version} spells it {renamed} {then}: write {renamed}"
        return f"only SGLang {holders[0]} - {holders[-1]} have it: remove it or pin one of those"
    close = sorted(o for o in table.flags if o.startswith(option))
    if close:
        return f"it abbreviates {', '.join(close[:4])}: write the flag in full"
    near = difflib.get_close_matches(option, list(table.flags), n=1, cutoff=0.75)
    if near:
        return f"did you mean {near[0]}?"
    return "check the spelling against `python -m sglang.launch_server -h`"


def _semantic_fix(key: str, flag: flags.Flag, value: str | None, rendered: bool) -> str:
    if key == multinode.GROUP_KEY:
        return ("remove it from extra_args: each member's rank and rank 0's address come from "
                "the inventory (host data sglang_group, parallel.dist_port)")
    if rendered:
        return f"remove it from extra_args: the profile's {key} renders it already"
    if not flag.takes_value:
        return f"remove it from extra_args and set {key}: " + \
            ("false" if key in _INVERTED else "true")
    return f"remove it from extra_args and set {key}" + (f": {value}" if value else "")


def _extra_args_flags(words: tuple[str, ...]) -> Iterator[tuple[str, str | None]]:
    """(option, its value if written inline or as the next word) for each --flag."""
    for i, word in enumerate(words):
        if not word.startswith("--"):
            continue
        option, eq, inline = word.partition("=")
        following = words[i + 1] if i + 1 < len(words) else None
        if following is not None and following.startswith("--"):
            following = None
        yield option, inline if eq else following


def _check_extra_args(profile: Profile, table: flags.FlagTable, rendered: list[str],
                      problems: list[Problem]) -> None:
    """Raw flags: exact current spelling, set once, never one a key owns, never a secret."""
    source = profile.source_of("extra_args")
    owned = _semantic_dests(profile)
    set_by_profile = {table.flags[w].dest for w in rendered if w in table.flags}
    seen: set[str] = set()

    def problem(message: str, fix: str) -> None:
        problems.append(Problem(source, "extra_args", message, fix))

    for option, value in _extra_args_flags(profile.extra_args):
        flag = table.get(option)
        if option in _SECRET_FLAGS or (flag and flag.dest in ("api_key", "admin_api_key")):
            problem(f"{option} would write the key into the unit file, which every local user "
                    "can read", "remove it; name the secret in server.api_key_secret (the key "
                    "comes from a root-only file on the host; server.admin_api_key_secret for "
                    "--admin-api-key)")
        elif flag is None:
            problem(f"SGLang {table.version} has no flag {option}",
                    _unknown_hint(table, option, owned))
        elif flag.dest in owned:
            setter = "the inventory" if owned[flag.dest] == multinode.GROUP_KEY else "the profile"
            problem(f"{option} is set by {setter} (its key {owned[flag.dest]}), not extra_args",
                    _semantic_fix(owned[flag.dest], flag, value, flag.dest in set_by_profile))
        elif flag.dest in _GRPC_DESTS and (grpc := _grpc_problem(profile, table, option,
                                                                 flag.dest)):
            problem(*grpc)
        elif flag.alias_of or flag.deprecated:
            new = flag.alias_of or table.option_for(flag.dest) or "its replacement"
            problem(f"{option} is deprecated in SGLang {table.version}", f"use {new}")
        elif flag.dest in seen and flag.action not in _REPEATABLE:
            problem(f"{option} is given twice (SGLang would silently keep the last)",
                    "keep one of them")
        seen.add(flag.dest if flag else option)


def _grpc_problem(profile: Profile, table: flags.FlagTable, option: str,
                  dest: str) -> tuple[str, str] | None:
    """(message, fix) for a gRPC flag (or SGLANG_GRPC_PORT) that cannot serve here."""
    if dest != "grpc_port":
        return (f"{option} makes SGLang {table.version} serve gRPC in place of HTTP on its port, "
                "which the gate, status, warm-up, the roll's drain and the router must know",
                f"remove it and set {connection.KEY}: grpc")
    native = f"remove {option} (smg does not call SGLang's native gRPC service)"
    if profile.server.api_key_secret or profile.server.admin_api_key_secret:
        return (f"SGLang {table.version} refuses {option} with --api-key/--admin-api-key "
                f"(server.api_key_secret, server.admin_api_key_secret): \"{GRPC_PORT_WITH_KEY}\"",
                native)
    if profile.parallel.instances == 1:
        return None
    return (f"{option} is one port for every server of a host (parallel.instances "
            f"{profile.parallel.instances}): the second to start cannot bind it",
            f"{native}, or set parallel.instances: 1")


def _architecture(profile: Profile, version: str, problems: list[Problem]) -> None:
    """A model class the release does not serve (a misspelling skips the hybrid rules)."""
    arch = profile.model.architecture
    if arch is None or any(w.startswith("--model-impl") for w in profile.extra_args):
        return  # --model-impl transformers serves classes outside SGLang's registry
    wrong = releases.architecture_problem(arch, version)
    if wrong:
        problems.append(Problem(profile.source_of("model.architecture"), "model.architecture",
                                wrong, "write config.json's architectures[0] exactly, or pin a "
                                "release that serves it"))


def _env(profile: Profile, version: str, instance: int) -> dict[str, str]:
    env = dict(profile.env)
    if profile.parallel.servers > 1:  # each instance on a GPU set of its own
        size = profile.parallel.gpus_per_instance
        env["CUDA_VISIBLE_DEVICES"] = ",".join(
            str(g) for g in range(instance * size, (instance + 1) * size))
    # 0.5.10 runs the overlap (spec v2) scheduler that extra_buffer wants only when asked; spec
    # v2 there takes topk 1 only ("Spec v2 currently only supports topk = 1"), so a profile with
    # a larger topk keeps the v1 scheduler.
    if profile.speculative.algorithm and not at_least(version, SPEC_V2_DEFAULT_FROM) and \
            (profile.speculative.eagle_topk or 1) <= 1:
        env.setdefault(SPEC_V2_ENV, "1")
    return env


def render(profile: Profile, version: str | None = None, instance: int = 0,
           rank: Rank | None = None) -> Launch:
    """Render ``profile`` for ``version`` (default: its pin); InputError if it can't.
    ``instance``: one of a host's servers (port + instance, its own GPUs); ``rank``: the
    host's place in its multi-node group."""
    source, key = "--sglang-version", ""
    if version is None:
        version = profile.engine.version
        source, key = profile.source_of("engine.version"), "engine.version"
    wrong = releases.version_problem(version)
    if wrong:
        raise InputError.one(source, key, wrong, releases.VERSION_FIX)
    table = flags.load(version)
    problems: list[Problem] = []
    args = _render_semantic(profile, table, instance, problems)
    args += multinode.group_args(profile, table, rank, problems)
    args += connection.grpc_args(profile, table, instance, problems)
    secrets = _secrets(profile, table, problems)
    _check_extra_args(profile, table, args, problems)
    if "SGLANG_GRPC_PORT" in profile.env and table.get("--grpc-port") and (grpc := _grpc_problem(
            profile, table, "SGLANG_GRPC_PORT", "grpc_port")):  # --grpc-port's fallback
        problems.append(Problem(profile.source_of("env"), "env.SGLANG_GRPC_PORT", *grpc))
    _architecture(profile, version, problems)
    InputError.raise_any(problems)
    args += profile.extra_args
    try:
        parsed = table.parse(args)
    except flags.ArgvError as exc:
        raise InputError.one(profile.source_of("extra_args"), "extra_args",
                             f"SGLang {version}'s parser rejects the command line: {exc}",
                             "correct the flag or its value") from None
    return Launch(version=version,
                  argv=("python", "-m", profile.engine.launcher, *args),
                  env=_env(profile, version, instance), secrets=secrets, args=parsed,
                  instance=instance, instances=profile.parallel.servers, rank=rank)


def render_all(profile: Profile, version: str | None = None,
               rank: Rank | None = None) -> list[Launch]:
    """One launch per server instance on a host (``rank``: its place in a multi-node group)."""
    return [render(profile, version, i, rank) for i in range(profile.parallel.servers)]
