"""Faults on demand, for testing what operates the server (environment variables):

  SGLANG_SIM_FAIL_STARTUP="message"   raise RuntimeError(message) while loading weights
  SGLANG_SIM_CRASH_AFTER=N            the scheduler hits an exception after N requests (SIGQUIT,
                                      the tree SIGKILLed, as SGLang dies: see processes.py)
  SGLANG_SIM_HANG_AFTER=N             the scheduler's batch hangs after N requests, until its
                                      watchdog (--watchdog-timeout) ends the server the same way
  SGLANG_SIM_HANG_LOADING=1           never finish loading weights
  SGLANG_SIM_HEALTH_TIMEOUT=1         health checks hang SGLANG_HEALTH_CHECK_TIMEOUT (20), then 503
  SGLANG_SIM_STATE_CACHE_TOO_SMALL=1  fail at mamba cache allocation like an undersized state cache
  SGLANG_SIM_LOAD_SECONDS=S           how long loading weights takes (default 2)
"""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Faults:
    fail_startup: str | None
    crash_after: int | None
    hang_after: int | None
    hang_loading: bool
    health_timeout: bool
    state_cache_too_small: bool
    load_seconds: float

    @classmethod
    def from_env(cls) -> Faults:
        env = os.environ
        crash = env.get("SGLANG_SIM_CRASH_AFTER")
        hang = env.get("SGLANG_SIM_HANG_AFTER")
        return cls(
            fail_startup=env.get("SGLANG_SIM_FAIL_STARTUP") or None,
            crash_after=int(crash) if crash else None,
            hang_after=int(hang) if hang else None,
            hang_loading=env.get("SGLANG_SIM_HANG_LOADING") == "1",
            health_timeout=env.get("SGLANG_SIM_HEALTH_TIMEOUT") == "1",
            state_cache_too_small=env.get("SGLANG_SIM_STATE_CACHE_TOO_SMALL") == "1",
            load_seconds=float(env.get("SGLANG_SIM_LOAD_SECONDS", "2")),
        )
