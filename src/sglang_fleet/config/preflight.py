"""Preflight: the rules SGLang enforces for hybrid (mamba / linear-attention) models with
speculative decoding, applied to a rendered launch before any host is touched.

    problems = check(profile, launch, architecture="Qwen3_5ForConditionalGeneration")

Rules are read from each release's ``sglang/srt/server_args.py`` (0.5.10 - 0.5.14) and
``sglang/srt/arg_groups/{overrides,mamba_hook,model_hook}.py`` (0.5.15 - 0.5.23), in the order
the release applies them; messages quote SGLang's own where it has one, and every fix is spelled
for the release at hand. ``check_server_args`` is what the release's ``ServerArgs`` refuses
(proven against the real code by tests/unit/config/test_preflight_oracle.py); ``check`` adds
the checks SGLang makes later, while sizing the memory pools (``LATER_CHECKS``, cited by file
and line).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from typing import Any

from packaging.version import Version

from sglang_fleet.config import flags, model_config, multinode
from sglang_fleet.config.profile import Profile
from sglang_fleet.config.releases import DATA, at_least
from sglang_fleet.config.render import SPEC_V2_DEFAULT_FROM, SPEC_V2_ENV, Launch
from sglang_fleet.errors import InputError, Problem

# Per release, read from its source by ``scripts/sglang_oracle.py mamba-archs``: the architectures
# that reach the mamba radix-cache rules, those allowed extra_buffer, and (0.5.10 - 0.5.13.post1)
# those whose radix cache SGLang turns off instead.
MAMBA_ARCHS = DATA / "mamba_archs.json"
# Before 0.5.14 the flag was --mamba-scheduler-strategy and "auto" meant no_buffer.
NEW_MAMBA_RULES_FROM = "0.5.14"
EAGLE_FAMILY = ("EAGLE", "EAGLE3")
FLA_CHUNK_SIZE = 64  # sglang/srt/layers/attention/fla/chunk_delta_h.py CHUNK_SIZE
EXTRA_BUFFERS = ("extra_buffer", "extra_buffer_lazy")


@cache
def _mamba_table() -> dict[str, dict[str, list[str]]]:
    table: dict[str, dict[str, list[str]]] = json.loads(MAMBA_ARCHS.read_text())
    return table


def _archs(version: str, kind: str) -> frozenset[str]:
    """The release's list, or the nearest earlier release's for one without its own."""
    known = [v for v in _mamba_table() if at_least(version, v)] or [next(iter(_mamba_table()))]
    return frozenset(_mamba_table()[max(known, key=Version)][kind])


def extra_buffer_archs(version: str) -> frozenset[str]:
    return _archs(version, "extra_buffer")


def is_hybrid(arch: str, version: str) -> bool:
    """Whether ``arch`` reaches the release's mamba radix-cache rules."""
    return arch in _archs(version, "radix_cache")


@dataclass(frozen=True)
class _Ctx:
    profile: Profile
    launch: Launch
    table: flags.FlagTable
    arch: str | None

    @property
    def a(self) -> dict[str, Any]:
        return self.launch.args

    @property
    def version(self) -> str:
        return self.launch.version

    @property
    def strategy_flag(self) -> str:
        return (self.table.option_for("mamba_radix_cache_strategy")
                or "--mamba-scheduler-strategy")

    @property
    def strategy(self) -> str:
        value = self.a.get("mamba_radix_cache_strategy", self.a.get("mamba_scheduler_strategy"))
        return str(value)

    @property
    def spec_on(self) -> bool:
        return self.a.get("speculative_algorithm") is not None

    def problem(self, key: str, message: str, fix: str) -> Problem:
        return Problem(self.profile.source_of(key), key, message, fix)


