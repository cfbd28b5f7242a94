"""Capacity and job time of one server, a host or the fleet, from what each server's gate
measured (standard library only: the gate runs it on the host).

    servers = [Server("gpu1 sglang-0.service", running=48, tokens_per_s=5200.0,
                      per_request_tps=150.0, measured_at="2026-07-01T10:02:11Z")]
    lines(estimate(servers, (900_000, 1000)), "fleet")
    # ['fleet: 48 running requests on 1 of 1 servers (...)', 'fleet: 5,200 output tok/s ...',
    #  'fleet: job 900,000 completions x 1,000 tokens: about 48.1 h at the measured ...']

The maths: the fleet's output tok/s is the sum of its servers' (each measured under its gate's
soak, a full batch and a queue); the job takes completions x tokens / that. The concurrency
bound is every running request of every server decoding at the speed of one request alone (the
smoke's): per-request speed drops as batches grow, so it is the least the job can take.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

RECORD_TEXT = re.compile(r"[A-Za-z0-9._:+-]{1,64}")  # a version, a time, an invocation id


@dataclass(frozen=True)
class Server:
    """What one server's gate measured: ``running`` from its own startup log (never
    /server_info's echo of the command line); ``per_request_tps``: the smoke's; ``left_out``:
    why it is not counted at all, None when it is."""

    name: str
    running: int | None = None
    tokens_per_s: float | None = None
    per_request_tps: float | None = None
    release: str | None = None
    measured_at: str | None = None
    left_out: str | None = None


@dataclass(frozen=True)
class Estimate:
    servers: tuple[Server, ...]
    job: tuple[int, int] | None
    running: int = 0  # the sum over ``capacity``
    tokens_per_s: float = 0.0  # the sum over ``throughput``
    bound_tokens_per_s: float | None = None  # sum of running x per-request tok/s
    capacity: tuple[Server, ...] = ()  # the servers whose running requests are counted
    throughput: tuple[Server, ...] = ()  # the servers whose tok/s are counted
    not_counted: tuple[tuple[str, str], ...] = field(default=())  # (server, why)

    @property
    def seconds(self) -> float | None:
        """The job at the measured throughput."""
        return job_seconds(self.job, self.tokens_per_s)

    @property
    def bound_seconds(self) -> float | None:
        """The job at the concurrency bound (the least it can take)."""
        return job_seconds(self.job, self.bound_tokens_per_s)


def job_seconds(job: tuple[int, int] | None, tokens_per_s: float | None) -> float | None:
    """Seconds for ``job`` (completions, output tokens each) at ``tokens_per_s``; None when
    there is no job or no speed.

    >>> job_seconds((900_000, 1000), 50_000.0)
    18000.0
    """
    if job is None or not tokens_per_s or tokens_per_s <= 0:
        return None
    return job[0] * job[1] / tokens_per_s


def parse_job(text: str | int | None) -> tuple[int, int] | None:
    """Host data ``job_estimate`` ("COMPLETIONS,TOKENS") as numbers; None when not given.

    >>> parse_job("900000,1000"), parse_job("")
    ((900000, 1000), None)
    """
    if text is None or str(text) == "":
        return None
    completions, _, tokens = str(text).partition(",")
    return int(completions), int(tokens)


def _positive(value: Any) -> bool:
    return (isinstance(value, int | float) and not isinstance(value, bool)
            and math.isfinite(value) and value > 0)


def estimate(servers: list[Server], job: tuple[int, int] | None) -> Estimate:
    """Sum what was measured: each server up with a logged running-request limit in the capacity,
    with a soak in the throughput; the others named with why (never counted as zero)."""
    capacity, throughput, not_counted = [], [], []
    for s in servers:
        if s.left_out:
            not_counted.append((s.name, s.left_out))
            continue
        if _positive(s.running):
            capacity.append(s)
        else:
            not_counted.append((s.name, "max running requests not in its startup log"))
        if _positive(s.tokens_per_s):
            throughput.append(s)
        elif _positive(s.running):
            not_counted.append((s.name, "in the capacity, not the throughput: no soak "
                                "measured (gate_soak_requests = 0?)"))
    bound = (sum((s.running or 0) * (s.per_request_tps or 0.0) for s in capacity)
             if capacity and all(_positive(s.per_request_tps) for s in capacity) else None)
    return Estimate(tuple(servers), job, running=sum(s.running or 0 for s in capacity),
                    tokens_per_s=sum(s.tokens_per_s or 0.0 for s in throughput),
                    bound_tokens_per_s=bound, capacity=tuple(capacity),
                    throughput=tuple(throughput), not_counted=tuple(not_counted))


def duration(seconds: float) -> str:
    """>>> duration(18000.0), duration(2520.0), duration(3 * 86400.0)
    ('5.0 h', '42 min', '72.0 h (3.0 days)')
    """
    if seconds < 3600:
        return f"{seconds / 60:.0f} min"
    hours = f"{seconds / 3600:.1f} h"
    return hours + (f" ({seconds / 86400:.1f} days)" if seconds >= 2 * 86400 else "")


def _when(servers: tuple[Server, ...]) -> str:
    times = sorted(s.measured_at for s in servers if s.measured_at)
    if not times:
        return ""
    return f" at {times[0]}" if times[0] == times[-1] else f" at {times[0]} … {times[-1]}"


def job_line(est: Estimate) -> str | None:
    """The job's time at the measured throughput and at the concurrency bound (None: no job)."""
    if est.job is None:
        return None
    head = f"job {est.job[0]:,} completions x {est.job[1]:,} tokens: "
    if est.seconds is None:
        return head + "no time: no server's throughput was measured"
    line = (head + f"about {duration(est.seconds)} at the measured {est.tokens_per_s:,.0f} "
            "output tok/s")
    if est.bound_seconds is not None:
        line += (f"; at least {duration(est.bound_seconds)} (all {est.running} running "
                 f"requests at one request's speed: {est.bound_tokens_per_s:,.0f} tok/s)")
    return line


