"""``--dp-size N`` without DP attention: N replicas of the model, one per DP rank, each on its own
GPUs with its own scheduler, memory pools and max running requests, behind SGLang's
DataParallelController (managers/data_parallel_controller.py, read in 0.5.12 and 0.5.23).

- Layout: the controller (``sglang::data_parallel_controller``) starts DP rank d's TP group at
  GPU ``d * tp_size`` (0.5.12 :240-268, 0.5.23 :420-449), logging ``Launch DP{d} starting at GPU
  #{base}.`` (0.5.12 :456, 0.5.23 :687); each DP rank's scheduler sizes its own pools on its own
  GPU and logs them under its ranks (``[time DP3]``, logs.py). ``max_running_requests`` is per
  replica: ModelRunner divides it by dp_size only with DP attention (0.5.12
  model_executor/model_runner.py:364 and model_runner_kv_cache_mixin.py:817-836, 0.5.23
  mem_cache/kv_cache_configurator.py:3119-3132: attn_dp_size is 1), so the server runs N times it.
- Dispatch: ``--load-balance-method auto`` resolves to ``round_robin`` unless the server is a PD
  prefill server (0.5.12 server_args.py:1013-1029, 0.5.23 arg_groups/serving_hook.py:217-235),
  the same in every release 0.5.10 - 0.5.23. Round robin hands each request to the next rank
  whatever its load (0.5.12 :571-585, 0.5.23 :880-899); ``total_requests`` and ``total_tokens``
  pick the rank with the fewest running + waiting requests (or tokens), counting each request it
  sends at once (DPBudget, 0.5.12 :89-114, 0.5.23 :122-155). From 0.5.22 a health check has its
  own round robin (dispatch_health_check, 0.5.23 :845-863); before, it takes a request's turn.
  ``follow_bootstrap_room`` (PD disaggregation) is not simulated.
- Nothing marks a rank down (the controller's ``status`` changes only with elastic EP): a DP
  rank whose scheduler was killed outright still gets its turn, and what it gets never moves.
"""

from __future__ import annotations

import time
from argparse import Namespace
from collections.abc import AsyncIterator, Callable

from sglang_sim.args import release_tuple
from sglang_sim.engine import Engine, Output, Stats

HEALTH_ROUND_ROBIN_FROM = (0, 5, 22, 0)


def resolve_load_balance_method(args: Namespace) -> None:
    """ServerArgs._handle_load_balance_method: ``auto`` becomes the method the server runs."""
    if getattr(args, "load_balance_method", None) == "auto":
        prefill = getattr(args, "disaggregation_mode", "null") == "prefill"
        args.load_balance_method = "follow_bootstrap_room" if prefill else "round_robin"


class Dispatcher:
    """The tokenizer's view of the schedulers: one Engine per DP rank (one without DP).

        dispatch = Dispatcher([engine0, engine1], "round_robin", "0.5.23")
        async for n in dispatch.run(rid, 12, out, streaming=False): ...
    """

    def __init__(self, engines: list[Engine], method: str, release: str) -> None:
        self.engines = engines
        self.method = method
        self.counter = 0
        self.health_counter = 0
        self.own_health_turn = release_tuple(release) >= HEALTH_ROUND_ROBIN_FROM
        self.tokens = [0] * len(engines)  # prompt tokens each rank holds (total_tokens)
        self.last_output = 0.0  # monotonic time of the last output of any rank

    @property
    def first(self) -> Engine:
        return self.engines[0]

    def _round_robin(self) -> int:
        rank = self.counter
        self.counter = (self.counter + 1) % len(self.engines)
        return rank

    def pick(self, prompt_tokens: int) -> int:
        """The DP rank the controller sends a request to."""
        if len(self.engines) == 1:
            return 0
        if self.method == "total_requests":
            loads = [e.running + e.queued for e in self.engines]
            return loads.index(min(loads))
        if self.method == "total_tokens":
            return min(range(len(self.engines)), key=lambda i: (
                self.tokens[i], self.engines[i].running + self.engines[i].queued))
        return self._round_robin()

    def health_rank(self) -> int:
        """The rank a health check's generation goes to."""
        if len(self.engines) == 1:
            return 0
        if not self.own_health_turn:
            return self._round_robin()
        rank = self.health_counter
        self.health_counter = (self.health_counter + 1) % len(self.engines)
        return rank

    def compose(self, prompt: str, max_tokens: int, think: bool, seed: int | None) -> Output:
        return self.first.compose(prompt, max_tokens, think, seed)

    async def run(self, rid: str, prompt_tokens: int, out: Output, streaming: bool
                  ) -> AsyncIterator[int]:
        rank = self.pick(prompt_tokens)
        self.tokens[rank] += prompt_tokens
        try:
            async for n in self.engines[rank].run(rid, prompt_tokens, out, streaming):
                self.last_output = time.monotonic()
                yield n
        finally:
            self.tokens[rank] -= prompt_tokens

    def step(self, busy: bool = True) -> None:
        for engine in self.engines:
            engine.step(busy)

    def mark_dead(self, alive: Callable[[int], bool]) -> None:
        """A rank whose scheduler is gone moves no request again (nothing else notices)."""
        for rank, engine in enumerate(self.engines):
            if not engine.stuck and not alive(rank):
                engine.stuck = True

    @property
    def rids(self) -> list[str]:
        return [rid for engine in self.engines for rid in engine.rids]

    def stats(self) -> Stats:
        """The tokenizer's counters and histograms: every rank's requests."""
        return Stats.merged([engine.stats for engine in self.engines])

    def reset_stats(self) -> None:
        for engine in self.engines:
            engine.stats = Stats()
