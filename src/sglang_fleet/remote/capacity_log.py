"""SGLang's startup log, line by line (standard library only: runs on the host with the gate):
the formats each release writes, the "[time RANKS] " prefix, and ``LineReader``, which files
each line's figures under the rank that logged it.

With speculative decoding each rank logs a second runner, the draft worker: told apart by its
class (..MTP, ..NextN, ..Eagle..) or, within one rank, as the runner after the target.

    split_prefix("Nov 30 b200 python[42]: [2026-11-30 06:29:24 TP3] Memory pool end. ...")
    # ('TP3', 'Memory pool end. ...')
    reader = LineReader()
    for line in lines: reader.line(line)   # each returns an Event, or None
    reader.ranks["TP0"].target().kv_tokens   # 1234567
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

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


def rank_key(rank: str) -> tuple[int, ...]:
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
class Rank:
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


class LineReader:
    """Reads the lines of one or more startups into each rank's figures (``ranks``), the
    server's arguments (``args``) and this startup's lines; the last startup wins.
    ``capacity.Reader`` adds the server's figures (``result``).

        reader = LineReader()
        for line in lines: reader.line(line)   # each returns an Event, or None
    """

    def __init__(self) -> None:
        self.ranks: dict[str, Rank] = {}
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

    def _rank(self, rank: str) -> Rank:
        return self.ranks.setdefault(rank, Rank())

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

    def _kv(self, state: Rank, label: str, text: str) -> str:
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