def _speculative(c: _Ctx) -> Iterator[Problem]:
    name = c.a.get("speculative_algorithm")
    if name is None:
        return
    upper = str(name).upper()
    known = c.table.speculative_names | c.table.speculative_aliases
    if upper not in known:
        yield c.problem("speculative.algorithm", f"Unknown speculative algorithm name: {name}",
                        "MTP for Qwen3.5/3.6 is spelled NEXTN or EAGLE; SGLang "
                        f"{c.version} knows {', '.join(sorted(known))}")
        return
    if upper not in EAGLE_FAMILY and upper not in c.table.speculative_aliases:
        return
    steps, topk = c.a.get("speculative_num_steps"), c.a.get("speculative_eagle_topk")
    draft = c.a.get("speculative_num_draft_tokens")
    if topk == 1 and steps is not None and draft is not None and draft != steps + 1:
        yield c.problem("speculative.num_draft_tokens",
                        f"with eagle_topk 1 SGLang overrides num_draft_tokens {draft} to "
                        f"num_steps + 1 = {steps + 1} (speculative_num_draft_tokens is adjusted "
                        "to speculative_num_steps + 1 when speculative_eagle_topk == 1)",
                        f"set speculative.num_draft_tokens: {steps + 1}")


def _track_interval(c: _Ctx, page: Any) -> Iterator[Problem]:
    """0.5.10 - 0.5.13: messages; 0.5.14+ (mamba_hook.validate_mamba_extra_buffer): bare asserts."""
    track, draft = c.a.get("mamba_track_interval"), c.a.get("speculative_num_draft_tokens")
    if track is None:
        return
    if draft is not None and track < draft:
        yield c.problem("mamba.track_interval",
                        f"mamba_track_interval {track} must be greater than or equal to "
                        f"speculative_num_draft_tokens {draft}",
                        f"set mamba.track_interval to at least {draft} (--mamba-track-interval)")
    if page is not None and track % page:
        yield c.problem("mamba.track_interval",
                        f"mamba_track_interval {track} must be divisible by page_size {page}",
                        f"set mamba.track_interval to a multiple of {page}, e.g. "
                        f"{max(page, track // page * page)}")


def _chunk_message(version: str, page: int) -> str:
    """The assert's text: server_args.py (0.5.10 - 0.5.18), arg_groups/overrides.py (0.5.19+)."""
    if not at_least(version, "0.5.13"):
        return ("For SSM models with extra buffer, either FLA_CHUNK_SIZE or page_size must be "
                f"divisible by the other, got FLA_CHUNK_SIZE={FLA_CHUNK_SIZE}, "
                f"self.page_size={page}")
    name = "page_size" if at_least(version, "0.5.15") else "self.page_size"
    return ("For SSM models, either chunk_size or page_size must be divisible by the other, "
            f"got chunk_size={FLA_CHUNK_SIZE}, {name}={page}")


def _fla_chunk(c: _Ctx, page: Any) -> Iterator[Problem]:
    """Every release, after the track-interval checks: FLA chunks (64 tokens, unless the model's
    config sets mamba_chunk_size) and pages must nest."""
    if page is None or max(FLA_CHUNK_SIZE, page) % min(FLA_CHUNK_SIZE, page) == 0:
        return
    yield c.problem("memory.page_size", _chunk_message(c.version, page),
                    f"set memory.page_size to a divisor or multiple of {FLA_CHUNK_SIZE}")


def _old_rules(c: _Ctx, arch: str) -> Iterator[Problem]:
    """0.5.10 - 0.5.13.post1, ``ServerArgs._handle_mamba_radix_cache``: "auto" was already
    no_buffer; the extra-buffer architecture check comes first, whatever the radix cache."""
    strategy = "no_buffer" if c.strategy == "auto" else c.strategy
    extra = strategy in EXTRA_BUFFERS
    page = c.a.get("page_size")
    if extra and arch not in extra_buffer_archs(c.version):
        yield c.problem("mamba.strategy", f"mamba extra_buffer is not supported for {arch} model",
                        f"use {c.strategy_flag} no_buffer")
        return
    if extra and c.a.get("disable_radix_cache"):
        yield c.problem("scheduler.radix_cache",
                        "mamba extra_buffer is not compatible with --disable-radix-cache",
                        f"enable the radix cache (scheduler.radix_cache: true) or use "
                        f"{c.strategy_flag} no_buffer")
    elif extra:
        if strategy == "extra_buffer_lazy" and c.a.get("speculative_num_draft_tokens") is not None:
            yield c.problem("mamba.strategy",  # 0.5.13 only: the first release with lazy
                            "extra_buffer_lazy is not yet supported with speculative decoding.",
                            f"use {c.strategy_flag} extra_buffer")
        yield from _track_interval(c, page)
        yield from _fla_chunk(c, page)
    elif c.spec_on and not c.a.get("disable_radix_cache"):
        yield c.problem("mamba.strategy",
                        f"Speculative decoding for {arch} is not compatible with radix cache when "
                        f"using --mamba-scheduler-strategy {strategy}.",
                        "use --mamba-scheduler-strategy extra_buffer (mamba.strategy: "
                        "extra_buffer) or turn the radix cache off (scheduler.radix_cache: false)")


