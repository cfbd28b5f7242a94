"""CUDA graph capture at startup, as SGLang logs it, and the scheduler's "Prefill batch" line.

Capture takes ``SGLANG_SIM_CAPTURE_SECONDS`` (default 0.5) for each graph SGLang captures: the
target's decode (verify, with speculative decoding) graph, then the draft worker's decode and
draft-extend graphs. ``--disable-cuda-graph`` (releases that have it) captures nothing.

The log formats changed three times (quoted from each release's source):

- 0.5.10 - 0.5.13: model_executor/model_runner.py init_device_graphs (0.5.10: lines 2446/2460)
  "Capture cuda graph begin. This can take up to several minutes. avail mem=..."
  "Capture cuda graph end. Time elapsed: ... s. mem usage=... GB. avail mem=... GB."
  and speculative/eagle_worker.py init_cuda_graphs (0.5.10: lines 250/257, 265/272)
  "Capture draft cuda graph begin. ..." / "Capture draft extend cuda graph begin. ...".
- 0.5.14 - 0.5.21: "Capture target verify CUDA graph begin. backend=full, num_tokens_per_bs=4,
  bs=[...], avail mem=..." / "... end. elapsed=... s, mem usage=... GB, avail mem=... GB."
  (0.5.14: model_runner.py:2563/2588; 0.5.19: model_runner_components/cuda_graph_setup.py:551/
  574), and eagle_worker_v2.py "Capture draft decode CUDA graph begin. ..." (0.5.19: 379, 482);
  ``num_tokens_per_bs`` became ``num_tokens_per_req`` in 0.5.16.
- 0.5.22 -: the target's begin line drops ``bs=``, its end line gains it
  (0.5.23: cuda_graph_setup.py:759/788); the draft's lines stay (eagle_worker_v2.py:515/533,
  634/654).

    capture_target(scheduler, args, plan, (0, 5, 23, 0))   # sleeps, logs begin and end
"""

from __future__ import annotations

import logging
import os
import time
from argparse import Namespace

from sglang_sim.memory import MemoryPlan

GRAPH_MEM_GB = 0.35  # what a capture takes from free memory (B200, a 27B model: ~0.3-0.5 GB)


def capture_seconds() -> float:
    return float(os.environ.get("SGLANG_SIM_CAPTURE_SECONDS", "0.5"))


def captures(args: Namespace) -> bool:
    return not getattr(args, "disable_cuda_graph", False)


def capture_bs(max_bs: int, speculative: bool) -> list[int]:
    """server_args.py _generate_cuda_graph_batch_sizes (0.5.10: 1344), up to ``max_bs``.

        >>> capture_bs(12, True)
        [1, 2, 3, 4, 5, 6, 7, 8, 10, 12]
    """
    if speculative:
        sizes = [*range(1, 9), *range(10, 33, 2), *range(40, 65, 4), *range(72, 257, 8),
                 *range(272, max_bs + 1, 16)]
    else:
        sizes = [1, 2, 4, 8, 12, *range(16, 257, 8), *range(272, 512, 16),
                 *range(512, max_bs + 1, 32)]
    sizes = [bs for bs in sizes if bs <= max_bs]
    return sizes if max_bs in sizes else [*sizes, max_bs]


def _capture(scheduler: logging.Logger, begin: str, end: str, avail: float) -> float:
    """Log ``begin``, take the capture time, log ``end``; returns the memory left."""
    scheduler.info(begin.format(avail=avail))
    tic = time.perf_counter()
    time.sleep(capture_seconds())
    after = avail - GRAPH_MEM_GB
    scheduler.info(end.format(elapsed=time.perf_counter() - tic, usage=GRAPH_MEM_GB,
                              after=after))
    return after


