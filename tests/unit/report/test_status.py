"""``sglang-fleet status`` and the Prometheus targets: metrics read from the SGLang simulator's
real ``/metrics`` (a process on loopback), units parsed from ``systemctl show`` as systemd 252
prints it, and a fleet whose host does not answer SSH and whose router is down."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from sglang_fleet.facts import gpuhealth, systemd
from sglang_fleet.remote import eta
from sglang_fleet.report import status, status_view
from tests.conftest import (
    DATA,
    FIELD_PROFILE,
    ROOT,
    free_port,
    one_gpu_env,
    start_sim,
    wait_for_health,
)

KEY = "status-test-key-0123"



@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The simulator serving the field's profile with metrics, after one generation."""
    tmp = tmp_path_factory.mktemp("status")
    env = one_gpu_env(tmp)
    sim = start_sim(tmp, "--speculative-algorithm", "NEXTN", "--speculative-num-steps", "3",
                    "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4",
                    "--mamba-radix-cache-strategy", "extra_buffer", "--reasoning-parser",
                    "qwen3", "--served-model-name", "qwen3.6-27b", "--enable-metrics",
                    "--api-key", KEY, env=env)
    proc, url = sim.proc, sim.url
    wait_for_health(url)
    answer = httpx.post(f"{url}/v1/chat/completions", timeout=30,
                        headers={"Authorization": f"Bearer {KEY}"},
                        json={"model": "qwen3.6-27b", "max_tokens": 16,
                              "messages": [{"role": "user", "content": "What is 2+3?"}]})
    assert answer.status_code == 200, answer.text
    yield url
    proc.terminate()
    proc.wait(20)


def test_metrics_from_the_simulator(server: str) -> None:
    values = status.parse_metrics(httpx.get(f"{server}/metrics").text)
    assert values["model"] == "qwen3.6-27b"
    assert (values["running"], values["queued"]) == (0, 0)
    assert values["accept_length"] > 1  # NEXTN accepted more than the verified token
    assert "tokens_per_s" in values


def test_parse_metrics_sums_ranks() -> None:
    text = ('# HELP sglang:num_running_reqs x\n'
            'sglang:num_running_reqs{model_name="m",tp_rank="0"} 3.0\n'
            'sglang:num_running_reqs{model_name="m",tp_rank="1"} 2.0\n'
            'sglang:spec_accept_length{model_name="m",tp_rank="0"} 2.75\n'
            'sglang:num_queue_reqs{model_name="m"} NaN-not-a-number\n')
    assert status.parse_metrics(text) == {"running": 5, "accept_length": 2.75, "model": "m"}


# `systemctl show -p ... sglang.service sglang-1.service` (systemd 252)
SHOW = (DATA / "systemctl-show-sglang.txt").read_text()


def test_units_from_systemctl_show() -> None:
    found = systemd.parse_units(SHOW.splitlines())
    unit = found["sglang.service"]
    assert (unit.state, unit.since, unit.pid) == ("active/running",
                                                  "Mon 2026-11-30 23:01:02 UTC", 4121)
    assert unit.release == "sglang-sim-0.5.23-3f2a9c1d"
    assert unit.invocation == "8d3c8d0f4a9e4d6f9b6f0f5f3c2a1b7e"  # what the gate records
    assert unit.flag("--speculative-algorithm") == "NEXTN"
    assert unit.flag("--served-model-name") == "qwen3.6-27b"
    assert found["sglang-1.service"].state == "not installed"
    assert "rm" not in systemd.UnitStates().command(units=["sglang.service", "x; rm -rf /"])


