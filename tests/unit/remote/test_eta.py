"""A fleet's capacity and job time (``remote/eta.py``): sums over the servers that were measured,
the job at the measured throughput and at the concurrency bound, every server left out named;
the gate's soak measuring output tok/s on the SGLang simulator, and its record on disk read back
as ``status`` reads it."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from sglang_fleet import paths
from sglang_fleet.facts.systemd import GateRecords
from sglang_fleet.remote import eta
from sglang_fleet.stages.gate.host import check_server, gate_soak
from tests.unit.report.test_status import KEY, server  # noqa: F401  (the simulator, as status reads it)

JOB = (900_000, 1000)


def eight(tokens_per_s: float = 6000.0, running: int = 48) -> list[eta.Server]:
    return [eta.Server(f"gpu1 sglang-{i}.service", running=running, tokens_per_s=tokens_per_s,
                       per_request_tps=150.0, release="0.5.23",
                       measured_at=f"2026-07-01T10:0{i}:00Z") for i in range(8)]


def test_the_fleet_sums_its_servers_and_the_job_divides_by_the_sum() -> None:
    est = eta.estimate(eight(), JOB)
    assert (est.running, est.tokens_per_s) == (8 * 48, 48_000.0)
    assert est.seconds == pytest.approx(900_000 * 1000 / 48_000)  # 5.2 h
    assert est.bound_tokens_per_s == 8 * 48 * 150.0
    assert est.bound_seconds == pytest.approx(900_000 * 1000 / 57_600)
    assert est.not_counted == ()
    lines = eta.lines(est, "fleet")
    assert lines[0] == ("fleet: 384 running requests on 8 of 8 servers (each server's "
                        "effective max running requests, from its startup log)")
    assert lines[1] == ("fleet: 48,000 output tok/s, the sum of 8 of 8 servers' measured "
                        "throughput (from the gates' soaks at 2026-07-01T10:00:00Z … "
                        "2026-07-01T10:07:00Z)")
    assert lines[2] == ("fleet: job 900,000 completions x 1,000 tokens: about 5.2 h at the "
                        "measured 48,000 output tok/s; at least 4.3 h (all 384 running "
                        "requests at one request's speed: 57,600 tok/s)")
    assert len(lines) == 3  # nothing left out, one release


def test_a_down_server_is_named_and_not_counted() -> None:
    servers = eight()
    servers[3] = eta.Server("gpu1 sglang-3.service", running=48, tokens_per_s=6000.0,
                            per_request_tps=150.0, left_out="down: /health HTTP 503")
    est = eta.estimate(servers, JOB)
    assert (est.running, est.tokens_per_s) == (7 * 48, 42_000.0)
    assert est.seconds == pytest.approx(900_000 * 1000 / 42_000)
    assert est.not_counted == (("gpu1 sglang-3.service", "down: /health HTTP 503"),)
    lines = eta.lines(est, "host", "this run's gate soaks")
    assert lines[0].startswith("host: 336 running requests on 7 of 8 servers")
    assert "the sum of 7 of 8 servers' measured throughput (from this run's gate soaks" \
        in lines[1]
    assert lines[-1] == "host: not counted: gpu1 sglang-3.service (down: /health HTTP 503)"


def test_without_a_job_there_is_no_job_line() -> None:
    est = eta.estimate(eight(), None)
    assert est.seconds is None and est.bound_seconds is None
    lines = eta.lines(est, "fleet")
    assert len(lines) == 2 and not any("job" in line for line in lines)
    assert eta.job_line(est) is None


def test_mixed_releases_are_said_and_each_counts_its_own_figures() -> None:
    servers = eight()[:5] + [eta.Server(f"gpu2 sglang-{i}.service", running=12,
                                        tokens_per_s=1500.0, per_request_tps=90.0,
                                        release="0.5.12") for i in range(3)]
    est = eta.estimate(servers, JOB)
    assert (est.running, est.tokens_per_s) == (5 * 48 + 3 * 12, 5 * 6000.0 + 3 * 1500.0)
    assert est.bound_tokens_per_s == 5 * 48 * 150.0 + 3 * 12 * 90.0
    assert eta.lines(est, "fleet")[-1] == (
        "fleet: releases differ: 0.5.12 (3 servers), 0.5.23 (5 servers); each server's "
        "figures are its own release's")


def test_a_server_without_a_soak_counts_in_the_capacity_only() -> None:
    servers = [*eight()[:1], eta.Server("gpu1 sglang-1.service", running=48,
                                        per_request_tps=150.0)]
    est = eta.estimate(servers, JOB)
    assert (est.running, est.tokens_per_s) == (96, 6000.0)
    assert [s.name for s in est.throughput] == ["gpu1 sglang-0.service"]
    [(name, why)] = est.not_counted
    assert name == "gpu1 sglang-1.service" and why.startswith("in the capacity, not the "
                                                              "throughput: no soak measured")


def test_nothing_measured_gives_no_time_and_says_so() -> None:
    est = eta.estimate([eta.Server("gpu1 sglang.service", left_out="no gate record")], JOB)
    assert (est.running, est.tokens_per_s, est.seconds) == (0, 0.0, None)
    lines = eta.lines(est, "fleet")
    assert lines[1] == "fleet: no throughput measured (no server's gate soak counts)"
    assert lines[2].endswith("no time: no server's throughput was measured")
    assert lines[3] == "fleet: not counted: gpu1 sglang.service (no gate record)"


def test_job_and_duration_forms() -> None:
    assert eta.parse_job("900000,1000") == JOB and eta.parse_job(None) is None
    assert eta.job_seconds(JOB, 0.0) is None and eta.job_seconds(None, 10.0) is None
    assert eta.duration(18000.0) == "5.0 h"
    assert eta.duration(2520.0) == "42 min"
    assert eta.duration(3 * 86400.0) == "72.0 h (3.0 days)"


def test_a_record_counts_only_for_the_start_it_measured() -> None:
    record = eta.record("sglang-2.service", "abc123", "0.5.23", "2026-07-01T10:00:00Z", 48,
                        {"requests": 96, "output_tokens": 1536, "seconds": 0.5,
                         "tokens_per_s": 3072.0}, {"tokens_per_s": 150.0})
    measured = eta.from_record("sglang-2.service", record, "abc123")
    assert (measured.running, measured.tokens_per_s, measured.per_request_tps,
            measured.release) == (48, 3072.0, 150.0, "0.5.23")
    assert measured.left_out is None
    later = eta.from_record("sglang-2.service", record, "def456")
    assert later.left_out == ("restarted since its gate measured it at 2026-07-01T10:00:00Z: "
                              "not measured since") and later.running is None
    assert eta.from_record("u", None).left_out.startswith("no gate record")  # type: ignore[union-attr]
    wrong = eta.from_record("u", {**record, "running": True, "tokens_per_s": "fast",
                                  "per_request_tps": float("nan"), "version": "0.5.23; rm"})
    assert (wrong.running, wrong.tokens_per_s, wrong.per_request_tps, wrong.release) == \
        (None, None, None, None)


def test_the_soak_measures_output_tokens_per_second(server: str) -> None:  # noqa: F811
    s = gate_soak.soak(server, KEY, "qwen3.6-27b", 8)
    assert s["failed"] == 0 and s["output_tokens"] > 0
    assert s["tokens_per_s"] == pytest.approx(s["output_tokens"] / s["seconds"], rel=0.05)
    refused = gate_soak.soak(server, "wrong-key-0123456789", "qwen3.6-27b", 2)
    assert refused["failed"] == 2 and refused["output_tokens"] == 0
    assert refused["tokens_per_s"] is None  # nothing answered: nothing measured


def test_the_kept_record_is_read_back_as_status_reads_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(paths, "GATE_RECORDS", str(tmp_path / "gate"))
    record = eta.record("sglang-1.service", "abc123", "0.5.23", "2026-07-01T10:00:00Z", 48,
                        {"tokens_per_s": 3072.0}, {"tokens_per_s": 150.0})
    check_server.keep(paths.gate_record("sglang-1.service"), record)
    kept = Path(paths.gate_record("sglang-1.service"))
    assert kept.stat().st_mode & 0o777 == 0o644 and not list(kept.parent.glob(".*"))
    (tmp_path / "gate" / "sglang-2.json").write_text("{not json\n")
    fact = GateRecords()
    command = fact.command(units=["sglang-1.service", "sglang-2.service", "sglang-3.service",
                                  "x; rm -rf /"])
    assert "rm -rf" not in command
    out = subprocess.run(["sh", "-c", command], capture_output=True, text=True).stdout
    found = fact.process(out.splitlines())
    assert found == {"sglang-1.service": json.loads(kept.read_text()),
                     "sglang-2.service": None}  # no record for sglang-3: absent
