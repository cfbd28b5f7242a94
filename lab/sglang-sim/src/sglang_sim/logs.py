"""SGLang's log format: ``[%(asctime)s] message``; scheduler processes add their ranks.

The ranks (``configure_scheduler_process``, 0.5.12 managers/scheduler.py:3951-3963, 0.5.23
:6278-6290): `` DP{d}`` when the scheduler has a DP rank, then `` TP{t}`` only when tp_size > 1,
so ``--dp-size 8`` alone logs ``[time DP3] ...`` and a server of one GPU logs ``[time] ...``
under the process title ``sglang::scheduler``.
"""

from __future__ import annotations

import logging

DATEFMT = "%Y-%m-%d %H:%M:%S"
SCHEDULER = "sglang.srt.managers.scheduler"


def configure(level: str = "info", prefix: str = "") -> logging.Logger:
    """Configure the root (main process) format; return the scheduler's logger (``prefix``:
    its ranks, as SGLang builds them)."""
    logging.basicConfig(level=getattr(logging, level.upper()), format="[%(asctime)s] %(message)s",
                        datefmt=DATEFMT, force=True)  # stderr, like SGLang
    scheduler = rank_logger(prefix, SCHEDULER)
    for name in ("sglang.srt.model_executor.model_runner",
                 "sglang.srt.mem_cache.kv_cache_configurator",
                 "sglang.srt.mem_cache.memory_pool"):
        logging.getLogger(name).handlers = list(scheduler.handlers)
        logging.getLogger(name).propagate = False
    return scheduler


def rank_logger(prefix: str, name: str | None = None) -> logging.Logger:
    """A logger printing ``[time{prefix}] message``: one DP rank's scheduler (``" DP3"``)."""
    log = logging.getLogger(name or f"{SCHEDULER}.rank{prefix.replace(' ', '_')}")
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter(f"[%(asctime)s{prefix}] %(message)s", DATEFMT))
    log.handlers = [handler]
    log.propagate = False
    return log


def scheduler_prefix(tp_rank: int, tp_size: int, dp_rank: int | None) -> str:
    """The ranks a scheduler logs and names its process by (see above).

        >>> scheduler_prefix(0, 1, 3), scheduler_prefix(1, 2, 3), scheduler_prefix(0, 1, None)
        (' DP3', ' DP3 TP1', '')
    """
    dp = f" DP{dp_rank}" if dp_rank is not None else ""
    return dp + (f" TP{tp_rank}" if tp_size > 1 else "")
