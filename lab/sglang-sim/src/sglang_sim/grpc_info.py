"""What the gRPC servicer reports about its server, apart from the requests it serves: the
schedulers' load snapshots (SGLang 0.5.20 - 0.5.23
``managers/scheduler_components/load_inquirer.py`` ``get_loads``), the scheduler's ready report
(``scheduler.py`` ``get_init_info``), the labels smg-grpc-servicer 0.14.1 adds to the server
arguments, its sampling-parameter JSON and its hidden-states refusal (``sglang/servicer.py``,
``sglang/hidden_states.py``). The servicer's own helpers that import no SGLang run as they are.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from argparse import Namespace
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import grpc
from smg_grpc_proto import sglang_scheduler_pb2 as pb
from smg_grpc_proto.generated import common_pb2
from smg_grpc_servicer.constrained_decoding import (
    grammar_backend_entry,
    grammar_start_labels,
    sglang_constrained_decoding_start,
    sglang_grammar_backend,
)
from smg_grpc_servicer.mm_item_limits import MM_ITEM_LIMITS_KEY, sglang_item_limits
from smg_grpc_servicer.pd_pairing import pairing_protocol_from_env
from smg_grpc_servicer.sglang.hidden_states import RUST_SERVICER_WORDS
from smg_grpc_servicer.sglang.loads import convert_loads_to_protobuf

from sglang_sim.args import release_tuple
from sglang_sim.engine import Engine, Stats
from sglang_sim.memory import MemoryPlan
from sglang_sim.metrics import SCHEDULER_GAUGES

if TYPE_CHECKING:
    from sglang_sim.state import State

logger = logging.getLogger("smg_grpc_servicer.sglang.servicer")
HICACHE_LAYOUT_FROM = (0, 5, 23, 0)  # get_init_info's hicache_object_layout
LOAD_SECTIONS = ("all", "core", "disagg", "lora", "memory", "queues", "spec")
SAMPLING_DEFAULT_KEYS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")
# /metrics' sglang:token_usage: one definition for both views of a scheduler's KV pool
_TOKEN_USAGE = next(value for name, _, value, _ in SCHEDULER_GAUGES
                    if name == "sglang:token_usage")


def loads(state: State, include: list[str], dp_rank: int | None,
          waiting: Callable[[Engine], int], spec_base: dict[int, tuple[Stats, float, int]]
          ) -> pb.GetLoadsResponse:
    """GetLoads: the ranks' snapshots (``dp_rank``: one), cut to the ``include`` sections
    (request_manager.get_loads), and their aggregate (servicer.py _compute_aggregate_protobuf).
    Raises ValueError for an unknown section."""
    invalid = set(include) - set(LOAD_SECTIONS)
    if invalid:
        raise ValueError(f"Invalid include sections: {sorted(invalid)}. Valid options: "
                         f"{sorted(LOAD_SECTIONS)}")
    snapshots = [convert_loads_to_protobuf(load_snapshot(
        engine, state.memories[rank], rank, state.args, waiting(engine), spec_base.get(rank)))
        for rank, engine in enumerate(state.dispatch.engines)
        if dp_rank is None or rank == dp_rank]
    if "all" not in include:
        for load in snapshots:
            for section, name in (("memory", "memory"), ("spec", "speculative"),
                                  ("lora", "lora"), ("disagg", "disaggregation"),
                                  ("queues", "queues")):
                if section not in include:
                    load.ClearField(name)
    aggregate = pb.AggregateMetrics()
    if snapshots:
        n = len(snapshots)
        running = sum(x.num_running_reqs for x in snapshots)
        waiting_reqs = sum(x.num_waiting_reqs for x in snapshots)
        aggregate = pb.AggregateMetrics(
            total_running_reqs=running, total_waiting_reqs=waiting_reqs,
            total_reqs=running + waiting_reqs,
            avg_token_usage=round(sum(x.token_usage for x in snapshots) / n, 4),
            avg_throughput=round(sum(x.gen_throughput for x in snapshots) / n, 2),
            avg_utilization=round(sum(x.utilization for x in snapshots) / n, 4))
    return pb.GetLoadsResponse(timestamp=datetime.now(UTC).isoformat(), version=state.release,
                               dp_rank_count=len(snapshots), loads=snapshots,
                               aggregate=aggregate)


def load_snapshot(engine: Engine, plan: MemoryPlan, rank: int, args: Namespace,
                  waiting_uncached: int, spec_base: tuple[Stats, float, int] | None
                  ) -> SimpleNamespace:
    """One scheduler's LoadSnapshot, rounded as get_loads rounds it. ``waiting_uncached``: its
    waiting queue's prompt tokens (no prefix is cached here, so all of them are uncached);
    ``num_used_tokens`` is /metrics' token usage times the pool; ``spec_base``: the
    speculative counters at its last cache flush (reset_metrics)."""
    mode = getattr(args, "disaggregation_mode", None) or "null"
    usage = _TOKEN_USAGE(engine, plan)
    stats = engine.stats
    accepted, steps = stats.accept_tokens, stats.forward_steps
    if spec_base is not None and spec_base[0] is stats:
        accepted, steps = accepted - spec_base[1], steps - spec_base[2]
    speculative = None
    if engine.speculative and steps > 0:  # spec_total_num_forward_ct > 0
        accept = accepted / steps
        speculative = SimpleNamespace(
            accept_length=accept, accept_rate=(accept - 1) / max(engine.draft_tokens - 1, 1))
    return SimpleNamespace(
        dp_rank=rank, num_running_reqs=engine.running, num_waiting_reqs=engine.queued,
        num_used_tokens=round(usage * plan.kv_tokens), max_total_num_tokens=plan.kv_tokens,
        token_usage=round(usage, 4), gen_throughput=round(stats.throughput(), 2),
        cache_hit_rate=0.0, utilization=round(_utilization(args, mode), 4),
        max_running_requests=plan.max_running_requests,
        # (a long prompt's remaining chunks, which it also adds, are not tracked: a request
        # counts as running from its admission)
        num_waiting_uncached_tokens=0 if mode == "decode" else waiting_uncached,
        memory=SimpleNamespace(weight_gb=round(plan.weight_gb, 3),
                               kv_cache_gb=round(plan.kv_k_gb + plan.kv_v_gb, 3), graph_gb=0.0,
                               token_capacity=int(plan.kv_tokens)),
        speculative=speculative, lora=None,
        # always present; the simulator keeps no PD bootstrap, inflight or transfer queues
        disaggregation=SimpleNamespace(
            mode=mode, prefill_bootstrap_queue_reqs=0, prefill_inflight_queue_reqs=0,
            decode_prealloc_queue_reqs=0, decode_transfer_queue_reqs=0,
            decode_retracted_queue_reqs=0, kv_transfer_speed_gb_s=0.0,
            kv_transfer_latency_ms=0.0),
        queues=SimpleNamespace(waiting=engine.queued, grammar=0, paused=0, retracted=0))


def _utilization(args: Namespace, mode: str) -> float:
    """SchedulerStats.utilization: 0.0, as metrics_reporter's _calculate_utilization leaves it
    (it has no max_running_requests_under_SLO to divide by), except -1 on a prefill server
    once a prefill batch was reported with metrics on (the warm-up request's)."""
    return -1.0 if mode == "prefill" and getattr(args, "enable_metrics", False) else 0.0


def scheduler_info(args: Namespace, release: str, kv_tokens: int, max_req_input_len: int,
                   startup_time: float) -> dict[str, Any]:
    """The first scheduler's ready report (get_init_info); 0.5.23 adds its HiCache L3 layout
    (scheduler.py _hicache_l3_layout, mem_cache/hicache_storage.py disabled_l3_layout)."""
    info: dict[str, Any] = {"status": "ready", "max_total_num_tokens": kv_tokens,
                            "max_req_input_len": max_req_input_len, "startup_time": startup_time}
    if release_tuple(release) >= HICACHE_LAYOUT_FROM:
        backend = None
        reason = "Hierarchical cache is disabled"
        if getattr(args, "enable_hierarchical_cache", False):  # no Mooncake store is simulated
            backend, reason = getattr(args, "hicache_storage_backend", None), (
                "Mooncake storage is not attached")
        info["hicache_object_layout"] = {
            "enabled": False, "backend": backend, "page_size": args.page_size or 1,
            "hicache_object_layout": {"pools": []}, "reason": reason}
    return info


def server_args_labels(raw: Namespace, args: dict[str, Any]) -> None:
    """GetServerInfo's additions to the raw arguments (servicer.py:588-612): the PD pairing
    protocol, the media limits, the reasoning-parser labels and the resolved grammar backend."""
    pairing = pairing_protocol_from_env()
    if pairing:
        args["pairing_protocol"] = pairing
    limits = sglang_item_limits(raw)
    if limits:
        args[MM_ITEM_LIMITS_KEY] = limits
    args.update(grammar_start_labels(raw, sglang_constrained_decoding_start(raw)))
    grammar_backend_entry(args, sglang_grammar_backend(raw))


def preferred_sampling_params_json(raw: Namespace) -> str:
    """servicer.py _preferred_sampling_params_json: the flag's JSON object, compact."""
    preferred = raw.preferred_sampling_params
    if isinstance(preferred, dict):
        return json.dumps(preferred, separators=(",", ":"))
    return str(preferred) if isinstance(preferred, str) else ""


def default_sampling_params_json(raw: Namespace) -> str:
    """servicer.py _default_sampling_params_json: the model's generation_config.json defaults
    (ModelConfig.get_default_sampling_params, with --sampling-defaults model), updated with the
    preferred parameters, kept to the five sampling keys, compact."""
    defaults: dict[str, Any] = {}
    config = Path(raw.model_path) / "generation_config.json"
    if getattr(raw, "sampling_defaults", "model") == "model" and config.is_file():
        try:
            model = json.loads(config.read_text())
        except ValueError:
            model = {}
        defaults = {key: model[key] for key in SAMPLING_DEFAULT_KEYS
                    if isinstance(model, dict) and model.get(key) is not None}
    preferred = raw.preferred_sampling_params
    if preferred:
        if isinstance(preferred, str):
            try:
                preferred = json.loads(preferred)
            except json.JSONDecodeError:
                logger.warning("Failed to parse preferred_sampling_params JSON")
                preferred = {}
        if isinstance(preferred, dict):
            defaults.update(preferred)
        else:
            logger.warning("Ignoring preferred_sampling_params with unsupported type: %s",
                           type(preferred).__name__)
    kept = {key: defaults[key] for key in SAMPLING_DEFAULT_KEYS
            if defaults.get(key) is not None}
    return json.dumps(kept, separators=(",", ":")) if kept else ""


def hidden_states_refusal(raw: Namespace) -> str:
    """Why a request for hidden states is refused (hidden_states.py): the engine's launch-time
    cap first (forward_batch_info.get_server_return_hidden_states_mode over the resolved
    flags), then, when the engine captures them all, that the Rust servicer serves them."""
    mode = getattr(raw, "return_hidden_states_mode", None)
    if mode == "last":
        return ("The requested return_hidden_states mode exceeds the server maximum `last`. "
                "Please launch with `--return-hidden-states-mode full` to allow "
                "return_hidden_states=True.")
    if mode == "full" or getattr(raw, "enable_return_hidden_states", False) or getattr(
            raw, "enable_return_aux_hidden_states", False):  # 0.5.23 resolves it to full
        return str(RUST_SERVICER_WORDS)
    return ("The server is not configured to return hidden states. Please launch with "
            "`--return-hidden-states-mode full` to allow return_hidden_states=True.")


class Controls:
    """The schedulers' cache flush and profiler, as FlushCache and Start/StopProfile reach
    them through the manager's communicators (one answer per DP rank; failures joined by
    " | ", servicer.py _aggregate_communicator_results)."""

    def __init__(self, engines: list[Engine]) -> None:
        self.engines = engines
        self.flushing: set[int] = set()  # ranks with a deferred flush (SchedulerFlushWrapper)
        self.spec_base: dict[int, tuple[Stats, float, int]] = {}  # at each rank's last flush
        self.profile_dir: Path | None = None  # while the profiler runs

    async def flush(self, timeout_s: float, context: Any) -> common_pb2.FlushCacheResponse:
        """A stopped scheduler never answers: the communicator times out."""
        wait = max(30.0, timeout_s + 10.0)
        if any(engine.stuck for engine in self.engines):
            await asyncio.sleep(wait)
            context.set_code(grpc.StatusCode.DEADLINE_EXCEEDED)
            context.set_details(f"Flush cache timed out after {wait}s. The scheduler may be "
                                "unresponsive or under heavy load.")
            return common_pb2.FlushCacheResponse(
                success=False, message=f"Flush cache timed out after {wait}s")
        results = await asyncio.gather(*(self._flush(rank, timeout_s)
                                         for rank in range(len(self.engines))))
        failures = [message or "failed" for success, message in results if not success]
        return common_pb2.FlushCacheResponse(
            success=not failures, message=" | ".join(failures) or "Cache flushed successfully")

    async def _flush(self, rank: int, timeout_s: float) -> tuple[bool, str]:
        """SchedulerFlushWrapper.handle: at once with no timeout, else when idle (checked each
        loop pass) or "Timed out" at the deadline; Scheduler.flush_cache only when idle."""
        engine = self.engines[rank]
        if rank in self.flushing:
            return False, "Another flush_cache is already in progress."
        deadline = time.monotonic() + timeout_s
        if timeout_s > 0:
            self.flushing.add(rank)
            try:
                while engine.running or engine.queued:
                    if time.monotonic() >= deadline:
                        engine.log.warning("Deferred flush_cache timed out while waiting for "
                                           "idle state.")
                        return False, "Timed out waiting for idle state."
                    await asyncio.sleep(0.02)
            finally:
                self.flushing.discard(rank)
        if engine.running or engine.queued:
            engine.log.warning(f"Cache not flushed because there are pending requests. "
                               f"#queue-req: {engine.queued}, #running-req: {engine.running}")
            return False, ""
        stats = engine.stats
        self.spec_base[rank] = (stats, stats.accept_tokens, stats.forward_steps)  # reset_metrics
        engine.log.info("Cache flushed successfully!")
        return True, ""

    def start_profile(self, output_dir: str | None) -> common_pb2.ProfileResponse:
        """ProfileReq(START_PROFILE): _init_profile, then _start_profile (start_step,
        num_steps, profile_by_stage and activities are not simulated; no trace is written)."""
        default = os.environ.get("SGLANG_TORCH_PROFILER_DIR", "/tmp")
        self.profile_dir = Path(output_dir or default).expanduser()
        profile_id = str(time.time())
        for engine in self.engines:
            engine.log.info(f"Profiling starts. Traces will be saved to: {self.profile_dir} "
                            f"(with profile id: {profile_id})")
        return common_pb2.ProfileResponse(success=True, message="Start profiling succeeded")

    def stop_profile(self) -> common_pb2.ProfileResponse:
        """ProfileReq(STOP_PROFILE): _stop_profile, which fails when none runs."""
        if self.profile_dir is None:
            return common_pb2.ProfileResponse(success=False, message=" | ".join(
                ["Profiling is not in progress. Call /start_profile first."] * len(self.engines)))
        for engine in self.engines:
            engine.log.info("Stop profiling...")
            engine.log.info(f"Profiling done. Traces are saved to: {self.profile_dir}")
        self.profile_dir = None
        return common_pb2.ProfileResponse(success=True, message="Stop profiling succeeded")

