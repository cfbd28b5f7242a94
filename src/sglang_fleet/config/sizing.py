"""``memory.target_running_requests``: the mamba cache sized so that SGLang's effective max
running requests reaches a target, from one start's log and the release's own rules.

    plan = size(capacity.parse(journal, "0.5.12"), 48, launch)
    plan.slots      # 240: --max-mamba-cache-size for 48 requests of 5 slots each
    plan.reason     # or why 48 cannot fit: the GiB missing and the levers

SGLang caps max running requests at ``max_mamba_cache_size // slots per request`` and takes the
mamba slots, and the draft's intermediate state of speculative decoding, out of the memory the
KV cache would get (``handle_max_mamba_cache``: 0.5.12 model_runner_kv_cache_mixin.py:78-137,
0.5.13 the same file; ``_handle_max_mamba_cache``: 0.5.23 kv_cache_configurator.py:3229-3410).
So more slots cost KV cache tokens, never free GPU memory: the sizing moves the budget from one
pool to the other, and what the KV cache keeps must still hold one request of the full context.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import re
from dataclasses import dataclass
from typing import Any

from sglang_fleet import paths
from sglang_fleet.config.profile import Profile
from sglang_fleet.config.releases import at_least
from sglang_fleet.config.render import Launch
from sglang_fleet.remote import capacity

FREE_RESERVE_GB = capacity.RESERVE_GB  # what raising mem_fraction_static must leave free
SPEC_DEFAULT_REQUESTS = 48  # ServerArgs sets max_running_requests to 48 for speculative decoding
# Flags that do not change a server's memory: one remembered size serves every instance.
_PER_INSTANCE_FLAGS = ("--port", "--max-mamba-cache-size")
_PER_INSTANCE_ENV = ("CUDA_VISIBLE_DEVICES",)


def apply(profile: Profile, slots: int | None) -> Profile:
    """The profile with its target resolved: ``--max-running-requests`` at least the target
    and the mamba cache at ``slots`` (None: SGLang's); without a target, as it is."""
    memory = profile.memory
    target = memory.target_running_requests
    if target is None:
        return profile
    resolved = dataclasses.replace(memory, max_mamba_cache_size=slots,
                                   max_running_requests=memory.max_running_requests or target)
    return dataclasses.replace(profile, memory=resolved)


def key(launch: Launch, gpu_memory_mib: int) -> str:
    """What a remembered size depends on (24 hex digits): the release, every flag and variable
    but the size and what differs between instances (port, GPUs), and the GPU memory."""
    words, skip = [], False
    for word in launch.argv[3:]:
        if skip:
            skip = False
        elif word in _PER_INSTANCE_FLAGS:
            skip = True
        else:
            words.append(word)
    env = {k: v for k, v in launch.env.items() if k not in _PER_INSTANCE_ENV}
    text = json.dumps({"release": launch.version, "argv": words, "env": env,
                       "gpu_memory_mib": gpu_memory_mib}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def record_path(digest: str) -> str:
    return f"{paths.SIZING}/{digest}.json"


def record(digest: str, slots: int, target: int) -> str:
    return json.dumps({"key": digest, "max_mamba_cache_size": slots,
                       "target_running_requests": target}, sort_keys=True) + "\n"


def remembered(text: str, digest: str) -> int | None:
    """The size a record holds, if it is one for ``digest`` (anything else is no record)."""
    try:
        saved = json.loads(text)
    except ValueError:
        return None
    if not isinstance(saved, dict) or saved.get("key") != digest:
        return None
    slots = saved.get("max_mamba_cache_size")
    if isinstance(slots, bool) or not isinstance(slots, int) or not 1 <= slots <= 2**31 - 1:
        return None
    return slots


@dataclass(frozen=True)
class Sizing:
    """The target reached, a size that reaches it, or why nothing does."""

    target: int
    running: int | None  # the effective max running requests, from the log
    slots: int | None = None  # the --max-mamba-cache-size that reaches the target
    kv_tokens: int | None = None  # the KV cache tokens expected with those slots
    reason: str | None = None  # why the target cannot be reached

    @property
    def reached(self) -> bool:
        return self.running is not None and self.running >= self.target


def _era(version: str) -> str:
    """How the release takes the mamba pools out of the KV budget (see ``reserved``)."""
    if not at_least(version, "0.5.13"):
        return "up front"
    return "capped" if not at_least(version, "0.5.17") else "padded"


def reserved(era: str, slots: int, requests: int, draft: int, ratio: int) -> int:
    """Slot-sized blocks the release takes from the KV budget for ``slots`` mamba slots: the
    slots (and the pool's padding slot, 0.5.17+), plus with speculative decoding ``draft``
    intermediate states per request: for every requested running request up to 0.5.12
    (mixin.py:83-98), for the requests the slots allow from 0.5.13 (+1 padding from 0.5.17:
    kv_cache_configurator.py:3311-3322).

        reserved("up front", 24, 48, 4, 5), reserved("padded", 240, 48, 4, 5)   # (216, 437)
    """
    pad = 1 if era == "padded" else 0
    if not draft:
        return slots + pad
    allowed = requests if era == "up front" else min(max(1, requests), slots // ratio) + pad
    return slots + pad + allowed * draft


def _whole(value: Any) -> int | None:
    text = str(value)
    return int(text) if text.isdigit() else None


def _arg(cap: capacity.Capacity, launch: Launch, name: str) -> Any:
    """A resolved argument: the log's ``server_args``, else the rendered one."""
    logged = cap.server_args.get(name)
    return logged if logged not in (None, "None") else launch.args.get(name)


def _inputs(cap: capacity.Capacity, launch: Launch) -> tuple[dict[str, Any], str | None]:
    if not (cap.mamba_slots and cap.mamba_gb and cap.kv_tokens and cap.kv_gb):
        return {}, ("the log gives no mamba pool and KV cache sizes to size from (no 'Mamba "
                    "Cache is allocated' and 'KV Cache is allocated' lines)")
    version = launch.version
    ratio = cap.slots_per_request or capacity.slots_per_request(cap.server_args, version)
    if not ratio:
        return {}, ("the log does not say how many mamba slots a request takes (set "
                    "mamba.strategy explicitly, not auto)")
    speculative = _arg(cap, launch, "speculative_algorithm") not in (None, "None")
    draft = _whole(_arg(cap, launch, "speculative_num_draft_tokens")) or 0
    if speculative and not draft:
        return {}, "the log does not give speculative_num_draft_tokens"
    requests = _whole(_arg(cap, launch, "max_running_requests"))
    asked = _whole(launch.args.get("max_running_requests"))
    spec_default = SPEC_DEFAULT_REQUESTS if speculative else 0
    return {"ratio": ratio, "draft": draft if speculative else 0,
            "old_requests": requests or spec_default, "new_requests": asked or spec_default,
            "slot_gb": cap.mamba_gb / (cap.mamba_slots + 1),  # the pool holds a padding slot
            "token_gb": cap.kv_gb / cap.kv_tokens, "era": _era(version),
            "page": _whole(launch.args.get("page_size")) or 1}, None


def _kv_left(cap: capacity.Capacity, f: dict[str, Any], requests: int) -> tuple[int, int]:
    """(slots, KV tokens expected) for ``requests`` running requests' worth of mamba slots."""
    assert cap.mamba_slots and cap.kv_tokens
    slots = requests * f["ratio"]
    more = (reserved(f["era"], slots, f["new_requests"], f["draft"], f["ratio"])
            - reserved(f["era"], cap.mamba_slots, f["old_requests"], f["draft"], f["ratio"]))
    tokens = cap.kv_tokens - math.ceil(more * f["slot_gb"] / f["token_gb"])
    return slots, tokens // f["page"] * f["page"]


def _floor(cap: capacity.Capacity, requests: int) -> int:
    """The KV tokens the cache must keep: one request of the full context, and the two tokens
    per request SGLang's own limit asks (resolve_max_num_reqs: ``token_capacity // 2``)."""
    return max(cap.context_len or 0, 2 * requests)


def size(cap: capacity.Capacity, target: int, launch: Launch,
         gpu_gb: float | None = None) -> Sizing:
    """The mamba cache size that makes the max running requests in ``cap`` (the log of a start
    of ``launch``) reach ``target``; ``gpu_gb`` lets the reason name a mem_fraction_static."""
    running = cap.max_running_requests
    if running is None:
        return Sizing(target, None, reason="the log does not give max_running_requests (the "
                      "scheduler's summary line): cannot tell whether the target is reached")
    if running >= target:
        return Sizing(target, running)
    figures, missing = _inputs(cap, launch)
    if missing:
        return Sizing(target, running, reason=f"max running requests is {running} (from the "
                      f"log), below memory.target_running_requests {target}, and {missing}")
    if cap.mamba_slots and cap.mamba_slots // figures["ratio"] >= target:
        return Sizing(target, running, reason=_kv_capped(cap, target, running))
    slots, tokens = _kv_left(cap, figures, target)
    if tokens >= _floor(cap, target):
        return Sizing(target, running, slots=slots, kv_tokens=tokens)
    return Sizing(target, running, reason=_no_fit(cap, figures, target, tokens, launch, gpu_gb))


def _kv_capped(cap: capacity.Capacity, target: int, running: int) -> str:
    return (f"max running requests is {running} (from the log), below "
            f"memory.target_running_requests {target}, and the KV cache ({cap.kv_tokens} "
            f"tokens) limits it, not the mamba cache ({cap.mamba_slots} slots): raise "
            "memory.mem_fraction_static, or lower memory.target_running_requests")


def _no_fit(cap: capacity.Capacity, f: dict[str, Any], target: int, tokens: int,
            launch: Launch, gpu_gb: float | None) -> str:
    """Why ``target`` cannot fit: the GiB missing, and each lever."""
    floor = _floor(cap, target)
    short_gb = (floor - tokens) * f["token_gb"]
    slots = target * f["ratio"]
    why = ("one request of the full context (context_len)" if floor == cap.context_len
           else "two tokens per running request")
    head = (f"memory.target_running_requests {target} needs {slots} mamba slots "
            f"({f['ratio']} per request, {f['slot_gb'] * slots:.1f} GiB), which would leave "
            f"the KV cache {max(tokens, 0)} tokens, below the {floor} it must hold ({why}): "
            f"{short_gb:.1f} GiB short")
    levers = [_fraction_lever(cap, launch, short_gb, gpu_gb)]
    if tokens >= 2 * target and cap.context_len and tokens < cap.context_len:
        levers.append(f"memory.context_length {tokens // 1024 * 1024} (now "
                      f"{cap.context_len}: the KV cache then holds one request of that length)")
    fewer = _most_that_fit(cap, f, target)
    if fewer:
        levers.append(f"memory.target_running_requests {fewer} (the most that fit now)")
    tp = _whole(launch.args.get("tp_size")) or 1
    levers.append(f"parallel.tp {2 * tp} (each GPU then holds a 1/{2 * tp} share of every "
                  "request's mamba state and KV cache)")
    return f"{head}. Levers: " + "; ".join(levers)


def _fraction_lever(cap: capacity.Capacity, launch: Launch, short_gb: float,
                    gpu_gb: float | None) -> str:
    """The mem_fraction_static that gives the pools the missing GiB, if the GPU has it free."""
    now = _number(cap.server_args.get("mem_fraction_static")) or \
        _number(launch.args.get("mem_fraction_static"))
    free = cap.available_gpu_gb
    if now is None or free is None or not gpu_gb:
        return "memory.mem_fraction_static higher (gives the pools more of the GPU)"
    wanted = math.ceil((now + short_gb / gpu_gb) * 100) / 100
    if wanted >= 1:
        return (f"memory.mem_fraction_static cannot give it: it would have to be {wanted:.2f} "
                f"(now {now:g}), above 1")
    if free - short_gb < FREE_RESERVE_GB:
        return (f"memory.mem_fraction_static cannot give it: {free:.1f} GB is free, "
                f"{short_gb + FREE_RESERVE_GB:.1f} GB would be needed with "
                f"{FREE_RESERVE_GB:.0f} GB left for activations")
    return f"memory.mem_fraction_static {wanted:.2f} (now {now:g}; {free:.1f} GB is free)"


def _number(value: Any) -> float | None:
    text = str(value)
    return float(text) if re.fullmatch(r"\d+(\.\d+)?", text) else None


def _most_that_fit(cap: capacity.Capacity, f: dict[str, Any], target: int) -> int | None:
    """The largest number of running requests below ``target`` whose slots leave the KV cache
    its floor (fewer requests never need more memory)."""
    low, high, best = 1, target - 1, None
    while low <= high:
        middle = (low + high) // 2
        if _kv_left(cap, f, middle)[1] >= _floor(cap, middle):
            best, low = middle, middle + 1
        else:
            high = middle - 1
    return best
