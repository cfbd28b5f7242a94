"""Capacity report from one SGLang invocation's startup log lines (standard library only: the
gate runs it on the host, and ``sglang-fleet capacity LOG`` on any log).

    report = parse(journal_lines, version="0.5.12")
    for line in advice(report): print(line)

With speculative decoding the draft worker logs its own "Load weight end", "KV Cache is
allocated" and "Memory pool end" after the main worker's: the report keeps the main worker's and
counts the draft's separately. Releases before 0.5.17 cap max_running_requests by the mamba state
cache without saying so; the cap is inferred from the slots, the slots per request of the
effective strategy and max_running_requests.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any

# SGLang's formats; a line may carry a journal prefix and a rank prefix. Sources:
# model_executor/model_runner.py "Load weight end" (every release);
# mem_cache/memory_pool.py "KV Cache is allocated" (no "dtype:" before 0.5.13; an allocation
#   label and "VA upper bound" from 0.5.19) and "Mamba Cache is allocated";
# model_runner_kv_cache_mixin.py (0.5.10 - 0.5.16) / mem_cache/kv_cache_configurator.py (0.5.17+)
#   "Memory pool end", "max_running_requests is capped to" (0.5.17+), "was reduced from the
#   requested" (0.5.14+); managers/scheduler.py the max_total_num_tokens summary;
# entrypoints/engine.py "server_args=ServerArgs(...)" (repr) or "server_args={...}" (0.5.19+ dict).
LOAD = re.compile(r"Load weight end\. elapsed=(?P<elapsed>[\d.]+) s, type=(?P<arch>[\w.]+), "
                  r"(?:.*?, )?avail mem=(?P<avail>[\d.]+) GB, mem usage=(?P<weights>[\d.]+) GB")
KV = re.compile(r"KV Cache (?:is allocated|VA upper bound)\. (?:dtype: (?P<dtype>\S+), )?"
                r"#tokens: (?P<tokens>\d+), (?:K size: (?P<k>[\d.]+) GB, V size: (?P<v>[\d.]+) GB"
                r"|KV size: (?P<kv>[\d.]+) GB)")
MAMBA = re.compile(r"Mamba Cache is allocated\. max_mamba_cache_size: (?P<slots>\d+), "
                   r"conv_state size: (?P<conv>[\d.]+)GB, ssm_state size: (?P<ssm>[\d.]+)GB"
                   r"(?: intermediate_ssm_state_cache size: (?P<iss>[\d.]+)GB "
                   r"intermediate_conv_window_cache size: (?P<icw>[\d.]+)GB)?")
POOL = re.compile(r"Memory pool end\. avail mem=(?P<avail>[\d.]+) GB")
SUMMARY = re.compile(r"max_total_num_tokens=(?P<tokens>\d+), "
                     r"chunked_prefill_size=(?P<chunk>-?\d+), max_prefill_tokens=(?P<prefill>\d+), "
                     r"max_running_requests=(?P<mrr>\d+), "
                     r"context_len=(?P<ctx>\d+), available_(?:gpu|cpu)_mem=(?P<free>[\d.]+) GB")
CAPPED = re.compile(r"max_running_requests is capped to (?P<cap>\d+) by the mamba state cache "
                    r"\(max_mamba_cache_size=(?P<slots>\d+), (?P<per>\d+) state slots per request")
REDUCED = re.compile(r"max_running_requests was reduced from the requested (?P<requested>\d+) "
                     r"to (?P<to>\d+) \(per dp worker\) due to the available KV cache capacity")
SERVER_ARGS = re.compile(r"server_args=(?:ServerArgs\(|\{)")
RESERVE_GB = 4.0  # what to leave free for activations and fragmentation when advising
DEFAULT_MAMBA_RATIO = 0.9  # --mamba-full-memory-ratio's default (server_args.py, every release)
CAPPED_LINE_FROM = (0, 5, 17)  # kv_cache_configurator.resolve_max_num_reqs first says so


@dataclass
class Worker:
    """One model runner's figures: the main worker, or the speculative draft worker."""

    architecture: str | None = None
    weights_gb: float | None = None
    kv_tokens: int | None = None
    kv_gb: float | None = None
    pool_end_gb: float | None = None


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
    architecture: str | None = None
    draft: Worker | None = None
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