def _supports_extra_buffer(c: _Ctx, arch: str) -> bool:
    return arch in extra_buffer_archs(c.version) and c.a.get("linear_attn_backend") == "triton"


def _extra_buffer_unsupported(c: _Ctx, arch: str) -> Iterator[Problem]:
    message = f"extra_buffer is not supported for {arch}; use no_buffer."
    if arch in extra_buffer_archs(c.version):
        yield c.problem("scheduler.linear_attn_backend",
                        f"{message} (extra_buffer needs --linear-attn-backend triton, got "
                        f"{c.a.get('linear_attn_backend')})",
                        "set scheduler.linear_attn_backend: triton (the default)")
    else:
        yield c.problem("mamba.strategy", message, f"use {c.strategy_flag} no_buffer")


def _new_extra_buffer(c: _Ctx, arch: str, strategy: str) -> Iterator[Problem]:
    """0.5.14+ validate_mamba_extra_buffer (server_args.py 0.5.14, arg_groups/mamba_hook.py)."""
    if not _supports_extra_buffer(c, arch):
        yield from _extra_buffer_unsupported(c, arch)
        return
    if (strategy == "extra_buffer_lazy" and c.a.get("speculative_num_draft_tokens") is not None
            and not at_least(c.version, "0.5.17")):  # 0.5.14 - 0.5.16; 0.5.17+ allow it
        yield c.problem("mamba.strategy", "extra_buffer_lazy unsupported with spec.",
                        f"use {c.strategy_flag} extra_buffer")
    yield from _track_interval(c, c.a.get("page_size"))
    yield from _fla_chunk(c, c.a.get("page_size"))


def _new_no_buffer(c: _Ctx, overlap: bool) -> Iterator[Problem]:
    """0.5.14+ validate_mamba_no_buffer."""
    if c.a.get("page_size") not in (1, None):
        yield c.problem("memory.page_size", "no_buffer only supports page_size=1.",
                        f"set memory.page_size: 1 or use {c.strategy_flag} extra_buffer")
    if overlap:
        yield c.problem("scheduler.overlap_schedule",
                        "no_buffer do not support overlap schedule. Try to set "
                        "disable_overlap_schedule=True.",
                        f"use {c.strategy_flag} extra_buffer, or set "
                        "scheduler.overlap_schedule: false")
    if c.a.get("attention_backend") == "trtllm_mha":
        yield c.problem("scheduler.attention_backend",
                        "no_buffer do not support trtllm_mha attention backend.",
                        f"use {c.strategy_flag} extra_buffer or another attention backend")


def _new_rules(c: _Ctx, arch: str) -> Iterator[Problem]:
    """0.5.14+: --mamba-radix-cache-strategy; with the radix cache off the rules return early
    (server_args.py 0.5.14 ``_handle_mamba_radix_cache``; overrides.py
    ``_mamba_radix_cache_resolution`` 0.5.15+), so any strategy starts."""
    if c.a.get("disable_radix_cache"):
        return
    strategy, overlap = c.strategy, not c.a.get("disable_overlap_schedule")
    page = c.a.get("page_size")
    if strategy == "auto":
        if (overlap or (page is not None and page > 1)) and _supports_extra_buffer(c, arch):
            strategy = "extra_buffer"
        else:
            strategy, overlap = "no_buffer", False
    if strategy in EXTRA_BUFFERS:
        yield from _new_extra_buffer(c, arch, strategy)
    else:
        yield from _new_no_buffer(c, overlap)


