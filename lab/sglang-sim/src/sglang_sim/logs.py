"""SGLang's log format: ``[%(asctime)s] message``; scheduler processes add `` TP<rank>``."""

from __future__ import annotations

import logging

DATEFMT = "%Y-%m-%d %H:%M:%S"
SCHEDULER = "sglang.srt.managers.scheduler"


def configure(level: str = "info", tp_rank: int = 0) -> logging.Logger:
    """Configure the root (main process) format; return the TP0 scheduler's logger."""
    logging.basicConfig(level=getattr(logging, level.upper()), format="[%(asctime)s] %(message)s",
                        datefmt=DATEFMT, force=True)  # stderr, like SGLang
    scheduler = logging.getLogger(SCHEDULER)
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter(f"[%(asctime)s TP{tp_rank}] %(message)s", DATEFMT))
    scheduler.handlers = [handler]
    scheduler.propagate = False
    for name in ("sglang.srt.model_executor.model_runner",
                 "sglang.srt.mem_cache.kv_cache_configurator",
                 "sglang.srt.mem_cache.memory_pool"):
        logging.getLogger(name).handlers = [handler]
        logging.getLogger(name).propagate = False
    return scheduler