def capture_target(scheduler: logging.Logger, args: Namespace, plan: MemoryPlan,
                   rel: tuple[int, ...]) -> None:
    """The target model runner's decode (or verify) graph, after its memory pool."""
    if not captures(args):
        return
    spec = args.speculative_algorithm is not None
    avail = plan.pool_end_avail_gb
    if rel < (0, 5, 14, 0):
        _capture(scheduler, "Capture cuda graph begin. This can take up to several minutes. "
                 "avail mem={avail:.2f} GB", "Capture cuda graph end. Time elapsed: "
                 "{elapsed:.2f} s. mem usage={usage:.2f} GB. avail mem={after:.2f} GB.", avail)
        return
    name = "target verify" if spec else "target decode"
    per = "num_tokens_per_bs" if rel < (0, 5, 16, 0) else "num_tokens_per_req"
    tokens = (args.speculative_num_draft_tokens or 1) if spec else 1
    bs = capture_bs(plan.max_running_requests, spec)
    if rel < (0, 5, 22, 0):
        begin = f"backend=full, {per}={tokens}, bs={bs}, avail mem={{avail:.2f}} GB"
        end = "elapsed={elapsed:.2f} s, "
    else:
        begin = f"backend=full, {per}={tokens}, avail mem={{avail:.2f}} GB"
        end = f"bs={bs}, elapsed={{elapsed:.2f}} s, "
    _capture(scheduler, f"Capture {name} CUDA graph begin. {begin}",
             f"Capture {name} CUDA graph end. {end}"
             "mem usage={usage:.2f} GB, avail mem={after:.2f} GB.", avail)


def capture_draft(scheduler: logging.Logger, args: Namespace, plan: MemoryPlan,
                  rel: tuple[int, ...], avail: float) -> None:
    """The draft worker's decode graph (more than one step) and its draft-extend graph."""
    if not captures(args):
        return
    steps = args.speculative_num_steps or 1
    if rel < (0, 5, 14, 0):
        for name in ("draft", "draft extend")[0 if steps > 1 else 1:]:
            avail = _capture(
                scheduler, f"Capture {name} cuda graph begin. This can take up to several "
                "minutes. avail mem={avail:.2f} GB", f"Capture {name} cuda graph end. Time "
                "elapsed: {elapsed:.2f} s. mem usage={usage:.2f} GB. avail mem={after:.2f} GB.",
                avail)
        return
    per = "num_tokens_per_bs" if rel < (0, 5, 16, 0) else "num_tokens_per_req"
    bs = capture_bs(plan.max_running_requests, True)
    graphs = [("draft decode", args.speculative_eagle_topk or 1),
              ("draft extend", args.speculative_num_draft_tokens or 1)]
    for name, tokens in graphs[0 if steps > 1 else 1:]:
        avail = _capture(
            scheduler, f"Capture {name} CUDA graph begin. backend=full, {per}={tokens}, "
            f"bs={bs}, avail mem={{avail:.2f}} GB", f"Capture {name} CUDA graph end. "
            "elapsed={elapsed:.2f} s, mem usage={usage:.2f} GB, avail mem={after:.2f} GB.",
            avail)


def prefill_line(rel: tuple[int, ...], hybrid: bool, new_tokens: int, running: int,
                 queued: int) -> str:
    """The scheduler's line for each prefill batch (one new request here):
    observability/scheduler_metrics_mixin.py:389 (0.5.10; ``#pending-token`` from 0.5.11),
    managers/scheduler_components/metrics_reporter.py:754 (0.5.23).

        >>> prefill_line((0, 5, 10, 0), False, 12, 1, 0)[:40]
        'Prefill batch, #new-seq: 1, #new-token: '
    """
    usage = "full token usage: 0.00, mamba usage: 0.00, " if hybrid else "token usage: 0.00, "
    pending = "#pending-token: 0, " if rel >= (0, 5, 11, 0) else ""
    return (f"Prefill batch, #new-seq: 1, #new-token: {new_tokens}, #cached-token: 0, {usage}"
            f"#running-req: {running}, #queue-req: {queued}, {pending}cuda graph: False, "
            f"input throughput (token/s): 0.00")
