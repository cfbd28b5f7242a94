"""Capacity report from one SGLang invocation's startup log lines (standard library only: the
gate runs it on the host, and ``sglang-fleet capacity LOG`` on any log).

    cap = parse(journal_lines, version="0.5.12")
    for line in report(cap): print(line)   # the gate's and the CLI's lines

capacity_log.py reads the lines, each rank's apart; capacity_figures.py decides the server's
figures from the ranks; this module says what the figures mean: the report and the advice.
"""

from __future__ import annotations

from .capacity_figures import (
    COMPLETE,
    NOT_A_LOG,
    PARTIAL,
    Capacity,
    running_limit,
    server_figures,
    slots_per_request,
)
from .capacity_log import Event, LineReader, Worker, split_prefix

# What other code reads through this module (the CLI, sizing, the gate, readiness).
__all__ = ["COMPLETE", "DEFAULT_MAMBA_RATIO", "NOT_A_LOG", "PARTIAL", "RESERVE_GB", "Capacity",
           "Event", "Reader", "Worker", "advice", "parse", "report", "running_limit",
           "slots_per_request", "split_prefix", "summary"]

RESERVE_GB = 4.0  # what to leave free for activations and fragmentation when advising
DEFAULT_MAMBA_RATIO = 0.9  # --mamba-full-memory-ratio's default (server_args.py, every release)


class Reader(LineReader):
    """Reads the lines of one or more startups; the last startup wins.

        reader = Reader()
        for line in lines: reader.line(line)   # each returns an Event, or None
        reader.result("0.5.23")                # Capacity
    """

    def result(self, version: str | None = None) -> Capacity:
        return server_figures(self, version)


def parse(lines: list[str], version: str | None = None) -> Capacity:
    """The last startup's figures; ``version``: the SGLang release that wrote them, if known."""
    reader = Reader()
    for line in lines:
        reader.line(line)
    return reader.result(version)


def _shown(value: float | None) -> str:
    return "not logged" if value is None else f"{value}"


def summary(cap: Capacity) -> str:
    parts = [f"KV tokens {_shown(cap.kv_tokens)}"]
    if cap.mamba_slots is not None:
        size = "" if cap.mamba_gb is None else f" ({cap.mamba_gb:.2f} GB" + (
            f" + {cap.mamba_intermediate_gb:.2f} GB draft state)"
            if cap.mamba_intermediate_gb else ")")
        parts.append(f"mamba slots {cap.mamba_slots}{size}")
    if cap.dp_ranks > 1:
        parts.append(f"max running requests {_shown(cap.max_running_requests)} per DP rank, "
                     f"{_shown(cap.total_running_requests)} for the server "
                     f"({cap.dp_ranks} DP ranks)")
    else:
        parts.append(f"max running requests {_shown(cap.max_running_requests)}")
    if cap.available_gpu_gb is not None:
        parts.append(f"GPU memory free {cap.available_gpu_gb:.2f} GB")
    parts.append(f"context {_shown(cap.context_len)}")
    if cap.draft is not None:
        parts.append(f"draft worker {cap.draft.architecture or '(class not logged)'} "
                     f"(KV tokens {_shown(cap.draft.kv_tokens)})")
    if len(cap.ranks) > 1:
        parts.append(f"figures of {cap.rank or 'the unranked lines'} "
                     f"({len(cap.ranks)} ranks logged)")
    return ", ".join(parts)


def report(cap: Capacity, target: int = 48) -> list[str]:
    """The report's lines (the gate's and ``sglang-fleet capacity``): the figures, rank differences,
    what a cut log misses and the error that ended it, then the advice."""
    if cap.state == NOT_A_LOG:
        return []
    head = "capacity: " if cap.state == COMPLETE else \
        "capacity (partial: the log ends before the server was up): "
    lines = [head + summary(cap)]
    lines += [f"ranks: {note}" for note in cap.rank_notes]
    if cap.state == PARTIAL:
        lines.append("missing: " + (", ".join(cap.missing) or "nothing the report reads"))
    if cap.error:
        lines.append(f"last error: {cap.error}")
    lines += [f"advice: {line}" for line in advice(cap, target)]
    return lines