def inventory(tmp_path: Path, port: int, dcgm: bool = False) -> Path:
    """One serving host whose SSH port is closed (its server answers HTTP on ``port``) and a
    router that is down."""
    path = tmp_path / "fleet.py"
    profile = FIELD_PROFILE
    path.write_text(
        f"gpus = [('gpu1', {{'ssh_hostname': '127.0.0.1', 'ssh_port': {free_port()},\n"
        f"    'sglang_profile': {str(profile)!r}, 'sglang.server.host': '127.0.0.1',\n"
        f"    'sglang.server.port': {port}, 'install_dcgm': {dcgm}, 'gpu_count': 1,\n"
        "    'secrets': {'sglang-api-key': 'k' * 20, 'sglang-router-admin-key': 'a' * 20},\n"
        f"    'router_host': '127.0.0.1', 'router_port': {free_port()}}})]\n"
        "routers = ['gpu1']\n")
    return path


def test_a_host_that_does_not_answer_is_a_row_saying_why(server: str, tmp_path: Path) -> None:
    port = int(server.rsplit(":", 1)[1])
    result = subprocess.run([sys.executable, "-m", "sglang_fleet.cli", "status",
                             str(inventory(tmp_path, port)), "--json"],
                            capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert result.returncode == 1, result.stderr  # unhealthy: a host is unreachable
    rows = json.loads(result.stdout)
    [srv] = [r for r in rows if r["kind"] == "server"]
    assert (srv["host"], srv["unit"], srv["state"]) == ("gpu1", "sglang.service", "unreachable")
    assert srv["error"].startswith("unreachable: SSH: ")
    assert (srv["health"], srv["model"], srv["algorithm"]) == ("ok", "qwen3.6-27b", "NEXTN")
    assert srv["running"] == 0 and srv["accept_length"] > 1
    assert srv["router"] == ""  # the router did not answer: nothing known
    [router] = [r for r in rows if r["kind"] == "router"]
    assert router["health"] == "unreachable" and "router" in router["error"]
    [fleet] = [r for r in rows if r["kind"] == "fleet"]  # serving, but its record unread
    assert (fleet["running"], fleet["tokens_per_s"], fleet["seconds"]) == (0, 0.0, None)
    [(left)] = fleet["not_counted"]
    assert left["server"] == "gpu1 sglang.service" and left["why"].startswith(
        "not read (unreachable: SSH: ")
    assert fleet["healthy"] is False
    [(down)] = fleet["unreachable"]
    assert down["host"] == "gpu1" and down["error"] == srv["error"]
    assert fleet["problems"][0] == f"gpu1: {srv['error']}"
    shown = subprocess.run([sys.executable, "-m", "sglang_fleet.cli", "status",
                            str(inventory(tmp_path, port))], capture_output=True, text=True,
                           timeout=120, cwd=ROOT, env={**os.environ, "COLUMNS": "80"})
    assert shown.returncode == 1
    table = shown.stdout
    assert table.splitlines()[0].split()[:4] == ["host", "unit", "state", "health"]
    assert table.splitlines()[1].split()[:4] == ["gpu1", "sglang.service", "unreachable", "ok"]
    assert max(len(line) for line in table.splitlines()) <= 80
    said = " ".join(table.split())  # the lines under the table wrapped at 80 too
    assert "fleet: 0 running requests on 0 of 1 servers" in said
    assert "fleet: not counted: gpu1 sglang.service (not read (unreachable: SSH: " in said
    # another inventory, another closed port: the same error but for its number
    assert f"unhealthy: gpu1: {srv['error'].rsplit(' port ', 1)[0]}" in said


def measured_row(host: str, unit: str, invocation: str, record: dict[str, object] | None,
                 health: str = "ok", state: str = "active/running") -> status.Row:
    """A server row as read_host and _http leave it, its gate record read as status reads it."""
    row = status.Row("server", host, f"http://{host}:30000", unit=unit, state=state,
                     health=health)
    status.fill_measured(row, record, invocation)
    return row


def record(unit: str, invocation: str, version: str, at: str, running: int,
           tps: float) -> dict[str, object]:
    return eta.record(unit, invocation, version, at, running, {"tokens_per_s": tps},
                      {"tokens_per_s": 150.0})


def test_the_fleet_line_sums_what_the_gates_measured_and_names_the_rest() -> None:
    rows = [measured_row("gpu1", "sglang-0.service", "a0",
                         record("sglang-0.service", "a0", "0.5.23", "2026-07-01T10:00:00Z",
                                48, 6000.0)),
            measured_row("gpu1", "sglang-1.service", "a1",
                         record("sglang-1.service", "a1", "0.5.23", "2026-07-01T10:05:00Z",
                                48, 5000.0)),
            measured_row("gpu1", "sglang-2.service", "a2",  # down: never counted
                         record("sglang-2.service", "a2", "0.5.23", "2026-07-01T10:06:00Z",
                                48, 5000.0), health="unreachable (ConnectError)"),
            measured_row("gpu2", "sglang.service", "b9",  # restarted since its gate
                         record("sglang.service", "b1", "0.5.12", "2026-06-30T09:00:00Z", 12,
                                900.0)),
            measured_row("gpu3", "sglang.service", "c1", None),  # never gated by this product
            status.Row("router", "r1", "http://r1:30080", health="ok", router="3/5")]
    fleet = status.Fleet(rows, (900_000, 1000))
    lines = fleet.lines()
    assert lines[0].startswith("fleet: 96 running requests on 2 of 5 servers")
    assert lines[1] == ("fleet: 11,000 output tok/s, the sum of 2 of 5 servers' measured "
                        "throughput (from the gates' soaks at 2026-07-01T10:00:00Z … "
                        "2026-07-01T10:05:00Z)")
    assert lines[2].startswith("fleet: job 900,000 completions x 1,000 tokens: about 22.7 h "
                               "at the measured 11,000 output tok/s; at least 17.4 h")
    assert lines[3] == (
        "fleet: not counted: gpu1 sglang-2.service (down: /health unreachable (ConnectError)); "
        "gpu2 sglang.service (restarted since its gate measured it at 2026-06-30T09:00:00Z: "
        "not measured since); gpu3 sglang.service (no gate record (deploys/sglang.py writes it "
        "when the gate passes))")
    table = status_view.table(rows, width=200)
    head = table.splitlines()[0]
    assert "cap" in head.split() and "gate tok/s" in head
    cells = dict(zip(status_view.COLUMNS, status_view.cells(rows[0]), strict=True))
    assert (cells["cap"], cells["gate tok/s"]) == ("48", "6000")
    assert "not measured: restarted since its gate" in " ".join(table.split())
    as_json = fleet.as_json()
    assert [r["kind"] for r in as_json][-2:] == ["router", "fleet"]
    assert as_json[-1]["running"] == 96 and as_json[-1]["seconds"] == pytest.approx(
        900_000 * 1000 / 11_000)
    assert as_json[-1]["capacity_servers"] == ["gpu1 sglang-0.service", "gpu1 sglang-1.service"]


def test_one_job_for_the_fleet_or_a_note_why_not() -> None:
    def hosts(*jobs: object) -> list[Any]:
        return [SimpleNamespace(name=f"gpu{i}", data={"job_estimate": j} if j else {})
                for i, j in enumerate(jobs)]

    assert status.fleet_job(hosts("900000,1000", None, "900000,1000")) == ((900_000, 1000), "")
    assert status.fleet_job(hosts(None)) == (None, "")
    job, note = status.fleet_job(hosts("900000,1000", "10,5"))
    assert job is None and note == ("no job time: job_estimate differs between hosts (gpu0: "
                                    "900000,1000; gpu1: 10,5)")
    fleet = status.Fleet([measured_row("gpu0", "sglang.service", "a", record(
        "sglang.service", "a", "0.5.23", "2026-07-01T10:00:00Z", 48, 6000.0))], job, note)
    assert fleet.lines()[-1] == f"fleet: {note}" and not any("fleet: job" in line
                                                             for line in fleet.lines())


def test_prometheus_targets(tmp_path: Path) -> None:
    from sglang_fleet.fleet.inventory import load
    from sglang_fleet.report import metrics_targets

    loaded = load(str(inventory(tmp_path, 30000, dcgm=True)), {})
    out = tmp_path / "sd" / "fleet.json"
    assert metrics_targets.write_targets(loaded, str(out))
    groups = json.loads(out.read_text())
    jobs = {g["labels"]["job"]: g["targets"] for g in groups}
    assert jobs == {"sglang": ["127.0.0.1:30000"], "sglang-router": ["127.0.0.1:29000"],
                    "dcgm": ["127.0.0.1:9400"]}
    assert not metrics_targets.write_targets(loaded, str(out))  # unchanged: not rewritten


def test_gpu_columns_per_instance() -> None:
    from tests.unit.facts.test_gpuhealth import b200, edit, fact_output, hgx

    buses = [f"00000000:{0x18 + i * 0x10:02X}:00.0" for i in range(4)]
    gpus = [b200(bus=bus) for bus in buses]
    gpus[1] = edit(edit(gpus[1], "Remapped Rows", "Pending", "Yes"),
                   "FB Memory Usage", "Used", "150000 MiB")
    kernel = "[ 9.1] NVRM: Xid (PCI:0000:48:00): 79, pid=1, GPU has fallen off the bus."
    health = gpuhealth.parse(fact_output(hgx(*gpus), kernel=kernel))
    rows = [status.Row("server", "gpu1", "u0", gpus="0-1"),
            status.Row("server", "gpu1", "u1", gpus="2")]
    status._fill_gpus(rows, health, ignore=["xid-79"])
    assert (rows[0].gpu_used_mib, rows[0].gpu_free_mib) == (150000, 2 * 182743)
    # GPU 3 serves no instance: its finding is on the host's first row; xid-79 is ignored
    assert rows[0].gpu_health == ["FATAL remap-pending (GPU 1)", "xid-79 (GPU 3)"]
    assert rows[1].gpu_health == [] and rows[1].gpu_free_mib == 182743


def test_a_dp_server_is_one_row_on_all_its_gpus(tmp_path: Path) -> None:
    """``parallel.dp: 8`` (instances: auto: one server on 8 GPUs): one unit, GPUs 0-7; its
    /metrics has a series per DP rank (label dp_rank), which the row sums: 8 ranks each running
    one request are 8 running."""
    from sglang_fleet.config import profile
    from sglang_fleet.config.render import render_all

    p = profile.load(FIELD_PROFILE, overrides={"parallel.dp": 8}).for_gpus(8, "gpu1")
    [launch] = render_all(p)
    assert launch.unit == "sglang.service" and "--dp-size" in launch.argv
    assert status._span(status._gpus(p, launch)) == "0-7"
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\nfor i in 0 1 2 3 4 5 6 7; do echo \"$i, NVIDIA B200, 183359\"; "
                   "done\n")
    smi.chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}",
           "SGLANG_SIM_LOAD_SECONDS": "0", "SGLANG_SIM_DECODE_STEPS_PER_SECOND": "4"}
    sim = start_sim(tmp_path, "--dp-size", "8", "--max-running-requests", "1",
                    "--enable-metrics", env=env)
    proc, url = sim.proc, sim.url
    try:
        wait_for_health(url)
        body = {"max_tokens": 12, "messages": [{"role": "user", "content": "hi"}]}
        with ThreadPoolExecutor(10) as pool:
            asks = [pool.submit(httpx.post, f"{url}/v1/chat/completions", json=body, timeout=30)
                    for _ in range(10)]
            time.sleep(1)
            values = status.parse_metrics(httpx.get(f"{url}/metrics").text)
            assert all(a.result().status_code == 200 for a in asks)
    finally:
        proc.terminate()
        proc.wait(20)
    assert (values["running"], values["queued"]) == (8, 2), values


