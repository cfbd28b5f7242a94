"""The simulated scheduler: admission up to max running requests, a waiting queue, decode at a
configured rate with speculative acceptance, deterministic text, and the counters /metrics reads.

Settings (environment):
  SGLANG_SIM_DECODE_STEPS_PER_SECOND  forward passes per second per request (default 60)
  SGLANG_SIM_PREFILL_TOKENS_PER_SECOND prompt tokens per second (default 20000)
  SGLANG_SIM_ACCEPT_LENGTH           "mean,stddev" of the accept length (default 2.8,0.4)
  SGLANG_SIM_REASONING_TOKENS        thinking tokens before the answer with a reasoning parser (32)
  SGLANG_SIM_ANSWER_TOKENS           tokens in the answer when max_tokens allows (24)
  SGLANG_SIM_SEED                    seed for text and acceptance (default: --random-seed or 0)
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import os
import random
import re
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from sglang_sim import logs

WORDS = tuple(
    "the model serves tokens quickly while the scheduler keeps every request moving through "
    "prefill and decode and the cache holds state for hybrid layers so answers arrive on time"
    .split())
THINK = tuple(
    "let me think about this carefully first I should check what is being asked and then work "
    "out the answer step by step before replying".split())
TTFT_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0)
E2E_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0,
               100.0, 200.0, 400.0)


def _env_float(name: str, default: float) -> float:
    return float(os.environ.get(name, default))


@dataclass
class Histogram:
    buckets: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    n: int = 0

    def add(self, other: Histogram) -> None:
        if other.counts:
            self.counts = [a + b for a, b in zip(self.counts or [0] * len(self.buckets),
                                                 other.counts, strict=True)]
        self.total += other.total
        self.n += other.n

    def observe(self, value: float) -> None:
        if not self.counts:
            self.counts = [0] * len(self.buckets)
        for i, bound in enumerate(self.buckets):
            if value <= bound:
                self.counts[i] += 1
        self.total += value
        self.n += 1


@dataclass
class Output:
    reasoning: list[str]
    answer: list[str]
    finish_reason: str
    accept_lengths: list[float]

    @property
    def tokens(self) -> int:
        return len(self.reasoning) + len(self.answer)


@dataclass
class Stats:
    prompt_tokens: int = 0
    generation_tokens: int = 0
    requests: int = 0
    accept_tokens: float = 0.0
    forward_steps: int = 0
    ttft: dict[bool, Histogram] = field(
        default_factory=lambda: {s: Histogram(TTFT_BUCKETS) for s in (False, True)})
    e2e: dict[bool, Histogram] = field(
        default_factory=lambda: {s: Histogram(E2E_BUCKETS) for s in (False, True)})
    recent: list[tuple[float, int]] = field(default_factory=list)

    def throughput(self) -> float:
        now = time.monotonic()
        self.recent = [(t, n) for t, n in self.recent if now - t < 10]
        return sum(n for _, n in self.recent) / 10

    @property
    def avg_accept_length(self) -> float:
        return self.accept_tokens / self.forward_steps if self.forward_steps else 0.0

    @classmethod
    def merged(cls, parts: list[Stats]) -> Stats:
        """Several schedulers' counts as one (what the tokenizer counts for the server)."""
        if len(parts) == 1:
            return parts[0]
        out = cls()
        for part in parts:
            out.prompt_tokens += part.prompt_tokens
            out.generation_tokens += part.generation_tokens
            out.requests += part.requests
            out.accept_tokens += part.accept_tokens
            out.forward_steps += part.forward_steps
            out.recent += part.recent
            for streaming in (False, True):
                for mine, theirs in ((out.ttft, part.ttft), (out.e2e, part.e2e)):
                    mine[streaming].add(theirs[streaming])
        return out


