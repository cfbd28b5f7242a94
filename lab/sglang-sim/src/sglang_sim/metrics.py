"""/metrics in Prometheus text format with SGLang's metric names and labels."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sglang_sim.engine import Histogram

if TYPE_CHECKING:
    from sglang_sim.state import State


def _labels(state: State, **extra: str) -> str:
    labels = {"model_name": state.served_model_name, "engine_type": "unified", **extra}
    return "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}"


def _gauge(out: list[str], name: str, doc: str, labels: str, value: float) -> None:
    out += [f"# HELP {name} {doc}", f"# TYPE {name} gauge", f"{name}{labels} {value}"]


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


def render(state: State) -> str:
    engine, stats, mem = state.engine, state.engine.stats, state.memory
    sched = _labels(state, tp_rank="0", pp_rank="0", moe_ep_rank="0")
    out: list[str] = []
    _gauge(out, "sglang:num_running_reqs", "The number of running requests.", sched,
           engine.running)
    _gauge(out, "sglang:num_queue_reqs", "The number of requests in the waiting queue.", sched,
           engine.queued)
    _gauge(out, "sglang:gen_throughput", "The generation throughput (token/s).", sched,
           stats.throughput())
    _gauge(out, "sglang:token_usage", "The token usage.", sched,
           round(engine.running * 512 / max(mem.kv_tokens, 1), 4))
    _gauge(out, "sglang:mamba_usage", "The token usage for Mamba layers.", sched,
           round(engine.running * mem.slots_per_request / max(mem.mamba_slots, 1), 4)
           if mem.mamba_slots else 0.0)
    if engine.speculative:
        accept = stats.avg_accept_length
        _gauge(out, "sglang:spec_accept_length", "The average acceptance length of speculative "
               "decoding.", sched, round(accept, 4))
        rate = (accept - 1) / max(engine.draft_tokens - 1, 1) if accept else 0.0
        _gauge(out, "sglang:spec_accept_rate", "The average acceptance rate of speculative "
               "decoding (`accepted tokens / total draft tokens` in batch).", sched, round(rate, 4))
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
