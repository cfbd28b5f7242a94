"""A server's capacity figures (``Capacity``) from the ranks a ``capacity_log.LineReader``
read (standard library only: runs on the host with the gate).

TP0's figures are the server's, with a note when ranks differ; with --dp-size the running
requests are the DP replicas' sum. Releases before 0.5.17 cap max_running_requests by the mamba
state cache without saying so; the cap is inferred from the slots.

    cap = server_figures(reader, "0.5.12")   # Capacity(kv_tokens=..., state='complete', ...)
    running_limit({"max_running_requests": 48, "dp_size": 8})   # 384
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any

from . import crash
from .capacity_log import LineReader, Rank, Worker, rank_key

CAPPED_LINE_FROM = (0, 5, 17)  # kv_cache_configurator.resolve_max_num_reqs first says so
COMPLETE, PARTIAL, NOT_A_LOG = "complete", "partial", "not a startup log"


@dataclass
class Capacity:
    kv_tokens: int | None = None
    kv_gb: float | None = None
    weights_gb: float | None = None
    mamba_slots: int | None = None
    mamba_gb: float | None = None
    mamba_intermediate_gb: float = 0.0
    slots_per_request: int | None = None
    max_running_requests: int | None = None
    capped_by_mamba: bool = False
    cap_inferred: bool = False  # the release did not print the cap; worked out from the slots
    capped_by_kv: bool = False
    requested_running_requests: int | None = None
    available_gpu_gb: float | None = None
    context_len: int | None = None
    chunked_prefill_size: int | None = None
    max_prefill_tokens: int | None = None
    pool_end_gb: float | None = None
    architecture: str | None = None
    draft: Worker | None = None
    # The server's total over its DP ranks: with --dp-size (no DP attention) every DP rank is a
    # replica whose scheduler logs its own summary, and max_running_requests is each one's.
    dp_ranks: int = 1
    total_running_requests: int | None = None
    rank: str | None = None  # whose figures these are ("TP0"; "" when the log has no ranks)
    ranks: list[str] = field(default_factory=list)
    rank_notes: list[str] = field(default_factory=list)  # figures that differ between ranks
    state: str = NOT_A_LOG  # COMPLETE: the scheduler's summary was logged; PARTIAL: cut before
    error: str | None = None  # the line that says why the server ended, when it did
    server_args: dict[str, str] = field(default_factory=dict)
    missing: list[str] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def _release(version: str | None) -> tuple[int, ...] | None:
    m = re.match(r"(\d+)\.(\d+)\.(\d+)", version or "")
    return tuple(int(x) for x in m.groups()) if m else None


def _reference(ranks: dict[str, Rank]) -> list[str]:
    """The ranks with figures, the one whose figures the report shows first: the scheduler's
    summary comes from TP0 (scheduler.py logs it ``if tp_rank == 0``), else the lowest rank."""
    order = sorted((k for k, r in ranks.items() if r.has_figures()), key=rank_key)
    with_summary = [k for k in order if ranks[k].summary]
    return with_summary[:1] + [k for k in order if k not in with_summary[:1]]


def _first(values: list[Any]) -> Any:
    return next((v for v in values if v is not None), None)


def _differ(name: str, order: list[str], values: list[Any]) -> str | None:
    seen = {(k, v) for k, v in zip(order, values, strict=True) if v is not None}
    if len({v for _, v in seen}) < 2:
        return None
    shown = ", ".join(f"{k or 'no rank'} {v}" for k, v in sorted(seen, key=lambda kv:
                                                                 rank_key(kv[0])))
    return f"{name} differ between ranks ({shown}): the report shows {order[0] or 'no rank'}'s"


def server_figures(reader: LineReader, version: str | None) -> Capacity:
    """The server's figures from what ``reader`` read; ``version``: the release that logged it."""
    ranks = reader.ranks
    order = _reference(ranks)
    targets = [ranks[k].target() or Worker() for k in order]
    drafts = [d for k in order if (d := ranks[k].draft()) is not None]

    def target(name: str) -> Any:  # the reference rank's figure, else the next rank's
        return _first([getattr(w, name) for w in targets])

    def scheduler(part: str, name: str) -> Any:
        return _first([getattr(ranks[k], part).get(name) for k in order])

    cap = Capacity(server_args=dict(reader.args), rank=order[0] if order else None,
                   ranks=order, draft=drafts[0] if drafts else None)
    cap.architecture, cap.weights_gb = target("architecture"), target("weights_gb")
    cap.kv_gb, cap.pool_end_gb = target("kv_gb"), target("pool_end_gb")
    cap.mamba_slots = _first([target("mamba_slots"), scheduler("capped", "slots")])
    cap.mamba_gb = target("mamba_gb")
    cap.mamba_intermediate_gb = target("mamba_intermediate_gb") or 0.0
    _summary_figures(cap, scheduler, target("kv_tokens"))
    cap.rank_notes = [note for name, attr in (("KV tokens", "kv_tokens"),
                                              ("mamba slots", "mamba_slots"),
                                              ("architectures", "architecture"))
                      if (note := _differ(name, order, [getattr(w, attr) for w in targets]))]
    _infer_mamba_cap(cap, version)
    _dp_total(cap, ranks)
    cap.state = (COMPLETE if reader.done or reader.ready else
                 PARTIAL if order else NOT_A_LOG)
    cap.error = crash.cause(reader.lines) if order else None
    cap.missing = [name for name, value in (("weights", cap.weights_gb),
                                            ("KV cache", cap.kv_tokens),
                                            ("max_running_requests", cap.max_running_requests),
                                            ("context_len", cap.context_len),
                                            ("available GPU memory", cap.available_gpu_gb))
                   if value is None]
    return cap


