"""Preflight: the rules SGLang enforces for hybrid (mamba / linear-attention) models with
speculative decoding, applied to a rendered launch before any host is touched.

    problems = check(profile, launch, architecture="Qwen3_5ForConditionalGeneration")

Rules are read from each release's ``sglang/srt/server_args.py`` (0.5.10 - 0.5.19) and
``sglang/srt/arg_groups/{overrides,mamba_hook,model_hook,speculative_hook}.py`` (0.5.20 - 0.5.23);
messages quote SGLang's own where it has one, and every fix is spelled for the release at hand.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from sglang_fleet import flags, model_config
from sglang_fleet.errors import InputError, Problem
from sglang_fleet.profile import Profile
from sglang_fleet.releases import at_least
from sglang_fleet.render import SPEC_V2_DEFAULT_FROM, SPEC_V2_ENV, Launch

_QWEN_HYBRID = ("Qwen3NextForCausalLM", "Qwen3_5ForConditionalGeneration",
                "Qwen3_5MoeForConditionalGeneration")
# Architectures whose _handle_mamba_radix_cache allows extra_buffer, by the release that first
# lists them (later releases keep every earlier entry).
_EXTRA_BUFFER_SINCE: dict[str, tuple[str, ...]] = {
    "0.5.10": _QWEN_HYBRID,
    "0.5.12": ("InternS2PreviewForConditionalGeneration", "MiniCPMV4_6ForConditionalGeneration"),
    "0.5.13": ("BailingMoeV2_5ForCausalLM",),
    "0.5.14": ("FalconH1ForCausalLM", "GraniteMoeHybridForCausalLM", "NemotronHForCausalLM",
               "NemotronHPuzzleForCausalLM"),
    "0.5.20": ("Qwen3_5ForCausalLM", "Qwen3_5MoeForCausalLM", "KimiLinearForCausalLM",
               "Qwen4ExpForConditionalGeneration", "MiniCPMV4_7ForConditionalGeneration",
               "BailingMoeV3ForCausalLM", "BailingMoeV3VLForConditionalGeneration",
               "Glm5NextForConditionalGeneration", "NemotronH_Omni_Reasoning_V3",
               "KimiK3ForConditionalGeneration", "InklingForConditionalGeneration",
               "InklingForConditionalGenerationMTP"),
}
# Hybrid models that use the mamba radix cache but never extra_buffer before they are listed above.
_NO_BUFFER_HYBRID = ("FalconH1ForCausalLM", "JetNemotronForCausalLM",
                     "JetVLMForConditionalGeneration", "GraniteMoeHybridForCausalLM",
                     "Lfm2ForCausalLM", "NemotronHForCausalLM", "NemotronHPuzzleForCausalLM")
# Before 0.5.14 the flag was --mamba-scheduler-strategy and "auto" meant no_buffer.
NEW_MAMBA_RULES_FROM = "0.5.14"
EAGLE_FAMILY = ("EAGLE", "EAGLE3")


def extra_buffer_archs(version: str) -> frozenset[str]:
    return frozenset(a for since, archs in _EXTRA_BUFFER_SINCE.items()
                     if at_least(version, since) for a in archs)


def is_hybrid(arch: str, version: str) -> bool:
    return arch in extra_buffer_archs(version) or arch in _NO_BUFFER_HYBRID


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


def _track_interval(c: _Ctx) -> Iterator[Problem]:
    track, page = c.a.get("mamba_track_interval"), c.a.get("page_size")
    draft = c.a.get("speculative_num_draft_tokens")
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


def _extra_buffer_unsupported(c: _Ctx, arch: str) -> Iterator[Problem]:
    if arch not in extra_buffer_archs(c.version):
        message = (f"mamba extra_buffer is not supported for {arch} model"
                   if not at_least(c.version, NEW_MAMBA_RULES_FROM)
                   else f"extra_buffer is not supported for {arch}; use no_buffer.")
        yield c.problem("mamba.strategy", message, f"use {c.strategy_flag} no_buffer")
    elif at_least(c.version, NEW_MAMBA_RULES_FROM) and c.a.get("linear_attn_backend") != "triton":
        backend = c.a.get("linear_attn_backend")
        yield c.problem("scheduler.linear_attn_backend",
                        f"extra_buffer is not supported for {arch}; use no_buffer. (extra_buffer "
                        f"needs --linear-attn-backend triton, got {backend})",
                        "set scheduler.linear_attn_backend: triton (the default)")


def _radix_disabled(c: _Ctx) -> Iterator[Problem]:
    if c.strategy in ("extra_buffer", "extra_buffer_lazy"):
        yield c.problem("scheduler.radix_cache",
                        f"mamba {c.strategy} is not compatible with --disable-radix-cache",
                        f"enable the radix cache (scheduler.radix_cache: true) or use "
                        f"{c.strategy_flag} no_buffer")


def _old_rules(c: _Ctx, arch: str) -> Iterator[Problem]:
    """0.5.10 - 0.5.13.post1: --mamba-scheduler-strategy; auto means no_buffer."""
    strategy = "no_buffer" if c.strategy == "auto" else c.strategy
    if strategy == "extra_buffer":
        yield from _extra_buffer_unsupported(c, arch)
        yield from _track_interval(c)
        if (c.spec_on and not at_least(c.version, SPEC_V2_DEFAULT_FROM)
                and c.launch.env.get(SPEC_V2_ENV) not in ("1", "true", "True")):
            yield c.problem("env", f"SGLang {c.version} needs {SPEC_V2_ENV}=1 for speculative "
                            "decoding with extra_buffer", f"remove {SPEC_V2_ENV} from env")
    elif c.spec_on:
        yield c.problem("mamba.strategy",
                        f"Speculative decoding for {arch} is not compatible with radix cache when "
                        f"using --mamba-scheduler-strategy {strategy}.",
                        "use --mamba-scheduler-strategy extra_buffer with SGLANG_ENABLE_SPEC_V2=1 "
                        "(mamba.strategy: extra_buffer)")


def _new_rules(c: _Ctx, arch: str) -> Iterator[Problem]:
    """0.5.14 and later: --mamba-radix-cache-strategy with extra_buffer_lazy; auto resolves."""
    strategy, overlap = c.strategy, not c.a.get("disable_overlap_schedule")
    page = c.a.get("page_size")
    if strategy == "auto":
        supported = (arch in extra_buffer_archs(c.version)
                     and c.a.get("linear_attn_backend") == "triton")
        wants = overlap or (page is not None and page > 1)
        if wants and supported:
            strategy = "extra_buffer"
        else:
            strategy, overlap = "no_buffer", False
    if strategy in ("extra_buffer", "extra_buffer_lazy"):
        yield from _extra_buffer_unsupported(c, arch)
        yield from _track_interval(c)
        if (strategy == "extra_buffer_lazy" and c.spec_on
                and not at_least(c.version, "0.5.20")):
            yield c.problem("mamba.strategy", "extra_buffer_lazy unsupported with spec.",
                            f"use {c.strategy_flag} extra_buffer")
        return
    if page not in (1, None):
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


def _hybrid(c: _Ctx) -> Iterator[Problem]:
    arch = c.arch
    if arch is None or not is_hybrid(arch, c.version):
        return
    if c.a.get("disable_radix_cache"):
        yield from _radix_disabled(c)
    elif at_least(c.version, NEW_MAMBA_RULES_FROM):
        yield from _new_rules(c, arch)
    else:
        yield from _old_rules(c, arch)


def resolve_architecture(profile: Profile, model_config_path: str | None = None) -> str | None:
    """The model's config.json wins over the profile's ``model.architecture``."""
    path = model_config_path or profile.model.config
    if path:
        return model_config.architecture(path)
    return profile.model.architecture


def check(profile: Profile, launch: Launch, architecture: str | None) -> list[Problem]:
    """Every rule the release would enforce at startup that this launch breaks."""
    c = _Ctx(profile, launch, flags.load(launch.version), architecture)
    return [*_speculative(c), *_hybrid(c)]


def require_host(profile: Profile, launches: list[Launch], host_name: str,
                 gpu_count: int | None) -> None:
    """Everything a host's launches must satisfy before the host is touched: SGLang's rules,
    and enough GPUs for every instance."""
    arch = resolve_architecture(profile)
    problems = [p for launch in launches[:1] for p in check(profile, launch, arch)]
    need = profile.parallel.instances * profile.parallel.gpus_per_instance
    if gpu_count is not None and need > gpu_count:
        problems.append(Problem(profile.source_of("parallel.instances"), "parallel.instances",
                                f"{profile.parallel.instances} instance(s) of tp x dp = "
                                f"{profile.parallel.gpus_per_instance} GPUs need {need}, "
                                f"{host_name} has {gpu_count}",
                                "lower parallel.instances, tp or dp"))
    if problems:
        raise InputError(problems)


def require(profile: Profile, launch: Launch, architecture: str | None) -> None:
    """``check``, raising InputError when anything is wrong."""
    problems = check(profile, launch, architecture)
    if problems:
        raise InputError(problems)
