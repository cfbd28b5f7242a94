"""A deployed lab host (reached as a sudo user) seen by ``sglang-fleet status``, then a GPU
that logged a fatal Xid: the deploy refuses the host before any change, and
``gpu_health_ignore`` lets it through; then DCGM and its Prometheus exporter."""

from __future__ import annotations

import json
import shlex
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.lab.conftest import address, booted_lab, pyinfra, run, ssh, url

pytestmark = pytest.mark.lab
# GPU 0 of a lab host is on bus 0x18, as nvidia-smi -q shows it; the line as the kernel logs it.
XID_79 = ("[ 1812.331204] NVRM: Xid (PCI:0000:18:00): 79, pid='<unknown>', name=<unknown>, "
          "GPU has fallen off the bus.")


@pytest.fixture(scope="module")
def deployed() -> Iterator[None]:
    for _ in booted_lab("--hosts", "1", "--sudo-user", "deployer"):
        for deploy in ("deploys/sglang.py", "deploys/router.py"):
            result = pyinfra(deploy)
            assert result.returncode == 0, (result.stdout + result.stderr)[-5000:]
        yield


def rows(healthy: bool = True) -> list[dict[str, Any]]:
    """``status --json``'s rows; it exits 0 for a healthy fleet, 1 for an unhealthy one."""
    result = run("sglang-fleet", "status", "inventories/lab.py", "--json", timeout=120)
    assert result.returncode == (0 if healthy else 1), (result.stdout + result.stderr)[-3000:]
    return list(json.loads(result.stdout))


def main_pid() -> str:
    return ssh("lab1", "systemctl show -p MainPID --value sglang-0.service").stdout.strip()


def file_sd_jobs(path: Path) -> dict[str, list[str]]:
    """Every target of a file_sd list, by job (a group per server, router or exporter)."""
    jobs: dict[str, list[str]] = {}
    for group in json.loads(path.read_text()):
        jobs.setdefault(group["labels"]["job"], []).extend(group["targets"])
    return jobs


def test_status_of_a_deployed_host(deployed: None) -> None:
    found = rows()
    deadline = time.monotonic() + 60  # the deploy's last soak may still be finishing
    while any(r["kind"] == "server" and r["running"] for r in found) and \
            time.monotonic() < deadline:
        time.sleep(5)
        found = rows()
    servers = [r for r in found if r["kind"] == "server"]
    [router] = [r for r in found if r["kind"] == "router"]
    [fleet] = [r for r in found if r["kind"] == "fleet"]
    # instances: auto: a server per GPU of the host, every one listed
    assert [(s["host"], s["unit"], s["gpus"]) for s in servers] == \
        [("lab1", f"sglang-{i}.service", str(i)) for i in range(8)]
    server = servers[0]
    assert server["state"] == "active/running" and server["since"]
    assert server["release"].startswith("sglang-sim-0.5.23-")
    assert (server["model"], server["algorithm"], server["health"]) == \
        ("qwen3.6-27b", "NEXTN", "ok")
    assert (server["running"], server["queued"]) == (0, 0)
    assert server["gpu_free_mib"] > 180_000
    assert server["gpu_health"] == [] and server["error"] == ""
    assert all(s["router"] == "healthy" for s in servers)
    assert (router["kind"], router["health"], router["router"]) == ("router", "ok", "8/8")
    # what the deploy's gate measured, kept on the host, read back for this start of the unit
    assert server["not_measured"] == "" and server["capacity"] > 0 and server["measured_at"]
    assert server["measured_tokens_per_s"] > 0 and server["measured_release"] == "0.5.23"
    assert fleet["capacity_servers"] == [f"lab1 sglang-{i}.service" for i in range(8)]
    assert fleet["running"] == sum(s["capacity"] for s in servers)
    assert fleet["tokens_per_s"] == pytest.approx(sum(s["measured_tokens_per_s"]
                                                      for s in servers))
    assert fleet["not_counted"] == [] and fleet["job"] is None  # the lab sets no job_estimate
    # the router's Prometheus target (metrics_targets.ROUTER_METRICS_PORT) is real
    metrics = httpx.get(f"{url('lab1', 29000)}/metrics", timeout=10)
    assert metrics.status_code == 200 and "# TYPE" in metrics.text
    started = time.monotonic()
    table = run("sglang-fleet", "status", "inventories/lab.py", timeout=120).stdout
    print(f"{table}\n(status took {time.monotonic() - started:.1f} s)")
    assert table.splitlines()[1].split()[:3] == ["lab1", "sglang-0.service", "active/running"]
    words = " ".join(table.split())  # the lines below the table wrap to the terminal's width
    assert f"fleet: {fleet['running']} running requests on 8 of 8 servers" in words
    assert "servers' measured throughput (from the gates' soaks at " in words


