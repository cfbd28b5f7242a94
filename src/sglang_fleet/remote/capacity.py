"""Capacity report from one SGLang invocation's startup log lines (standard library only: the
gate runs it on the host, and ``sglang-fleet capacity LOG`` on any log).

    cap = parse(journal_lines, version="0.5.12")
    for line in report(cap): print(line)   # the gate's and the CLI's lines

Every rank (TP, DP, PP, EP, ... : the "[time DP1 TP3] " prefix) logs its own model runners'
lines; the lines are grouped by rank, and one rank's figures are the server's (TP0's, which logs
the scheduler's summary), with a note when ranks differ. With speculative decoding each rank
logs a second runner, the draft worker: told apart by its class (..MTP, ..NextN, ..Eagle..) or,
within one rank, as the runner after the target; its pool lines go to the runner that has not
logged "Memory pool end" yet. A log cut before the scheduler's summary gives a partial report
(``state``), with what is missing and the error that ended it. Releases before 0.5.17 cap
max_running_requests by the mamba state cache without saying so; the cap is inferred from the
slots, the slots per request of the effective strategy and max_running_requests.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field
from typing import Any

from . import crash  # uploaded to the host with this module

# SGLang's formats, each line read one field at a time: a field a release or a fork leaves out
# stays unknown and never costs the others. A line may carry a journal or container prefix and
# SGLang's own "[time RANKS] " prefix. Sources (inside each wheel, sglang/srt/):
# model_executor/model_runner.py "Load weight end. elapsed=.., type=.., [quant=.., ]avail mem=..
#   GB, mem usage=.. GB." (0.5.10 - 0.5.23; older releases: "type=.., dtype=.., avail mem=..
#   GB[, mem usage=.. GB]", no elapsed); 0.5.18+ overlapped loading's "Load weight end.
#   Committed real weights ..." carries no figure;
# mem_cache/memory_pool.py "[LABEL ]KV Cache is allocated|VA upper bound. [dtype: .., ]#tokens:
#   .., K size: .. GB, V size: .. GB" or "KV size: .. GB" (dtype from 0.5.13, labels "Full",
#   "SWA", "MiniMax ..." and "VA upper bound" from 0.5.19) and "Mamba Cache is allocated.
#   max_mamba_cache_size: .., conv_state size: ..GB, ssm_state size: ..GB[ intermediate_...]";
# model_runner_components/kv_pool_runtime.py (0.5.17+) "Post-capture KV sizing: [draft ]KV cache
#   allocated. dtype: .., #tokens: .., KV size: .. GB": the pool as resized after the capture;
# model_runner_kv_cache_mixin.py (0.5.10 - 0.5.16) / mem_cache/kv_cache_configurator.py (0.5.17+)
#   "Memory pool end. avail mem=.. GB", "max_running_requests is capped to N by the mamba state
#   cache (max_mamba_cache_size=M, K state slots per request)" (0.5.17+), "max_running_requests
#   was reduced from the requested N to M" (0.5.14+);
# managers/scheduler.py "max_total_num_tokens=.., chunked_prefill_size=.., max_prefill_tokens=..,
#   max_running_requests=.., context_len=.., available_gpu_mem=.. GB" (forks drop fields, old
#   releases have no available_gpu_mem, bench_one_batch prints max_total_num_tokens alone);
# entrypoints/engine.py "server_args=ServerArgs(...)" (repr) or "server_args={...}" (0.5.19+).
#
# The rank prefix: managers/scheduler.py run_scheduler_process builds " DP{d}", " PP{p}",
# " ATTN_CP{c}", " MOE_DP{m}", " TP{t}", " EP{e}" (each only when that size > 1, in this order),
# utils/common.py configure_logger formats "[%(asctime)s[.%(msecs)03d]{prefix}] "; the encoder
# servers use " encode_server" and " encode_dp_worker[N]"; releases before 0.4 logged the time
# without the date. Every rank logs its own model runners' lines; only TP0 logs the summary.
PREFIX = re.compile(r"\[?(?:\d{4}-\d\d-\d\d[ T])?\d\d:\d\d:\d\d(?:[.,]\d+)?"
                    r"(?P<ranks>(?: [A-Za-z]\w*(?:\[\d+\])?)*)\] ")
LOAD_END = "Load weight end."
KV_LINE = re.compile(r"KV [Cc]ache (?:is allocated|VA upper bound|allocated)\.")
POST_CAPTURE = "Post-capture KV sizing:"
MAMBA_LINE = "Mamba Cache is allocated."
POOL_END = "Memory pool end."
SUMMARY_LINE = re.compile(r"(?:^|: )max_total_num_tokens=\d")
CAPPED_LINE = "max_running_requests is capped to"
REDUCED_LINE = "max_running_requests was reduced from the requested"
READY_LINE = "The server is fired up and ready to roll!"
SERVER_ARGS = re.compile(r"server_args=(?:ServerArgs\(|\{)")
NUMBER = r"(-?\d+(?:\.\d+)?)"
FIELDS = {  # one pattern per field, searched alone
    "elapsed": re.compile(r"\belapsed=([\d.]+) ?s\b"),
    "arch": re.compile(r"\btype=([A-Za-z_][\w.]*)"),
    "avail": re.compile(r"\bavail mem=([\d.]+) ?GB"),
    "usage": re.compile(r"\bmem usage=([\d.]+) ?GB"),
    "tokens": re.compile(r"#tokens: (\d+)"),
    "k": re.compile(r"\bK size: ([\d.]+) ?GB"),
    "v": re.compile(r"\bV size: ([\d.]+) ?GB"),
    "kv": re.compile(r"\bKV size: ([\d.]+) ?GB"),
    "slots": re.compile(r"max_mamba_cache_size[:=] ?(\d+)"),
    "conv": re.compile(r"\bconv_state size: ([\d.]+) ?GB"),
    "ssm": re.compile(r"\bssm_state size: ([\d.]+) ?GB"),
    "iss": re.compile(r"intermediate_ssm_state_cache size: ([\d.]+) ?GB"),
    "icw": re.compile(r"intermediate_conv_window_cache size: ([\d.]+) ?GB"),
    "cap": re.compile(r"capped to (\d+)"),
    "per": re.compile(r"(\d+) state slots per request"),
    "requested": re.compile(r"from the requested (\d+)"),
    "to": re.compile(r"from the requested \d+ to (\d+)"),
}
SUMMARY_FIELD = re.compile(r"\b(\w+)=" + NUMBER)
# Speculative draft models' classes (sglang/srt/models: *MTP, *NextN, *Eagle*, DFlash*, DSpark*):
# a runner of such a class is the draft worker, whatever the order of the lines.
DRAFT_ARCH = re.compile(r"MTP|NextN|Nextn|Eagle|EAGLE|DFlash|DSpark|Draft|Medusa")
RESERVE_GB = 4.0  # what to leave free for activations and fragmentation when advising
DEFAULT_MAMBA_RATIO = 0.9  # --mamba-full-memory-ratio's default (server_args.py, every release)
CAPPED_LINE_FROM = (0, 5, 17)  # kv_cache_configurator.resolve_max_num_reqs first says so
COMPLETE, PARTIAL, NOT_A_LOG = "complete", "partial", "not a startup log"


@dataclass
class Worker:
    """One model runner's figures on one rank: the target, or the speculative draft worker."""

    role: str = "target"
    architecture: str | None = None
    weights_gb: float | None = None
    kv_tokens: int | None = None
    kv_gb: float | None = None
    pool_end_gb: float | None = None
    mamba_slots: int | None = None
    mamba_gb: float | None = None
    mamba_intermediate_gb: float | None = None

    def empty(self) -> bool:
        return all(getattr(self, f) is None for f in ("architecture", "weights_gb", "kv_tokens",
                                                      "pool_end_gb", "mamba_slots"))


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