def lines(est: Estimate, scope: str, source: str = "the gates' soaks") -> list[str]:
    """What ``scope`` ("host", "fleet") can run and how long the job takes, from what ``source``
    measured, with every server that is not counted named."""
    total = len(est.servers)
    out = [f"{scope}: {est.running} running requests on {len(est.capacity)} of {total} "
           "servers (each server's effective max running requests, from its startup log)"]
    if est.throughput:
        out.append(f"{scope}: {est.tokens_per_s:,.0f} output tok/s, the sum of "
                   f"{len(est.throughput)} of {total} servers' measured throughput "
                   f"(from {source}{_when(est.throughput)})")
    else:
        out.append(f"{scope}: no throughput measured (no server's gate soak counts)")
    if (job := job_line(est)) is not None:
        out.append(f"{scope}: {job}")
    if est.not_counted:
        out.append(f"{scope}: not counted: " + "; ".join(f"{name} ({why})"
                                                         for name, why in est.not_counted))
    releases = Counter(s.release for s in est.capacity if s.release)
    if len(releases) > 1:
        out.append(f"{scope}: releases differ: " + ", ".join(
            f"{r} ({n} server{'s' if n > 1 else ''})" for r, n in sorted(releases.items()))
            + "; each server's figures are its own release's")
    return out


def record(unit: str, invocation: str, version: str | None, measured_at: str,
           running: int | None, soak: dict[str, Any] | None,
           smoke: dict[str, Any]) -> dict[str, Any]:
    """What a passed gate measured of one server, as the gate keeps it on the host (one small
    JSON file per unit) and reports it in its ``GATE`` line."""
    return {"unit": unit, "invocation": invocation, "version": version,
            "measured_at": measured_at, "running": running,
            "tokens_per_s": (soak or {}).get("tokens_per_s"),
            "per_request_tps": smoke.get("tokens_per_s"),
            "soak": {k: (soak or {}).get(k) for k in ("requests", "output_tokens", "seconds")}}


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and RECORD_TEXT.fullmatch(value) else None


def from_record(name: str, data: Any, invocation: str | None = None) -> Server:
    """A server from its gate's record, checked field by field; with ``invocation`` (the unit's
    InvocationID now), a record of another start of the unit is not counted."""
    if not isinstance(data, dict):
        return Server(name, left_out="no gate record (deploys/sglang.py writes it when the "
                      "gate passes)")
    measured_at = _text(data.get("measured_at"))
    if invocation is not None and data.get("invocation") != invocation:
        return Server(name, left_out=f"restarted since its gate measured it at "
                      f"{measured_at or 'an unknown time'}: not measured since")
    running = data.get("running")
    return Server(name, running=running if _positive(running) and isinstance(running, int)
                  else None, tokens_per_s=_rate(data.get("tokens_per_s")),
                  per_request_tps=_rate(data.get("per_request_tps")),
                  release=_text(data.get("version")), measured_at=measured_at)


def _rate(value: Any) -> float | None:
    return float(value) if _positive(value) else None
