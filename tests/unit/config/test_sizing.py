"""memory.target_running_requests: the size computed from one start's log (the seed's numbers,
and the simulator's startup of each era of SGLang's rule, started again with the size to see
the prediction hold), the profile it resolves into, and what a host remembers."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest

from sglang_fleet.config import profile, sizing
from sglang_fleet.config.render import Launch, render
from sglang_fleet.remote import capacity
from tests.conftest import field_profile
from tests.unit.remote.test_capacity import field_0_5_12
from tests.unit.remote.test_capacity_sim import startup_log

STRATEGY_FLAG = {"0.5.10": "--mamba-scheduler-strategy", "0.5.12": "--mamba-scheduler-strategy",
                 "0.5.13": "--mamba-scheduler-strategy"}
B200_GB = 183359 / 1024


def target_profile(release: str, target: int = 48, **memory: object) -> profile.Profile:
    """The shipped profile pinned to ``release`` with a target."""
    return field_profile({
        "engine.version": release, "memory.target_running_requests": target,
        **{f"memory.{k}": v for k, v in memory.items()}})


def first_launch(release: str, target: int = 48) -> Launch:
    return render(sizing.apply(target_profile(release, target), None))


def sim_flags(launch: Launch, *more: str) -> list[str]:
    """The launch's flags for the simulator, which reads the lab model (not the staged path)."""
    words = list(launch.argv[3:])
    at = words.index("--model-path")
    return words[:at] + words[at + 2:] + list(more)


# --- the seed's numbers ------------------------------------------------------------------------

def test_the_seeds_log_names_why_48_cannot_fit() -> None:
    """24 slots, 5 per request, 4 running, 30 GB free on 0.5.12: the slots for 48 requests come
    out of the KV cache (77,000 tokens), which would keep less than one 262,144-token request;
    the 30 GB free are outside the pools, and mem_fraction_static would have to pass 1 to give
    the pools the missing 51 GiB."""
    cap = capacity.parse(field_0_5_12(), "0.5.12")
    assert (cap.mamba_slots, cap.slots_per_request, cap.max_running_requests) == (24, 5, 4)
    assert round(cap.available_gpu_gb or 0) == 30
    plan = sizing.size(cap, 48, first_launch("0.5.12"), gpu_gb=B200_GB)
    assert plan.slots is None and plan.running == 4 and not plan.reached
    per_slot, per_token = 3.62 / 25, 8.4 / 77000  # the log's pool sizes; the pool has a pad
    left = 77000 - math.ceil((240 - 24) * per_slot / per_token)  # 0.5.12: the slots alone
    short = (262144 - left) * per_token
    reason = plan.reason or ""
    assert reason.startswith("memory.target_running_requests 48 needs 240 mamba slots (5 per "
                             f"request, {240 * per_slot:.1f} GiB)")
    assert f"below the 262144 it must hold (one request of the full context (context_len)): " \
           f"{short:.1f} GiB short" in reason
    wanted = math.ceil((0.85 + short / B200_GB) * 100) / 100
    assert f"memory.mem_fraction_static cannot give it: it would have to be {wanted:.2f} " \
           "(now 0.85), above 1" in reason
    assert "parallel.tp 2 (" in reason
    assert "memory.target_running_requests" in reason.split("Levers: ")[0]


def test_the_seeds_numbers_with_memory_to_spare_name_the_fraction_that_fits() -> None:
    """The seed's pools with 90 GB free and a 16,384-token context: 24 running requests need
    96 more slots than the KV cache can give; a higher mem_fraction_static gives them, or 13
    requests fit as it is."""
    lines = [x.replace("available_gpu_mem=30.12", "available_gpu_mem=90.00")
             .replace("context_len=262144", "context_len=16384") for x in field_0_5_12()]
    cap = capacity.parse(lines, "0.5.12")
    reason = sizing.size(cap, 24, first_launch("0.5.12", 24), gpu_gb=B200_GB).reason or ""
    per_slot, per_token = 3.62 / 25, 8.4 / 77000

    def left(requests: int) -> int:
        return 77000 - math.ceil((5 * requests - 24) * per_slot / per_token)

    short = (16384 - left(24)) * per_token
    wanted = math.ceil((0.85 + short / B200_GB) * 100) / 100
    assert f"{short:.1f} GiB short" in reason
    assert f"memory.mem_fraction_static {wanted:.2f} (now 0.85; 90.0 GB is free)" in reason
    most = max(n for n in range(1, 24) if left(n) >= 16384)
    assert most == 13 and "memory.target_running_requests 13 (the most that fit now)" in reason
    tight = capacity.parse([x.replace("available_gpu_mem=90.00", "available_gpu_mem=10.00")
                            for x in lines], "0.5.12")
    reason = sizing.size(tight, 24, first_launch("0.5.12", 24), gpu_gb=B200_GB).reason or ""
    assert f"memory.mem_fraction_static cannot give it: 10.0 GB is free, {short + 4:.1f} GB " \
           "would be needed with 4 GB left for activations" in reason


@pytest.mark.parametrize("release", ["0.5.10", "0.5.12", "0.5.13", "0.5.16", "0.5.17",
                                     "0.5.23"])