def server_args(line: str) -> dict[str, str]:
    """The fields of SGLang's ``server_args=`` line, as text: 'extra_buffer', 'False', '48'."""
    start = SERVER_ARGS.search(line)
    if not start:
        return {}
    pairs = re.findall(r"['\"]?(\w+)['\"]?(?:=|: )('[^']*'|\"[^\"]*\"|[\w.+-]+)",
                       line[start.end():])
    return {k: v.strip("'\"") for k, v in pairs}


def split_prefix(line: str) -> tuple[str, str]:
    """(ranks, message) of one log line: ("DP1 TP3", "KV Cache is allocated. ...");
    ranks "" when the line has no SGLang prefix or no rank in it.

        split_prefix("Nov 30 b200 python[42]: [2026-11-30 06:29:24 TP3] Memory pool end. ...")
        # ('TP3', 'Memory pool end. ...')
    """
    m = PREFIX.search(line)
    if not m:
        return "", line.strip()
    return m["ranks"].strip(), line[m.end():].strip()


def _rank_key(rank: str) -> tuple[int, ...]:
    """DP0 TP0 before DP0 TP1 before DP1 TP0: the numbers in the prefix's order."""
    return tuple(int(n) for n in re.findall(r"\d+", rank))


def _field(name: str, text: str) -> str | None:
    m = FIELDS[name].search(text)
    return m.group(1) if m else None


