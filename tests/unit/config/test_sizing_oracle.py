"""Differential test: the sizing's rule against each release's own code. The functions that
size the mamba pool (``handle_max_mamba_cache`` / ``_handle_max_mamba_cache``), count the slots
a request takes (``_calculate_mamba_ratio``) and cap max running requests
(``_resolve_max_num_reqs`` / ``resolve_max_num_reqs``) are read from the release's wheel
(unpacked by scripts/sglang_oracle.py), compiled alone and run with their inputs answered as a
one-GPU hybrid model answers them (their module imports torch and CUDA kernels). They must take
from the KV budget what ``sizing.reserved`` says, and a size from ``sizing.size`` must give the
target under the release's own cap."""

from __future__ import annotations
import __future__

import ast
import logging
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest

from sglang_fleet.config import sizing
from sglang_fleet.remote import capacity
from tests.unit.stages.compiled.test_kernel_caches import sglang_source

pytestmark = pytest.mark.oracle

RELEASES = ("0.5.10", "0.5.12", "0.5.13", "0.5.15", "0.5.16", "0.5.17", "0.5.19", "0.5.21",
            "0.5.23")
FILES = ("sglang/srt/mem_cache/kv_cache_configurator.py",
         "sglang/srt/model_executor/model_runner_kv_cache_mixin.py")
SIZERS = ("handle_max_mamba_cache", "_handle_max_mamba_cache")
CAPS = ("_resolve_max_num_reqs", "resolve_max_num_reqs")
PER_SLOT = 150 << 20  # bytes of conv + ssm state per slot (Qwen3.6-27B: about 0.14 GiB)
GIB = 1 << 30
# (strategy, overlap schedule, radix cache): extra_buffer with and without overlap, no_buffer
STRATEGIES = (("extra_buffer", True, True), ("extra_buffer", False, True),
              ("no_buffer", True, True))


def _functions(version: str) -> tuple[dict[str, Any], ast.Module]:
    """The file that sizes the mamba pool, its top-level constants and the function defs."""
    root = sglang_source(version)
    for name in FILES:
        path = root / name
        if path.exists() and any(f"def {s}(" in path.read_text() for s in SIZERS):
            tree = ast.parse(path.read_text())
            consts: dict[str, Any] = {}
            for node in tree.body:
                if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and \
                        all(isinstance(t, ast.Name) for t in node.targets):
                    for target in node.targets:
                        consts[target.id] = node.value.value  # type: ignore[attr-defined]
            return consts, tree
    pytest.fail(f"SGLang {version}: no {' or '.join(SIZERS)} in {', '.join(FILES)}")


def _compiled(version: str, names: tuple[str, ...], scope: dict[str, Any]) -> Callable[..., Any]:
    """The first of ``names`` defined in the release's file, compiled alone into ``scope``."""
    _, tree = _functions(version)
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name in names:
            module = ast.Module(body=[node], type_ignores=[])
            code = compile(module, f"<sglang {version} {node.name}>", "exec",
                           flags=__future__.annotations.compiler_flag, dont_inherit=True)
            exec(code, scope)  # the release's own function, read from its wheel
            function: Callable[..., Any] = scope[node.name]
            return function
    pytest.fail(f"SGLang {version}: none of {names}")


