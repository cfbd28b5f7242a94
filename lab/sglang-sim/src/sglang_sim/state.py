"""One server's state, shared by the HTTP surface, the lifecycle and /metrics."""

from __future__ import annotations

import asyncio
import os
import time
from argparse import Namespace
from dataclasses import dataclass, field
from typing import Any

from sglang_sim.args import release_tuple
from sglang_sim.dp import Dispatcher
from sglang_sim.engine import Engine
from sglang_sim.faults import Faults
from sglang_sim.memory import MemoryPlan
from sglang_sim.model import ModelShape
from sglang_sim.multinode import Peers
from sglang_sim.processes import Children
from sglang_sim.rules import strategy_dest

NULL_CONTENT_UNTIL = (0, 5, 12, 1)  # serving_chat: content=text if text else None


def plain(value: Any) -> Any:
    """A value JSON (or a protobuf Struct) holds: other types as their str, as SGLang's
    server-info answers turn them."""
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, (list, tuple, set)):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    return str(value)


@dataclass
class State:
    args: Namespace
    release: str
    launch_command: str
    shape: ModelShape
    memories: list[MemoryPlan]  # each DP rank's (one without --dp-size)
    dispatch: Dispatcher
    faults: Faults
    startup_time: float
    children: Children
    peers: Peers  # this node's end of the TP group's channel (multinode.py)
    up: bool = False
    draining: bool = False
    unhealthy: bool = False
    served: int = 0
    health_timeout: float = field(
        default_factory=lambda: float(os.environ.get("SGLANG_HEALTH_CHECK_TIMEOUT", "20")))

    @property
    def engine(self) -> Engine:
        """DP rank 0's scheduler (the only one without --dp-size)."""
        return self.dispatch.first

    @property
    def memory(self) -> MemoryPlan:
        return self.memories[0]

    @property
    def served_model_name(self) -> str:
        return str(self.args.served_model_name or self.args.model_path)

    @property
    def reasoning(self) -> bool:
        return self.args.reasoning_parser is not None

    @property
    def eos_token_id(self) -> int:
        return self.shape.eos_token_id

    def content(self, text: str) -> str | None:
        """An all-reasoning answer is null up to 0.5.12.post1 and "" from 0.5.13."""
        if text:
            return text
        return None if release_tuple(self.release) <= NULL_CONTENT_UNTIL else ""

    @staticmethod
    def count_tokens(text: str) -> int:
        return max(1, len(text) // 4)

    async def sleep_health_timeout(self) -> None:
        await asyncio.sleep(self.health_timeout)

    async def health_generation(self) -> bool:
        """/health_generate's one-token request, sent to a DP rank (dp.py): healthy as soon as
        any scheduler answers anything, else after SGLANG_HEALTH_CHECK_TIMEOUT not (0.5.12
        entrypoints/http_server.py:549-576), so a dead DP rank fails the checks it is given
        only while the other ranks are idle."""
        if not self.dispatch.engines[self.dispatch.health_rank()].stuck:
            return True
        tic = time.monotonic()
        while time.monotonic() < tic + self.health_timeout:
            await asyncio.sleep(1)
            if self.dispatch.last_output > tic:
                return True
        return False

    async def internal_states_answered(self) -> None:
        """/server_info waits for every DP rank's GetInternalStateReq answer (the tokenizer's
        communicator, fan-out dp_size): a rank that moves nothing never answers."""
        while any(engine.stuck for engine in self.dispatch.engines):
            await asyncio.sleep(1)

    def server_info(self) -> dict[str, Any]:
        """/server_info: the arguments (``max_running_requests`` as given: per DP rank, None
        unless set), the first scheduler's ``max_total_num_tokens`` and one ``internal_states``
        entry per DP rank with what that rank runs (0.5.12 entrypoints/http_server.py:630-644
        and managers/scheduler.py:3469-3481; 0.5.23 http_server.py:864-892 and
        managers/scheduler_components/internal_state.py:45-73, world_size dp x tp x pp)."""
        info = {k: plain(v) for k, v in vars(self.args).items()}
        info.update(
            launch_command=self.launch_command,
            max_total_num_tokens=self.memory.kv_tokens,
            max_req_input_len=self.memory.context_len - 1,
            status="ready" if self.up and not self.draining else "starting",
            startup_time=self.startup_time,
            internal_states=[self._internal_state(engine, plan) for engine, plan in
                             zip(self.dispatch.engines, self.memories, strict=True)],
            version=self.release,
            frontend="python",
        )
        return info

    def _internal_state(self, engine: Engine, plan: MemoryPlan) -> dict[str, Any]:
        stats = engine.stats
        internal: dict[str, Any] = {
            "world_size": self.args.tp_size * self.args.dp_size,
            "startup_time": self.startup_time,
            "effective_max_running_requests_per_dp": plan.max_running_requests,
            "last_gen_throughput": stats.throughput(),
            "memory_usage": {"weight": round(plan.weight_gb, 2),
                             "kvcache": round(plan.kv_k_gb + plan.kv_v_gb, 2),
                             "token_capacity": plan.kv_tokens,
                             "graph": 0.0},
        }
        if self.args.speculative_algorithm is not None:
            internal["avg_spec_accept_length"] = stats.avg_accept_length
        return internal

    def model_info(self) -> dict[str, Any]:
        return {
            "model_path": self.args.model_path,
            "served_model_name": self.served_model_name,
            "tokenizer_path": self.args.tokenizer_path or self.args.model_path,
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": "default",
            "load_format": self.args.load_format,
            "reasoning_parser": self.args.reasoning_parser,
            "tool_call_parser": self.args.tool_call_parser,
            "disaggregation_mode": getattr(self.args, "disaggregation_mode", "null"),
            "has_image_understanding": self.shape.vision_params > 0,
            "has_audio_understanding": False,
            "model_type": self.shape.model_type,
            "architectures": [self.shape.architecture],
        }

    @property
    def mamba_strategy(self) -> str:
        return str(getattr(self.args, strategy_dest(self.args)))