class _Reader:
    """Walks the lines of one or more startups; the last startup wins."""

    def __init__(self) -> None:
        self.cap, self.workers, self.done = Capacity(), [Worker()], False

    def restart(self) -> None:
        kept = self.cap.server_args
        self.cap, self.workers, self.done = Capacity(server_args=kept), [], False

    def line(self, text: str) -> None:
        if args := server_args(text):
            self.cap.server_args = args
        elif m := LOAD.search(text):
            if self.done:
                self.restart()
            started = self.workers and self.workers[-1].architecture is not None
            if started or not self.workers:
                self.workers.append(Worker())
            self.workers[-1].architecture = m["arch"]
            self.workers[-1].weights_gb = float(m["weights"])
        elif m := KV.search(text):
            self.workers[-1].kv_tokens = int(m["tokens"])
            self.workers[-1].kv_gb = float(m["kv"]) if m["kv"] else float(m["k"]) + float(m["v"])
        elif m := POOL.search(text):
            self.workers[-1].pool_end_gb = float(m["avail"])
        else:
            self._scheduler(text)

    def _scheduler(self, text: str) -> None:
        cap = self.cap
        if (m := MAMBA.search(text)) and len(self.workers) == 1:
            cap.mamba_slots = int(m["slots"])
            cap.mamba_gb = float(m["conv"]) + float(m["ssm"])
            cap.mamba_intermediate_gb = float(m["iss"] or 0) + float(m["icw"] or 0)
        elif m := CAPPED.search(text):
            cap.capped_by_mamba, cap.slots_per_request = True, int(m["per"])
        elif m := REDUCED.search(text):
            cap.capped_by_kv = True
            cap.requested_running_requests = int(m["requested"])
        elif m := SUMMARY.search(text):
            cap.max_running_requests, cap.context_len = int(m["mrr"]), int(m["ctx"])
            cap.available_gpu_gb = float(m["free"])
            cap.kv_tokens = int(m["tokens"])
            self.done = True


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
    reader = _Reader()
    for line in lines:
        reader.line(line)
    cap, workers = reader.cap, [w for w in reader.workers if w.architecture or w.kv_tokens]
    main = workers[0] if workers else Worker()
    cap.architecture, cap.weights_gb = main.architecture, main.weights_gb
    cap.kv_gb = main.kv_gb
    cap.kv_tokens = cap.kv_tokens if cap.kv_tokens is not None else main.kv_tokens
    cap.draft = workers[1] if len(workers) > 1 else None
    _infer_mamba_cap(cap, version)
    cap.missing = [name for name, value in (("KV cache", cap.kv_tokens),
                                            ("max_running_requests", cap.max_running_requests))
                   if value is None]
    return cap


def summary(cap: Capacity) -> str:
    parts = [f"KV tokens {cap.kv_tokens}"]
    if cap.mamba_slots is not None:
        parts.append(f"mamba slots {cap.mamba_slots} ({cap.mamba_gb:.2f} GB"
                     + (f" + {cap.mamba_intermediate_gb:.2f} GB draft state)"
                        if cap.mamba_intermediate_gb else ")"))
    parts.append(f"max running requests {cap.max_running_requests}")
    if cap.available_gpu_gb is not None:
        parts.append(f"GPU memory free {cap.available_gpu_gb:.2f} GB")
    parts.append(f"context {cap.context_len}")
    if cap.draft is not None:
        parts.append(f"draft worker {cap.draft.architecture} "
                     f"(KV tokens {cap.draft.kv_tokens})")
    return ", ".join(parts)


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
    if not (cap.capped_by_mamba and cap.mamba_slots and cap.mamba_gb and cap.slots_per_request
            and cap.available_gpu_gb is not None and cap.max_running_requests is not None):
        return None
    # Each running request costs its state slots plus its share of the draft (speculative)
    # intermediate state, which SGLang sizes by the running requests.
    per_slot = cap.mamba_gb / (cap.mamba_slots + 1)
    per_request = (cap.slots_per_request * per_slot
                   + cap.mamba_intermediate_gb / (cap.max_running_requests + 1))
    spare = max(cap.available_gpu_gb - RESERVE_GB, 0.0)
    requests = min(cap.max_running_requests + int(spare / per_request), target)
    slots = requests * cap.slots_per_request
    how = "inferred: this release does not log the cap" if cap.cap_inferred else "logged"
    line = (f"max running requests {cap.max_running_requests} is capped by the mamba cache "
            f"({cap.mamba_slots} slots, {cap.slots_per_request} per request; {how}) while "
            f"{cap.available_gpu_gb:.0f} GB is free")
    if slots > cap.mamba_slots:
        return (f"{line}: for up to {slots // cap.slots_per_request} running requests use "
                + " or ".join(_mamba_levers(cap, slots)))
    return (f"{line}: no spare memory for more slots; raise --mem-fraction-static "
            "(memory.mem_fraction_static) to give the pools more of the GPU")


def advice(cap: Capacity, target: int = 48) -> list[str]:
    """What an operator should change, in SGLang's flags and the profile's keys."""
    out = []
    if line := _mamba_advice(cap, target):
        out.append(line)
    if cap.capped_by_kv and cap.max_running_requests is not None:
        out.append(f"max running requests {cap.max_running_requests} is capped by the KV cache "
                   f"(requested {cap.requested_running_requests}, {cap.kv_tokens} tokens): "
                   "raise --mem-fraction-static (memory.mem_fraction_static) or lower "
                   "--context-length (memory.context_length)")
    return out


def job_time(completions: int, tokens: int, per_request_tps: float, running: int) -> str:
    """How long a job of ``completions`` x ``tokens`` output tokens takes at the measured speed,
    with every slot busy (per-request speed drops as batches grow: an optimistic bound)."""
    if per_request_tps <= 0 or running <= 0:
        return "no speed measured"
    seconds = completions * tokens / (per_request_tps * running)
    return (f"{completions:,} completions of {tokens} tokens: about {seconds / 3600:.1f} h at "
            f"{per_request_tps:.0f} tok/s per request x {running} running requests")