def _mamba_levers(cap: Capacity, slots: int) -> list[str]:
    """SGLang's own levers, each with a number: more slots directly, a larger share of the
    pool for mamba state (a higher ratio: more slots, fewer KV tokens), or a smaller state."""
    assert cap.mamba_slots
    ratio = float(cap.server_args.get("mamba_full_memory_ratio", DEFAULT_MAMBA_RATIO)
                  if cap.server_args.get("mamba_full_memory_ratio", "None") != "None"
                  else DEFAULT_MAMBA_RATIO)
    share = ratio / (1 + ratio) * slots / cap.mamba_slots  # mamba share of the pool needed
    levers = [f"--max-mamba-cache-size {slots} (memory.max_mamba_cache_size)"]
    if share < 0.95:
        levers.append(f"--mamba-full-memory-ratio {share / (1 - share):.2f} "
                      f"(mamba.full_memory_ratio; now {ratio:g}; takes KV cache tokens)")
    if cap.server_args.get("mamba_ssm_dtype", "None") in ("None", "float32"):
        levers.append(f"--mamba-ssm-dtype bfloat16 (about {2 * cap.mamba_slots} slots in the "
                      "same memory if the SSM state is float32)")
    return levers


def _mamba_advice(cap: Capacity, target: int) -> str | None:
    if not (cap.capped_by_mamba and cap.mamba_slots and cap.slots_per_request
            and cap.max_running_requests is not None):
        return None
    if cap.max_running_requests >= target:
        return None  # capped, but at or above what the operator asks for: nothing to raise
    how = "inferred: this release does not log the cap" if cap.cap_inferred else "logged"
    line = (f"max running requests {cap.max_running_requests} is capped by the mamba cache "
            f"({cap.mamba_slots} slots, {cap.slots_per_request} per request; {how})")
    if cap.mamba_gb is None or cap.available_gpu_gb is None:
        # The cap line gives the slots but not their size, or the free memory is not logged:
        # the slots the target needs, and what the operator must check.
        return (f"{line}: for {target} running requests use --max-mamba-cache-size "
                f"{target * cap.slots_per_request} (memory.max_mamba_cache_size) if the GPU "
                "has room for it (the log does not give the mamba state's size or the free "
                "memory)")
    # Each running request costs its state slots plus its share of the draft (speculative)
    # intermediate state, which SGLang sizes by the running requests.
    per_slot = cap.mamba_gb / (cap.mamba_slots + 1)
    per_request = (cap.slots_per_request * per_slot
                   + cap.mamba_intermediate_gb / (cap.max_running_requests + 1))
    spare = max(cap.available_gpu_gb - RESERVE_GB, 0.0)
    requests = min(cap.max_running_requests + int(spare / max(per_request, 1e-9)), target)
    slots = requests * cap.slots_per_request
    line += f" while {cap.available_gpu_gb:.0f} GB is free"
    if slots > cap.mamba_slots:
        return (f"{line}: for up to {slots // cap.slots_per_request} running requests use "
                + " or ".join(_mamba_levers(cap, slots)))
    return (f"{line}: no spare memory for more slots; raise --mem-fraction-static "
            "(memory.mem_fraction_static) to give the pools more of the GPU")


def advice(cap: Capacity, target: int = 48) -> list[str]:
    """What an operator should change; nothing when max running requests reaches ``target``."""
    out = []
    if line := _mamba_advice(cap, target):
        out.append(line)
    mrr = cap.max_running_requests
    if cap.capped_by_kv and mrr is not None and mrr < target:
        out.append(f"max running requests {mrr} is capped by the KV cache "
                   f"(requested {_shown(cap.requested_running_requests)}, "
                   f"{_shown(cap.kv_tokens)} tokens): raise --mem-fraction-static "
                   "(memory.mem_fraction_static) or lower --context-length "
                   "(memory.context_length)")
    return out