def test_a_host_without_any_gate_record_reads_as_none_measured() -> None:
    """A host never deployed (no record, so no output): pyinfra gives the fact its default,
    which must be an empty mapping, not None (status read it as one and crashed)."""
    from sglang_fleet.facts.systemd import GateRecords

    assert GateRecords.default() == {} and GateRecords().process([]) == {}


def serving_row(host: str, unit: str = "sglang.service", **more: Any) -> status.Row:
    """A server row as status reads a healthy one."""
    row = status.Row("server", host, f"http://{host}:30000", unit=unit,
                     state="active/running", health="ok", model="qwen3.6-27b",
                     release="sglang-0.5.23-3f2a9c1d", algorithm="NEXTN")
    for key, value in more.items():
        setattr(row, key, value)
    return row


def test_a_healthy_fleet_says_what_was_checked() -> None:
    rows = [serving_row("gpu1"), serving_row("gpu2"),
            status.Row("router", "r1", "http://r1:30080", health="ok", router="2/2")]
    assert status.problems(rows) == [] and status.Fleet(rows).as_json()[-1]["healthy"]
    assert status_view.verdict(rows) == [
        "healthy: 2 hosts answered over SSH; 2 servers active/running, /health 200, no fatal "
        "GPU finding; 1 routers answered"]