def _runner(version: str, slots: int, requests: int, draft: int, strategy: str,
            overlap: bool, radix: bool, context: int = 262144) -> tuple[Any, dict[str, Any]]:
    """A model runner (or configurator) and the module scope its functions read, answering
    as a one-GPU server with these arguments."""
    extra = strategy.startswith("extra_buffer")
    schedule = SimpleNamespace(
        max_running_requests=requests, max_mamba_cache_size=slots,
        mamba_full_memory_ratio=0.9, disable_overlap_schedule=not overlap,
        disable_radix_cache=not radix, speculative_num_draft_tokens=draft or None,
        enable_dp_attention=False, dp_size=1, max_total_tokens=None,
        enable_mamba_extra_buffer=lambda: extra, enable_mamba_extra_buffer_lazy=lambda: False)
    mamba = SimpleNamespace(enable_linear_replayssm_spec=False, linear_replayssm_cache_len=16,
                            enable_mamba_extra_buffer=extra,
                            enable_mamba_extra_buffer_lazy=False)

    def override(_: str, **values: Any) -> None:  # ServerArgs.override / context.override
        for name, value in values.items():
            setattr(schedule, name, value)

    schedule.override = override

    consts, _ = _functions(version)
    scope: dict[str, Any] = {
        **consts, "logger": logging.getLogger("sglang-oracle"), "logging": logging,
        "get_schedule": lambda: schedule, "get_memory": lambda: schedule,
        "get_spec": lambda: schedule, "get_exec": lambda: SimpleNamespace(mamba=mamba),
        "get_context": lambda: SimpleNamespace(override=override),
        "envs": SimpleNamespace(SGLANG_OPT_MAMBA_SKIP_DECODE_LOCK=SimpleNamespace(
            get=lambda: False)),
        "mamba_extra_buffer_enabled": lambda: extra,
        "mamba_extra_buffer_lazy_enabled": lambda: False,
        "get_mamba_tracking_slots": lambda *, extra_buffer, overlap, lazy=False:
            0 if not extra_buffer else 1 if lazy else 2 if overlap else 1,
        "_pd_prefill_skips_mamba_spec_state": lambda: False,
    }
    params = SimpleNamespace(mamba_cache_per_req=PER_SLOT, layers=list(range(48)))
    runner = SimpleNamespace(
        server_args=schedule, mambaish_config=SimpleNamespace(mamba2_cache_params=params),
        spec_algorithm=SimpleNamespace(is_none=lambda: not draft), dp_size=1, attn_dp_size=1,
        pp_size=1, ps=SimpleNamespace(attn_dp_size=1, pp_size=1), hybrid_gdn_config=None,
        hybrid_kda_config=None, extra_mamba_cache_bytes_per_req=0,
        fused_entry_bytes=lambda _: None,
        model_config=SimpleNamespace(context_len=context, num_hidden_layers=64))
    ratio = _compiled(version, ("_calculate_mamba_ratio",), scope)
    runner._calculate_mamba_ratio = lambda: ratio(runner)
    return runner, scope


def _strategy_args(version: str, strategy: str, overlap: bool, radix: bool) -> dict[str, str]:
    """The logged server_args the capacity reader sees for these flags."""
    return {"mamba_scheduler_strategy": strategy, "disable_overlap_schedule": str(not overlap),
            "disable_radix_cache": str(not radix)}


@pytest.mark.parametrize("version", RELEASES)
@pytest.mark.parametrize(("strategy", "overlap", "radix"), STRATEGIES)
def test_the_slots_take_what_the_release_takes(version: str, strategy: str, overlap: bool,
                                               radix: bool) -> None:
    for slots, requests, draft in ((24, 48, 4), (240, 48, 4), (240, 48, 0), (300, 64, 3),
                                   (7, 48, 4), (1000, 100, 4)):
        runner, scope = _runner(version, slots, requests, draft, strategy, overlap, radix)
        handle = _compiled(version, SIZERS, scope)
        rest = 100.0  # GiB the pools share
        kv = handle(runner, rest)
        ratio = runner._calculate_mamba_ratio()
        assert ratio == capacity.slots_per_request(
            _strategy_args(version, strategy, overlap, radix), version)
        expected = sizing.reserved(sizing._era(version), slots, requests, draft, ratio)
        assert (rest - kv) * GIB == pytest.approx(expected * PER_SLOT, rel=1e-9), \
            (version, slots, requests, draft)


@pytest.mark.parametrize("version", RELEASES)
def test_the_computed_size_gives_the_target_under_the_releases_cap(version: str) -> None:
    """The seed: 24 slots of 5 give 4 running requests; 48 x 5 slots give 48, with the KV
    cache the sizing leaves (here the floor, one 262,144-token request)."""
    for target in (48, 4, 200):
        runner, scope = _runner(version, target * 5, target, 4, "extra_buffer", True, True)
        cap = _compiled(version, CAPS, scope)
        assert cap(runner, 262144) == target, (version, target)
    runner, scope = _runner(version, 24, 48, 4, "extra_buffer", True, True)
    assert _compiled(version, CAPS, scope)(runner, 1_000_000) == 4


def test_the_functions_are_the_releases() -> None:
    """What the comparison runs is the wheel's text: a release without the functions fails."""
    consts, tree = _functions("0.5.23")
    assert consts["MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO"] == 3
    names = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
    assert {"_handle_max_mamba_cache", "resolve_max_num_reqs", "_calculate_mamba_ratio"} <= names
