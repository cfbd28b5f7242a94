"""The capacity report reads the simulator's startup log for each release the way it reads
SGLang's: the simulator's lines follow each release's format strings (lab/sglang-sim/tests), so
the report must find the same figures, the draft worker apart, the cap logged or inferred."""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sglang_sim import args as sim_args
from sglang_sim import launch_server
from sglang_sim.faults import Faults

from sglang_fleet.remote import capacity
from sglang_fleet.stages.gate.host import gate_soak
from tests.conftest import MODEL

MTP = ["--speculative-algorithm", "NEXTN", "--speculative-num-steps", "3",
       "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4"]


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(f"[2026-11-30 06:29:24 TP0] {record.getMessage()}")


def startup_log(release: str, flags: list[str], tmp_path: Path,
                monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The simulator's startup lines for ``release`` on an 8 x B200 host (its nvidia-smi)."""
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\nfor i in 0 1 2 3 4 5 6 7; do echo \"$i, NVIDIA B200, 183359\"; "
                   "done\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    handler = _Lines()
    scheduler = logging.getLogger(f"test.scheduler.{release}")
    scheduler.handlers, scheduler.propagate = [handler], False
    scheduler.setLevel(logging.INFO)
    server = logging.getLogger("sglang.srt.entrypoints.http_server")
    server.addHandler(handler)
    server.setLevel(logging.INFO)
    try:
        args = sim_args.parse(["--model-path", str(MODEL), *flags], release)
        faults = Faults(None, None, None, False, False, False, 0.0)
        quit_handler = signal.getsignal(signal.SIGQUIT)  # load() installs the server's own
        try:
            state = launch_server.load(args, release, faults, scheduler)
            state.children.kill_tree(include_parent=False)
        finally:
            signal.signal(signal.SIGQUIT, quit_handler)
    finally:
        server.removeHandler(handler)
    return handler.lines


@pytest.mark.parametrize(("release", "flag"), [
    ("0.5.10", "--mamba-scheduler-strategy"), ("0.5.12", "--mamba-scheduler-strategy"),
    ("0.5.13", "--mamba-scheduler-strategy"), ("0.5.16", "--mamba-radix-cache-strategy"),
    ("0.5.17", "--mamba-radix-cache-strategy"), ("0.5.23", "--mamba-radix-cache-strategy")])
def test_report_reads_each_releases_startup(release: str, flag: str, tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SGLANG_ENABLE_SPEC_V2", "1")  # 0.5.10: the overlap schedule, as rendered
    lines = startup_log(release, [*MTP, flag, "extra_buffer", "--max-mamba-cache-size", "24"],
                        tmp_path, monkeypatch)
    cap = capacity.parse(lines, release)
    assert cap.missing == [] and cap.kv_gb and cap.kv_tokens
    assert cap.architecture == "Qwen3_5ForConditionalGeneration"
    assert cap.draft is not None and cap.draft.architecture == "Qwen3_5ForCausalLMMTP"
    assert (cap.mamba_slots, cap.max_running_requests) == (24, 4)
    assert cap.capped_by_mamba and cap.slots_per_request == 5
    assert cap.cap_inferred == (release < "0.5.17")
    [line] = capacity.advice(cap)
    assert "--max-mamba-cache-size" in line


def dp_startup_log(release: str, flags: list[str], tmp_path: Path) -> list[str]:
    """The simulator's whole output for a ``--dp-size`` launch, as the journal holds it: the
    DP ranks log from their own schedulers, so it runs as a process, until ready."""
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\nfor i in 0 1 2 3 4 5 6 7; do echo \"$i, NVIDIA B200, 183359\"; "
                   "done\n")
    smi.chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}", "SGLANG_SIM_VERSION": release,
           "SGLANG_SIM_LOAD_SECONDS": "0.1", "SGLANG_SIM_CAPTURE_SECONDS": "0.01",
           "SGLANG_SIM_DRAIN_POLL_SECONDS": "0.1"}
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = tmp_path / "sim.log"
    with log.open("w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "sglang_sim.launch_server", "--model-path",
                                 str(MODEL), "--host", "127.0.0.1", "--port", str(port), *flags],
                                stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + 60
        while "fired up" not in log.read_text() and time.monotonic() < deadline:
            assert proc.poll() is None, log.read_text()[-3000:]
            time.sleep(0.1)
    finally:
        proc.terminate()
        proc.wait(30)
    return log.read_text().splitlines()


@pytest.mark.parametrize("release", ["0.5.12", "0.5.23"])
def test_a_dp_server_reports_each_rank_and_the_servers_total(release: str,
                                                            tmp_path: Path) -> None:
    """--dp-size 8: each DP rank's scheduler logs its own pools and summary (``[time DP3]``);
    the report shows DP0's figures per rank and the server's total, 8 x the per-rank limit,
    which the gate's soak sends twice of."""
    flag = "--mamba-scheduler-strategy" if release < "0.5.14" else "--mamba-radix-cache-strategy"
    lines = dp_startup_log(release, [*MTP, flag, "extra_buffer", "--dp-size", "8",
                                     "--max-mamba-cache-size", "60"], tmp_path)
    assert sum("] max_total_num_tokens=" in line for line in lines) == 8
    cap = capacity.parse(lines, release)
    assert cap.state == capacity.COMPLETE and cap.missing == []
    assert cap.rank == "DP0" and cap.ranks == [f"DP{d}" for d in range(8)]
    assert (cap.max_running_requests, cap.dp_ranks, cap.total_running_requests) == (12, 8, 96)
    assert cap.draft is not None and cap.draft.architecture == "Qwen3_5ForCausalLMMTP"
    assert "max running requests 12 per DP rank, 96 for the server (8 DP ranks)" in \
        capacity.report(cap)[0]
    assert gate_soak.soak_count(None, cap.total_running_requests) == 192


def test_one_dp_rank_that_logs_less_is_counted_as_it_logged() -> None:
    """A replica capped lower than the others (another GPU, another free memory) counts its own
    limit; MOE_DP is not a replica."""
    lines = [f"[2026-12-01 10:00:00 DP{d}] max_total_num_tokens=1000, chunked_prefill_size=8192,"
             f" max_prefill_tokens=16384, max_running_requests={mrr}, context_len=4096, "
             "available_gpu_mem=20.00 GB" for d, mrr in enumerate([48, 48, 30])]
    cap = capacity.parse(lines, "0.5.23")
    assert (cap.max_running_requests, cap.dp_ranks, cap.total_running_requests) == (48, 3, 126)
    moe = capacity.parse([lines[0].replace("DP0", "MOE_DP0 TP0")], "0.5.23")
    assert (moe.dp_ranks, moe.total_running_requests) == (1, 48)
