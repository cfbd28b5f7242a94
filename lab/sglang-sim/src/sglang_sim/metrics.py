"""/metrics in Prometheus text format with SGLang's metric names and labels."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from sglang_sim.engine import Engine, Histogram
from sglang_sim.memory import MemoryPlan

if TYPE_CHECKING:
    from sglang_sim.state import State


def _labels(state: State, **extra: str) -> str:
    labels = {"model_name": state.served_model_name, "engine_type": "unified", **extra}
    return "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}"


def _histogram(out: list[str], name: str, doc: str, state: State,
               series: dict[bool, Histogram]) -> None:
    out += [f"# HELP {name} {doc}", f"# TYPE {name} histogram"]
    for streaming, hist in series.items():
        flag = str(streaming).lower()
        counts = hist.counts or [0] * len(hist.buckets)
        for bound, count in zip(hist.buckets, counts, strict=True):
            out.append(f"{name}_bucket{_labels(state, is_streaming=flag, le=str(bound))} {count}")
        out.append(f"{name}_bucket{_labels(state, is_streaming=flag, le='+Inf')} {hist.n}")
        out.append(f"{name}_sum{_labels(state, is_streaming=flag)} {hist.total}")
        out.append(f"{name}_count{_labels(state, is_streaming=flag)} {hist.n}")


def _accept_rate(engine: Engine) -> float:
    accept = engine.stats.avg_accept_length
    return round((accept - 1) / max(engine.draft_tokens - 1, 1) if accept else 0.0, 4)


# Each scheduler's gauges: name, help, value from (its engine, its memory plan).
SCHEDULER_GAUGES: list[tuple[str, str, Callable[[Engine, MemoryPlan], float], bool]] = [
    ("sglang:num_running_reqs", "The number of running requests.",
     lambda e, m: e.running, False),
    ("sglang:num_queue_reqs", "The number of requests in the waiting queue.",
     lambda e, m: e.queued, False),
    ("sglang:gen_throughput", "The generation throughput (token/s).",
     lambda e, m: e.stats.throughput(), False),
    ("sglang:token_usage", "The token usage.",
     lambda e, m: round(e.running * 512 / max(m.kv_tokens, 1), 4), False),
    ("sglang:mamba_usage", "The token usage for Mamba layers.",
     lambda e, m: round(e.running * m.slots_per_request / max(m.mamba_slots, 1), 4)
     if m.mamba_slots else 0.0, False),
    ("sglang:spec_accept_length", "The average acceptance length of speculative decoding.",
     lambda e, m: round(e.stats.avg_accept_length, 4), True),
    ("sglang:spec_accept_rate", "The average acceptance rate of speculative decoding "
     "(`accepted tokens / total draft tokens` in batch).", lambda e, m: _accept_rate(e), True),
]


def render(state: State, tokenizer: bool = True) -> str:
    """Each scheduler's gauges, one series per scheduler labelled with its ranks (``dp_rank``
    only with a DP rank: 0.5.12 observability/scheduler_metrics_mixin.py:136-146, 0.5.23
    observability/metrics_collector.py:1382-1392), then the tokenizer's counters and
    histograms, one series for the server (``tokenizer``: there is a TokenizerManager; the
    gRPC mode has none)."""
    out: list[str] = []
    engines = state.dispatch.engines
    ranks = [_labels(state, tp_rank="0", pp_rank="0", moe_ep_rank="0",
                     **({"dp_rank": str(d)} if len(engines) > 1 else {}))
             for d in range(len(engines))]
    for name, doc, value, speculative in SCHEDULER_GAUGES:
        if speculative and not state.engine.speculative:
            continue
        out += [f"# HELP {name} {doc}", f"# TYPE {name} gauge"]
        out += [f"{name}{labels} {value(engine, mem)}"
                for labels, engine, mem in zip(ranks, engines, state.memories, strict=True)]
    if not tokenizer:
        return "\n".join(out) + "\n"
    stats = state.dispatch.stats()  # the tokenizer's: every rank's requests
    tok = _labels(state)
    out += ["# HELP sglang:prompt_tokens_total Number of prefill tokens processed.",
            "# TYPE sglang:prompt_tokens_total counter",
            f"sglang:prompt_tokens_total{tok} {float(stats.prompt_tokens)}",
            "# HELP sglang:generation_tokens_total Number of generation tokens processed.",
            "# TYPE sglang:generation_tokens_total counter",
            f"sglang:generation_tokens_total{tok} {float(stats.generation_tokens)}",
            "# HELP sglang:num_requests_total The number of processed requests.",
            "# TYPE sglang:num_requests_total counter",
            f"sglang:num_requests_total{tok} {float(stats.requests)}"]
    _histogram(out, "sglang:time_to_first_token_seconds",
               "Histogram of time to first token in seconds.", state, stats.ttft)
    _histogram(out, "sglang:e2e_request_latency_seconds",
               "Histogram of End-to-end request latency in seconds", state, stats.e2e)
    return "\n".join(out) + "\n"