class Engine:
    def __init__(self, max_running: int, speculative: bool, draft_tokens: int, reasoning: bool,
                 seed: int) -> None:
        self.max_running = max_running
        self.speculative = speculative
        self.draft_tokens = max(draft_tokens, 1)
        self.reasoning = reasoning
        self.seed = int(os.environ.get("SGLANG_SIM_SEED", seed))
        self.step_rate = _env_float("SGLANG_SIM_DECODE_STEPS_PER_SECOND", 60)
        self.prefill_rate = _env_float("SGLANG_SIM_PREFILL_TOKENS_PER_SECOND", 20000)
        mean, _, std = os.environ.get("SGLANG_SIM_ACCEPT_LENGTH", "2.8,0.4").partition(",")
        self.accept_mean, self.accept_std = float(mean), float(std or 0)
        self.think_tokens = int(_env_float("SGLANG_SIM_REASONING_TOKENS", 32))
        self.answer_tokens = int(_env_float("SGLANG_SIM_ANSWER_TOKENS", 24))
        self.slots = asyncio.Semaphore(max_running)
        self.running = 0
        self.queued = 0
        self.rids: list[str] = []  # requests not finished yet, as the tokenizer manager tracks
        self.stats = Stats()
        self.crash_after: int | None = None  # SGLANG_SIM_CRASH_AFTER, set by the launcher
        self.hang_after: int | None = None  # SGLANG_SIM_HANG_AFTER, set by the launcher
        # Tells the TP0 scheduler stand-in of a fault ("crash MESSAGE", "hang"), set by the launcher
        self.fault: Callable[[str], None] = lambda command: None
        self.stuck = False  # the scheduler stopped (crashed or hung): no request moves again
        self._never = asyncio.Event()
        # The release's "Prefill batch" line (prompt tokens, running, queued), set by the launcher
        self.prefill_line: Callable[[int, int, int], str] | None = None
        self.log = logging.getLogger(logs.SCHEDULER)  # this scheduler's (its DP rank's) logger

    def step(self, busy: bool = True) -> bool:
        """One scheduler iteration: where a faulted scheduler hits its exception (the first step
        after the crash_after-th request finished) or its batch hangs (``busy``: a batch runs).
        Either way no request moves again; the scheduler's SIGQUIT brings the server down, as
        in SGLang."""
        if self.stuck:
            return False
        finished = self.stats.requests
        if self.crash_after is not None and finished >= self.crash_after:
            self.stuck = True
            self.fault(f"crash simulated crash after {finished} requests")
        elif busy and self.hang_after is not None and finished >= self.hang_after:
            self.stuck = True
            self.fault("hang")
        return not self.stuck

    async def _tick(self) -> None:
        if not self.step():
            await self._never.wait()

    def _rng(self, prompt: str, seed: int | None) -> random.Random:
        digest = hashlib.blake2b(f"{self.seed}|{seed}|{prompt}".encode(), digest_size=8).digest()
        return random.Random(int.from_bytes(digest, "big"))

    def compose(self, prompt: str, max_tokens: int, think: bool, seed: int | None) -> Output:
        """The deterministic text for a prompt: thinking, then an answer (a sum, if asked)."""
        rng = self._rng(prompt, seed)
        reasoning = [rng.choice(THINK) for _ in range(self.think_tokens)] if think else []
        answer = [rng.choice(WORDS) for _ in range(self.answer_tokens)]
        asked = re.search(r"(\d+)\s*\+\s*(\d+)", prompt)
        if asked:
            answer = [f"{int(asked.group(1)) + int(asked.group(2))}.", *answer[:3]]
        finish = "stop"
        if len(reasoning) + len(answer) > max_tokens:
            finish = "length"
            reasoning = reasoning[:max_tokens]
            answer = answer[:max(0, max_tokens - len(reasoning))]
        accepts = []
        remaining = len(reasoning) + len(answer)
        while remaining > 0:
            accept = 1.0
            if self.speculative:
                accept = min(max(rng.gauss(self.accept_mean, self.accept_std), 1.0),
                             float(self.draft_tokens))
            accepts.append(accept)
            remaining -= max(1, round(accept))
        return Output(reasoning, answer, finish, accepts)

    async def run(self, rid: str, prompt_tokens: int, out: Output, streaming: bool
                  ) -> AsyncIterator[int]:
        """Admit, prefill and decode; yield the number of tokens produced at each step."""
        start = time.monotonic()
        self.rids.append(rid)
        try:
            async for n in self._run(start, prompt_tokens, out, streaming):
                yield n
        finally:
            self.rids.remove(rid)

    async def _run(self, start: float, prompt_tokens: int, out: Output, streaming: bool
                   ) -> AsyncIterator[int]:
        self.queued += 1
        try:
            await self.slots.acquire()
        finally:
            self.queued -= 1
        self.running += 1
        await self._tick()
        if self.prefill_line:  # the scheduler logs every prefill batch (here: one request)
            self.log.info(self.prefill_line(prompt_tokens, self.running, self.queued))
        try:
            await asyncio.sleep(prompt_tokens / self.prefill_rate)
            first = True
            produced = 0
            total = out.tokens
            for accept in out.accept_lengths:
                await asyncio.sleep(1 / self.step_rate)
                await self._tick()
                n = min(max(1, round(accept)), total - produced)
                produced += n
                if first:
                    self.stats.ttft[streaming].observe(time.monotonic() - start)
                    first = False
                self.stats.accept_tokens += accept
                self.stats.forward_steps += 1
                yield n
            if first:
                self.stats.ttft[streaming].observe(time.monotonic() - start)
            self.stats.prompt_tokens += prompt_tokens
            self.stats.generation_tokens += total
            self.stats.requests += 1
            self.stats.recent.append((time.monotonic(), total))
            self.stats.e2e[streaming].observe(time.monotonic() - start)
        finally:
            self.running -= 1
            self.slots.release()

    @staticmethod
    def steps_for(tokens: int, accept: float) -> int:
        return math.ceil(tokens / max(accept, 1.0))