def _summary_figures(cap: Capacity, scheduler: Any, kv_tokens: int | None) -> None:
    """The scheduler's summary and cap lines; a figure a line lacks comes from the runners'."""
    def whole(name: str) -> int | None:
        value = scheduler("summary", name)
        return int(value) if value is not None else None

    total = whole("max_total_num_tokens")
    cap.kv_tokens = total if total is not None else kv_tokens
    cap.chunked_prefill_size, cap.max_prefill_tokens = (whole("chunked_prefill_size"),
                                                        whole("max_prefill_tokens"))
    cap.context_len = whole("context_len")
    free = _first([scheduler("summary", "available_gpu_mem"),
                   scheduler("summary", "available_cpu_mem")])
    cap.available_gpu_gb = float(free) if free is not None else None
    capped, reduced = scheduler("capped", "cap"), scheduler("reduced", "to")
    cap.max_running_requests = _first([whole("max_running_requests"), reduced, capped])
    cap.capped_by_mamba = capped is not None or scheduler("capped", "slots") is not None
    cap.slots_per_request = scheduler("capped", "per")
    cap.requested_running_requests = scheduler("reduced", "requested")
    cap.capped_by_kv = cap.requested_running_requests is not None or reduced is not None


DP_RANK = re.compile(r"\bDP(\d+)\b")  # " DP3" of the prefix; not MOE_DP's


def _running_limit(rank: Rank) -> int | None:
    """One scheduler's max running requests: its summary, else its reduced or capped line."""
    value = _first([rank.summary.get("max_running_requests"), rank.reduced.get("to"),
                    rank.capped.get("cap")])
    return int(value) if value is not None else None


def _dp_total(cap: Capacity, ranks: dict[str, Rank]) -> None:
    """Each DP replica's limit, summed: the schedulers with a DP rank that logged one (each
    replica's TP0: scheduler.py logs the summary ``if tp_rank == 0``; 0.5.12 :775, 0.5.23
    :1267). With DP attention only DP0 TP0 logs it, and the total is that one figure."""
    per_dp: dict[str, int] = {}
    for name, rank in ranks.items():
        dp, limit = DP_RANK.search(name), _running_limit(rank)
        if dp and limit is not None:
            per_dp.setdefault(dp.group(1), limit)
    cap.dp_ranks = max(len(per_dp), 1)
    cap.total_running_requests = sum(per_dp.values()) if len(per_dp) > 1 \
        else cap.max_running_requests


def running_limit(info: dict[str, Any]) -> int | None:
    """A server's running-request limit from its /server_info: what each DP rank reports it runs
    (``internal_states``, one per DP rank), else the argument, which is each DP rank's (given
    only when set; with --dp-size every replica runs that many).

        running_limit({"max_running_requests": 48, "dp_size": 8})   # 384
    """
    ranks = info.get("internal_states")
    per_rank = [r.get("effective_max_running_requests_per_dp") for r in
                (ranks if isinstance(ranks, list) else []) if isinstance(r, dict)]
    known = [v for v in per_rank if isinstance(v, int) and not isinstance(v, bool) and v > 0]
    if known:
        return sum(known)
    value, dp = info.get("max_running_requests"), info.get("dp_size")
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value * (dp if isinstance(dp, int) and not isinstance(dp, bool) and dp > 0 else 1)
    return None


def slots_per_request(args: dict[str, str], version: str | None) -> int | None:
    """_calculate_mamba_ratio of the effective strategy: 1 with the radix cache off; else 3,
    plus 2 for extra_buffer with the overlap schedule (1 without, 1 for extra_buffer_lazy).
    "auto" is no_buffer before 0.5.14; later it is resolved before this line is logged."""
    strategy = args.get("mamba_radix_cache_strategy") or args.get("mamba_scheduler_strategy")
    if strategy is None:
        return None
    if args.get("disable_radix_cache") == "True":
        return 1
    release = _release(version)
    if strategy == "auto" and (release is None or release >= (0, 5, 14)):
        return None  # resolved later than the logged arguments: cannot tell
    if strategy == "extra_buffer_lazy":
        return 4
    if strategy == "extra_buffer":
        return 5 if args.get("disable_overlap_schedule") != "True" else 4
    return 3


def _infer_mamba_cap(cap: Capacity, version: str | None) -> None:
    """Releases before 0.5.17 cap max_running_requests to slots // ratio silently."""
    release = _release(version)
    if (cap.capped_by_mamba or cap.mamba_slots is None or cap.max_running_requests is None
            or (release is not None and release >= CAPPED_LINE_FROM)):
        return
    known = slots_per_request(cap.server_args, version)
    candidates = [known] if known else [r for r in (5, 4, 3) if cap.mamba_slots // r
                                        == cap.max_running_requests]
    if len(candidates) != 1 or cap.mamba_slots // candidates[0] != cap.max_running_requests:
        return
    requested = cap.server_args.get("max_running_requests", "None")
    if requested.isdigit() and int(requested) <= cap.max_running_requests:
        return  # the limit asked for, not the cache
    cap.capped_by_mamba = cap.cap_inferred = True
    cap.slots_per_request = candidates[0]