def _not_mamba(c: _Ctx, arch: str) -> Iterator[Problem]:
    """0.5.21+ arg_groups/model_hook.py handle_mamba_radix_cache: an explicit extra buffer on a
    model without mamba state would crash at prefill, so it is refused."""
    if (at_least(c.version, "0.5.21") and c.strategy in EXTRA_BUFFERS
            and not c.a.get("disable_radix_cache")):
        yield c.problem("mamba.strategy",
                        f"--mamba-radix-cache-strategy {c.strategy} needs mamba state, got {arch}.",
                        "remove mamba.strategy (auto) for a model without mamba layers")


def _spec_v2(c: _Ctx) -> Iterator[Problem]:
    """0.5.10 server_args._handle_speculative_decoding: with SGLANG_ENABLE_SPEC_V2 on, EAGLE
    refuses eagle_topk > 1 (0.5.11+ fall back to spec v1 instead)."""
    topk = c.a.get("speculative_eagle_topk")
    if (at_least(c.version, SPEC_V2_DEFAULT_FROM) or not c.spec_on or topk is None or topk <= 1
            or c.launch.env.get(SPEC_V2_ENV, "").lower() not in ("1", "true", "yes", "on")):
        return
    yield c.problem("speculative.eagle_topk",
                    "Spec v2 currently only supports topk = 1 for speculative decoding.",
                    f"set speculative.eagle_topk: 1, or {SPEC_V2_ENV}=0 in env")


def _hybrid(c: _Ctx) -> Iterator[Problem]:
    arch = c.arch
    if arch is None:
        return
    if not is_hybrid(arch, c.version):
        yield from _not_mamba(c, arch)
    elif at_least(c.version, NEW_MAMBA_RULES_FROM):
        yield from _new_rules(c, arch)
    else:
        yield from _old_rules(c, arch)


# Checks SGLang makes after ServerArgs, while sizing the memory pools (_calculate_mamba_ratio): the
# arguments are accepted, then the server dies at startup. Per release: where the assert is.
LAZY_NEEDS_OVERLAP = "Lazy extra buffer requires overlap schedule"
_MIXIN = "sglang/srt/model_executor/model_runner_kv_cache_mixin.py"
_CONFIGURATOR = "sglang/srt/mem_cache/kv_cache_configurator.py"
LATER_CHECKS: dict[str, tuple[str, str]] = {  # release: (file:line, what the line asserts)
    "0.5.13": (f"{_MIXIN}:249", LAZY_NEEDS_OVERLAP),
    "0.5.13.post1": (f"{_MIXIN}:249", LAZY_NEEDS_OVERLAP),
    "0.5.14": (f"{_MIXIN}:290", LAZY_NEEDS_OVERLAP),
    "0.5.15": (f"{_MIXIN}:309", LAZY_NEEDS_OVERLAP),
    "0.5.15.post1": (f"{_MIXIN}:309", LAZY_NEEDS_OVERLAP),
    "0.5.16": (f"{_CONFIGURATOR}:1588", LAZY_NEEDS_OVERLAP),
    "0.5.17": (f"{_CONFIGURATOR}:1680", LAZY_NEEDS_OVERLAP),
    "0.5.18": (f"{_CONFIGURATOR}:1834", LAZY_NEEDS_OVERLAP),
    "0.5.19": (f"{_CONFIGURATOR}:2066", LAZY_NEEDS_OVERLAP),
    "0.5.20": (f"{_CONFIGURATOR}:2223", LAZY_NEEDS_OVERLAP),
    "0.5.21": (f"{_CONFIGURATOR}:2252", LAZY_NEEDS_OVERLAP),
    "0.5.22": (f"{_CONFIGURATOR}:2756", LAZY_NEEDS_OVERLAP),
    "0.5.23": (f"{_CONFIGURATOR}:3075", LAZY_NEEDS_OVERLAP),
}