def test_each_unhealthy_server_and_unreachable_host_is_named_once() -> None:
    error = "unreachable: SSH: Could not connect (Connection refused)"
    rows = [serving_row("gpu1"),
            serving_row("gpu2", state="unreachable", error=error, health="unreachable"
                        " (ConnectError)"),
            serving_row("gpu2", "sglang-1.service", state="unreachable", error=error),
            serving_row("gpu3", state="failed (start-limit-hit)", health="HTTP 503"),
            serving_row("gpu4", gpu_health=["FATAL xid-79 (GPU 0)", "nvlink-errors (GPU 1)"]),
            status.Row("router", "r1", "http://r1:30080", health="unreachable",
                       error="router http://r1:30080: ConnectError")]
    assert status.problems(rows) == [
        f"gpu2: {error}",
        "gpu2 sglang.service: /health unreachable (ConnectError)",
        "gpu3 sglang.service: failed (start-limit-hit)",
        "gpu3 sglang.service: /health HTTP 503",
        "gpu4 sglang.service: GPU FATAL xid-79 (GPU 0)",
        "router r1 (http://r1:30080): unreachable: router http://r1:30080: ConnectError"]
    fleet = status.Fleet(rows).as_json()[-1]
    assert fleet["healthy"] is False and fleet["unreachable"] == [{"host": "gpu2",
                                                                   "error": error}]
    assert status_view.verdict(rows)[0] == f"unhealthy: gpu2: {error}"


def test_what_hosts_said_is_shown_with_its_escapes() -> None:
    """A crash cause a server forged (its escapes would rewrite the table's lines), a health
    answer and a host's error with control characters: shown as codes, in the table, the
    verdict and the fleet's lines."""
    forged = "\x1b[2K\rScheduler hit an exception: RuntimeError: forged\x9b1A\x07"
    rows = [serving_row("gpu1", last_crash=forged, health="HTTP 503 \x1b]0;owned\x07"),
            serving_row("gpu2", state="unreachable", error="SSH: \x1b[31mrefused\r")]
    printed = "\n".join([status_view.table(rows, width=400), *status_view.verdict(rows),
                         *status.Fleet(rows).lines()])
    assert [c for c in printed if (ord(c) < 0x20 and c != "\n") or 0x7F <= ord(c) < 0xA0] == []
    assert "last crash: \\x1b[2K\\x0dScheduler hit an exception: RuntimeError: forged" \
           "\\x9b1A\\x07" in printed
    assert "unhealthy: gpu1 sglang.service: /health HTTP 503 \\x1b]0;owned\\x07" in printed
    assert "gpu2 sglang.service (not read (SSH: \\x1b[31mrefused\\x0d))" in printed