def _number(value: str | None) -> float | None:
    """A figure as SGLang prints it; None for what no figure is ("1.2.3", 400 digits)."""
    try:
        number = float(value) if value is not None else None
    except ValueError:
        return None
    return number if number is not None and math.isfinite(number) else None


def _float(name: str, text: str) -> float | None:
    return _number(_field(name, text))


def _int(name: str, text: str) -> int | None:
    value = _number(_field(name, text))
    return int(value) if value is not None else None


def _add(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else a + b


@dataclass
class _Rank:
    """One rank's lines: its model runners in the order it logged them, and its scheduler's."""

    workers: list[Worker] = field(default_factory=list)
    summary: dict[str, float] = field(default_factory=dict)
    capped: dict[str, int | None] = field(default_factory=dict)
    reduced: dict[str, int | None] = field(default_factory=dict)
    closed: int = 0  # runners whose "Memory pool end" was logged: the first ones

    def target(self) -> Worker | None:
        return next((w for w in self.workers if w.role == "target"), None)

    def draft(self) -> Worker | None:
        return next((w for w in self.workers if w.role == "draft"), None)

    def open_worker(self) -> Worker:
        """The runner a pool line belongs to: one process builds its runners one after the
        other, each logging its pools before "Memory pool end"; the first without that line."""
        if self.closed < len(self.workers):
            return self.workers[self.closed]
        w = Worker(role="draft" if self.target() else "target")
        self.workers.append(w)
        return w

    def worker(self, role: str) -> Worker:
        found = self.target() if role == "target" else self.draft()
        if found is None:
            found = Worker(role=role)
            self.workers.append(found)
        return found

    def has_figures(self) -> bool:
        return bool(self.summary or self.capped or self.reduced
                    or any(not w.empty() for w in self.workers))


@dataclass(frozen=True)
class Event:
    """What one line was: its kind ("load", "kv", "mamba", "pool", "summary", "capped",
    "reduced", "ready", "args"), the rank that logged it and, for a runner's line, whose."""

    kind: str
    rank: str = ""
    role: str | None = None


class Reader:
    """Reads the lines of one or more startups; the last startup wins.

        reader = Reader()
        for line in lines: reader.line(line)   # each returns an Event, or None
        reader.result("0.5.23")                # Capacity
    """

    def __init__(self) -> None:
        self.ranks: dict[str, _Rank] = {}
        self.args: dict[str, str] = {}
        self.lines: list[str] = []  # this startup's, for the error that ended it
        self.done = self.ready = False

    def restart(self) -> None:
        self.ranks, self.lines, self.done, self.ready = {}, [], False, False

    def line(self, text: str) -> Event | None:
        self.lines.append(text)
        if args := server_args(text):
            if any(r.has_figures() for r in self.ranks.values()):
                self.restart()
                self.lines.append(text)
            self.args = args
            return Event("args")
        rank, message = split_prefix(text)
        if LOAD_END in message:
            return self._load(rank, message)
        if READY_LINE in message:
            self.ready = True
            return Event("ready", rank)
        return self._pools(rank, message) or self._scheduler(rank, message)

    def _rank(self, rank: str) -> _Rank:
        return self.ranks.setdefault(rank, _Rank())

    def _load(self, rank: str, text: str) -> Event | None:
        arch, usage, avail = _field("arch", text), _float("usage", text), _float("avail", text)
        if arch is None and usage is None and avail is None:
            return None  # 0.5.18+ "Committed real weights after CUDA graph capture": no figure
        draft = bool(arch and DRAFT_ARCH.search(arch))
        if (self.done or self.ready) and not draft and self._rank(rank).target():
            self.restart()  # a new start without its server_args line (another log level)
        state = self._rank(rank)
        role = "draft" if draft or state.target() else "target"
        last = state.workers[-1] if state.workers else None
        if last is not None and last.empty() and len(state.workers) > state.closed:
            state.workers.pop()
        state.workers.append(Worker(role=role, architecture=arch, weights_gb=usage))
        return Event("load", rank, role)

    def _pools(self, rank: str, text: str) -> Event | None:
        state = self._rank(rank) if rank in self.ranks else None
        if (kv := KV_LINE.search(text)) and "#tokens:" in text:
            state = state or self._rank(rank)
            label = text[:kv.start()].strip()  # "Full", "SWA", "Post-capture ...: draft"
            return Event("kv", rank, self._kv(state, label, text))
        if MAMBA_LINE in text:
            state = state or self._rank(rank)
            w = state.open_worker()
            w.mamba_slots = _int("slots", text)
            w.mamba_gb = _add(_float("conv", text), _float("ssm", text))
            w.mamba_intermediate_gb = _add(_float("iss", text), _float("icw", text))
            return Event("mamba", rank, w.role)
        if POOL_END in text:
            state = state or self._rank(rank)
            w = state.open_worker()
            w.pool_end_gb = _float("avail", text)
            state.closed += 1
            return Event("pool", rank, w.role)
        return None

    def _kv(self, state: _Rank, label: str, text: str) -> str:
        tokens = _int("tokens", text)
        k, v, kv = _float("k", text), _float("v", text), _float("kv", text)
        size = kv if kv is not None else _add(k, v) if k is not None and v is not None else None
        if POST_CAPTURE in text:  # the pool as resized after the capture replaces its figures
            w = state.worker("draft" if "draft" in label.lower() else "target")
            w.kv_tokens, w.kv_gb = tokens, size
            return w.role
        w = state.open_worker()
        # A hybrid SWA model logs one pool per layer kind ("Full", "SWA"): the sizes add up,
        # the full layers' tokens are the ones max_total_num_tokens counts.
        if w.kv_tokens is None or "swa" not in label.lower():
            w.kv_tokens = tokens if tokens is not None else w.kv_tokens
        w.kv_gb = _add(w.kv_gb, size)
        return w.role

    def _scheduler(self, rank: str, text: str) -> Event | None:
        if SUMMARY_LINE.search(text):
            summary = {k: v for k, raw in SUMMARY_FIELD.findall(text)
                       if (v := _number(raw)) is not None}
            self._rank(rank).summary = summary
            self.done = True
            return Event("summary", rank)
        if CAPPED_LINE in text:
            self._rank(rank).capped = {n: _int(n, text) for n in ("cap", "slots", "per")}
            return Event("capped", rank)
        if REDUCED_LINE in text:
            self._rank(rank).reduced = {n: _int(n, text) for n in ("requested", "to")}
            return Event("reduced", rank)
        return None

    def result(self, version: str | None = None) -> Capacity:
        return _capacity(self, version)


def _reference(ranks: dict[str, _Rank]) -> list[str]:
    """The ranks with figures, the one whose figures the report shows first: the scheduler's
    summary comes from TP0 (scheduler.py logs it ``if tp_rank == 0``), else the lowest rank."""
    order = sorted((k for k, r in ranks.items() if r.has_figures()), key=_rank_key)
    with_summary = [k for k in order if ranks[k].summary]
    return with_summary[:1] + [k for k in order if k not in with_summary[:1]]


def _first(values: list[Any]) -> Any:
    return next((v for v in values if v is not None), None)


def _differ(name: str, order: list[str], values: list[Any]) -> str | None:
    seen = {(k, v) for k, v in zip(order, values, strict=True) if v is not None}
    if len({v for _, v in seen}) < 2:
        return None
    shown = ", ".join(f"{k or 'no rank'} {v}" for k, v in sorted(seen, key=lambda kv:
                                                                 _rank_key(kv[0])))
    return f"{name} differ between ranks ({shown}): the report shows {order[0] or 'no rank'}'s"


def _capacity(reader: Reader, version: str | None) -> Capacity:
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


def _running_limit(rank: _Rank) -> int | None:
    """One scheduler's max running requests: its summary, else its reduced or capped line."""
    value = _first([rank.summary.get("max_running_requests"), rank.reduced.get("to"),
                    rank.capped.get("cap")])
    return int(value) if value is not None else None


def _dp_total(cap: Capacity, ranks: dict[str, _Rank]) -> None:
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


def parse(lines: list[str], version: str | None = None) -> Capacity:
    """The last startup's figures (a restart in the same journal replaces earlier ones);
    ``version`` is the SGLang release that wrote them, when known."""
    reader = Reader()
    for line in lines:
        reader.line(line)
    return reader.result(version)


def _shown(value: float | None, unit: str = "", digits: int = 0) -> str:
    if value is None:
        return "not logged"
    return f"{value:.{digits}f}{unit}" if digits else f"{value}{unit}"


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
    """The report's lines, the same for the gate and ``sglang-fleet capacity``: the figures,
    what differs between ranks, for a log cut before the server was up what is missing and the
    error that ended it, then the advice."""
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
    """What an operator should change, in SGLang's flags and the profile's keys; nothing when
    max running requests already reaches ``target``."""
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

