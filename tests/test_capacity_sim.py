"""The capacity report reads the simulator's startup log for each release the way it reads
SGLang's: the simulator's lines follow each release's format strings (lab/sglang-sim/tests), so
the report must find the same figures, the draft worker apart, the cap logged or inferred."""

from __future__ import annotations

import logging
import signal
from pathlib import Path

import pytest
from sglang_sim import args as sim_args
from sglang_sim import launch_server
from sglang_sim.faults import Faults

from sglang_fleet.remote import capacity
from tests.conftest import ROOT

MODEL = ROOT / "lab" / "models" / "qwen3.6-27b"
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