def test_a_fatal_xid_refuses_the_host_until_ignored(deployed: None, tmp_path: Path) -> None:
    pid = main_pid()
    ssh("lab1", f"echo {shlex.quote(XID_79)} >> /run/lab-nvidia/kmsg")
    refused = pyinfra("deploys/sglang.py")
    out = refused.stdout + refused.stderr
    assert refused.returncode != 0
    assert "host lab1: GPU 0: xid-79: GPU has fallen off the bus" in out
    assert "fix: reboot the host" in out and "gpu_health_ignore = ['xid-79']" in out
    assert "Beginning operation run" not in out  # refused while preparing: nothing ran
    assert main_pid() == pid
    found = rows(healthy=False)  # a fatal GPU finding: status exits 1 and says why
    assert found[-1]["problems"] == ["lab1 sglang-0.service: GPU FATAL xid-79 (GPU 0)"]
    servers = {r["unit"]: r for r in found if r["kind"] == "server"}
    assert servers["sglang-0.service"]["gpu_health"] == ["FATAL xid-79 (GPU 0)"]
    assert servers["sglang-1.service"]["gpu_health"] == []  # GPU 1's server: not that GPU

    targets = tmp_path / "sd" / "fleet.json"
    let_through = pyinfra("deploys/sglang.py", "--data", 'gpu_health_ignore=["xid-79"]',
                          "--data", f"prometheus_file_sd={targets}")
    out = let_through.stdout + let_through.stderr
    assert let_through.returncode == 0, out[-5000:]
    assert "Beginning operation run" in out
    assert "xid-79" in out and "ignored by gpu_health_ignore" in out
    assert main_pid() == pid  # nothing changed, nothing restarted
    jobs = file_sd_jobs(targets)
    assert jobs == {"sglang": [f"{address('lab1')}:{30000 + i}" for i in range(8)],
                    "sglang-router": [f"{address('lab1')}:29000"]}


def test_dcgm_and_its_exporter_serve_every_gpu(deployed: None, tmp_path: Path) -> None:
    pid = main_pid()
    targets = tmp_path / "fleet.json"
    result = pyinfra("deploys/sglang.py", "--data", "install_dcgm=true", "--data",
                     'gpu_health_ignore=["xid-79"]', "--data", f"prometheus_file_sd={targets}")
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-5000:]
    assert main_pid() == pid  # the driver stage's DCGM: the server is untouched
    for unit in ("nvidia-dcgm", "nvidia-dcgm-exporter"):
        assert ssh("lab1", f"systemctl is-active {unit}").stdout.strip() == "active"
    # the host engine on loopback (the lab's says where it would listen), reached from the
    # host only; the exporter, without sglang_allowed_clients, unfiltered
    assert ssh("lab1", "cat /run/lab-nvidia/nv-hostengine.listen").stdout == "127.0.0.1:5555\n"
    shown = ssh("lab1", "systemctl show -p IPAddressAllow -p IPAddressDeny nvidia-dcgm "
                "nvidia-dcgm-exporter").stdout.split("\n\n")
    assert "127.0.0.0/8" in shown[0] and "0.0.0.0/0" in shown[0], shown
    assert "0.0.0.0/0" not in shown[1], shown
    jobs = file_sd_jobs(targets)
    assert jobs["dcgm"] == [f"{address('lab1')}:9400"]
    metrics = httpx.get(f"{url('lab1', 9400)}/metrics", timeout=10).text
    temps = [line for line in metrics.splitlines() if line.startswith("DCGM_FI_DEV_GPU_TEMP{")]
    gpus = int(ssh("lab1", "nvidia-smi -L | wc -l").stdout)
    assert len(temps) == gpus and 'Hostname="lab1"' in temps[0] and 'gpu="0"' in temps[0]
    again = pyinfra("deploys/sglang.py", "--data", "install_dcgm=true", "--data",
                    'gpu_health_ignore=["xid-79"]')
    out = again.stdout + again.stderr
    assert again.returncode == 0, out[-3000:]
    total = next(line for line in out.splitlines() if "Grand total" in line).split()
    assert total[3] == "-", out[-3000:]  # nothing changed