def test_the_seed_on_the_simulator_reaches_48_with_the_computed_size(
        release: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each era of SGLang's rule (0.5.10 - 0.5.12 reserve the draft state for the requested
    requests, 0.5.13 for those the slots allow, 0.5.17 add the padding slots): a start with
    24 slots gives 4 running requests; the size computed from its log, started again, gives
    48, with the KV cache the sizing expected."""
    monkeypatch.setenv("SGLANG_ENABLE_SPEC_V2", "1")  # 0.5.10's overlap schedule, as rendered
    launch = first_launch(release)
    seed = capacity.parse(startup_log(release, sim_flags(launch, "--max-mamba-cache-size",
                                                         "24"), tmp_path, monkeypatch), release)
    assert (seed.mamba_slots, seed.max_running_requests) == (24, 4)
    plan = sizing.size(seed, 48, launch, gpu_gb=B200_GB)
    assert (plan.slots, plan.reason) == (240, None)
    sized = render(sizing.apply(target_profile(release), plan.slots))
    assert "--max-mamba-cache-size" in sized.argv and sized.args["max_mamba_cache_size"] == 240
    after = capacity.parse(startup_log(release, sim_flags(sized), tmp_path, monkeypatch),
                           release)
    assert after.max_running_requests == 48 and after.mamba_slots == 240
    assert after.kv_tokens == pytest.approx(plan.kv_tokens, rel=0.005)
    assert sizing.size(after, 48, sized).reached


def test_a_start_that_reaches_the_target_needs_nothing(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    launch = first_launch("0.5.23", 32)
    cap = capacity.parse(startup_log("0.5.23", sim_flags(launch), tmp_path, monkeypatch),
                         "0.5.23")
    assert cap.max_running_requests == 32  # rendered --max-running-requests 32, slots to spare
    plan = sizing.size(cap, 32, launch)
    assert plan.reached and plan.slots is None and plan.reason is None


def test_a_kv_capped_start_is_not_resized() -> None:
    cap = capacity.Capacity(kv_tokens=60, kv_gb=1.0, mamba_slots=1000, mamba_gb=10.0,
                            slots_per_request=5, max_running_requests=30, context_len=4096,
                            state=capacity.COMPLETE)
    plan = sizing.size(cap, 48, first_launch("0.5.23"))
    assert plan.slots is None
    assert "the KV cache (60 tokens) limits it, not the mamba cache (1000 slots)" in \
        (plan.reason or "")


def test_a_log_without_the_figures_is_a_reason_not_a_guess() -> None:
    assert "does not give max_running_requests" in \
        (sizing.size(capacity.Capacity(), 48, first_launch("0.5.23")).reason or "")
    no_pools = capacity.Capacity(max_running_requests=4, kv_tokens=1000, kv_gb=1.0)
    assert "gives no mamba pool and KV cache sizes" in \
        (sizing.size(no_pools, 48, first_launch("0.5.23")).reason or "")
    auto = dataclasses.replace(capacity.parse(field_0_5_12(), "0.5.12"), slots_per_request=None,
                               server_args={"mamba_radix_cache_strategy": "auto"})
    assert "set mamba.strategy explicitly" in \
        (sizing.size(auto, 48, first_launch("0.5.23")).reason or "")


def test_the_release_rule_of_what_the_slots_take() -> None:
    """Slot-sized blocks out of the KV budget, per era (see sizing.reserved)."""
    assert sizing.reserved("up front", 24, 48, 4, 5) == 24 + 48 * 4
    assert sizing.reserved("capped", 24, 48, 4, 5) == 24 + 4 * 4
    assert sizing.reserved("padded", 24, 48, 4, 5) == 25 + 5 * 4
    assert sizing.reserved("padded", 240, 48, 0, 5) == 241  # no speculative decoding


# --- the profile it resolves into, and what a host remembers ---------------------------------

def test_apply_renders_the_target_and_the_size() -> None:
    first = render(sizing.apply(target_profile("0.5.23"), None))
    assert first.args["max_running_requests"] == 48 and "--max-mamba-cache-size" not in first.argv
    sized = render(sizing.apply(target_profile("0.5.23"), 240))
    assert sized.args["max_mamba_cache_size"] == 240
    own = sizing.apply(target_profile("0.5.23", max_running_requests=64), 240)
    assert own.memory.max_running_requests == 64  # the profile's own limit, above the target
    plain = field_profile()
    assert sizing.apply(plain, 240) is plain  # no target: the size means nothing


def test_the_key_holds_what_the_size_depends_on() -> None:
    launch = first_launch("0.5.23")
    key = sizing.key(launch, 183359)
    assert len(key) == 24 and key == sizing.key(launch, 183359)
    other_port = dataclasses.replace(launch, argv=tuple(
        "30001" if w == "30000" else w for w in launch.argv))
    sized = render(sizing.apply(target_profile("0.5.23"), 240))
    gpus = dataclasses.replace(launch, env={**launch.env, "CUDA_VISIBLE_DEVICES": "3"})
    assert sizing.key(other_port, 183359) == sizing.key(sized, 183359) == \
        sizing.key(gpus, 183359) == key
    assert sizing.key(launch, 81559) != key
    assert sizing.key(first_launch("0.5.22"), 183359) != key
    assert sizing.key(render(sizing.apply(target_profile("0.5.23", context_length=65536),
                                          None)), 183359) != key


def test_a_record_is_read_back_only_for_its_key() -> None:
    text = sizing.record("a" * 24, 240, 48)
    assert sizing.remembered(text, "a" * 24) == 240
    assert sizing.remembered(text, "b" * 24) is None
    for bad in ("", "not json", "[]", '{"key": "' + "a" * 24 + '", "max_mamba_cache_size": 0}',
                '{"key": "' + "a" * 24 + '", "max_mamba_cache_size": true}',
                '{"key": "' + "a" * 24 + '", "max_mamba_cache_size": "240"}',
                '{"key": "' + "a" * 24 + '", "max_mamba_cache_size": 1e400}'):
        assert sizing.remembered(bad, "a" * 24) is None, bad
    assert sizing.record_path("a" * 24) == f"/var/lib/sglang/sizing/{'a' * 24}.json"