def later_checks(c: _Ctx) -> Iterator[Problem]:
    """LATER_CHECKS: _calculate_mamba_ratio asserts "Lazy extra buffer requires overlap schedule
    (--disable-overlap-schedule is incompatible)" when the lazy buffer is really in use."""
    arch = c.arch
    if (c.version not in LATER_CHECKS or arch is None or not is_hybrid(arch, c.version)
            or c.strategy != "extra_buffer_lazy" or c.a.get("disable_radix_cache")
            or not c.a.get("disable_overlap_schedule")):
        return
    where = LATER_CHECKS[c.version][0]
    yield c.problem("scheduler.overlap_schedule",
                    f"{LAZY_NEEDS_OVERLAP} (--disable-overlap-schedule is incompatible), "
                    f"asserted at startup by {where}",
                    f"set scheduler.overlap_schedule: true or use {c.strategy_flag} extra_buffer")


def architecture_rules(version: str) -> list[str]:
    """The rules ``check`` applies only when it knows the model's class (``_hybrid``,
    ``later_checks``): what a check without an architecture skipped."""
    if not at_least(version, NEW_MAMBA_RULES_FROM):
        rules = ["mamba.strategy extra_buffer: only for the model classes that support it, "
                 "and not with the radix cache off",
                 "speculative decoding with the radix cache: needs mamba.strategy "
                 "extra_buffer"]
    else:
        rules = ["mamba.strategy extra_buffer (auto picks it): only for the model classes "
                 "that support it, with scheduler.linear_attn_backend triton",
                 "mamba.strategy no_buffer: memory.page_size 1, no overlap schedule, no "
                 "trtllm_mha attention"]
    if at_least(version, "0.5.13") and not at_least(version, "0.5.17"):
        rules.append("mamba.strategy extra_buffer_lazy: not with speculative decoding")
    rules += ["mamba.track_interval: at least speculative.num_draft_tokens, a multiple of "
              "memory.page_size",
              f"memory.page_size: a divisor or multiple of the FLA chunk ({FLA_CHUNK_SIZE})"]
    if at_least(version, "0.5.21"):
        rules.append("mamba.strategy extra_buffer on a model without mamba layers: refused")
    if version in LATER_CHECKS:
        rules.append("mamba.strategy extra_buffer_lazy: needs the overlap schedule (asserted "
                     "at startup)")
    return rules


def resolve_architecture(profile: Profile, model_config_path: str | None = None) -> str | None:
    """The model's config.json wins over the profile's ``model.architecture``."""
    path = model_config_path or profile.model.config
    if path:
        return model_config.architecture(path)
    return profile.model.architecture


def check_server_args(profile: Profile, launch: Launch,
                      architecture: str | None) -> list[Problem]:
    """The rules the release's ``ServerArgs`` enforces (what
    tests/unit/config/test_preflight_oracle.py compares with the real code)."""
    c = _Ctx(profile, launch, flags.load(launch.version), architecture)
    return [*multinode.rules(profile, c.version, c.a), *_speculative(c), *_spec_v2(c),
            *_hybrid(c)]


def check(profile: Profile, launch: Launch, architecture: str | None) -> list[Problem]:
    """Every rule the release would enforce at startup that this launch breaks:
    ``check_server_args`` and the later checks of LATER_CHECKS."""
    c = _Ctx(profile, launch, flags.load(launch.version), architecture)
    return [*check_server_args(profile, launch, architecture), *later_checks(c),
            *multinode.product_rules(profile)]


def require_host(profile: Profile, launches: list[Launch], host_name: str,
                 gpu_count: int | None) -> None:
    """SGLang's rules, and enough GPUs for every instance (a multi-node member: its share)."""
    arch = resolve_architecture(profile)
    problems = [p for launch in launches[:1] for p in check(profile, launch, arch)]
    problems += multinode.gpu_problems(profile, host_name, gpu_count)
    InputError.raise_any(problems)
