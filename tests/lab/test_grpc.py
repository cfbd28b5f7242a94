"""Two 1-GPU lab hosts serving in gRPC mode (``server.router_connection: grpc``,
inventories/lab_grpc.py) behind the real smg: the gate asks each server over gRPC, smg fetches
the tokenizer from the servers and parses the answers with the profile's parsers under its own
names, status asks each server's HealthCheck, and a roll under load through smg fails no
request."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.lab.conftest import (
    ADMIN_KEY_FILE,
    KEY_FILE,
    ROUTER,
    address,
    booted_lab,
    connects,
    run,
    ssh,
)
from tests.lab.load import Load

pytestmark = pytest.mark.lab
HOSTS = ("lab1", "lab2")
INSTANCES = 1  # the shipped profile's instances: auto on 1 GPU (one unit: sglang.service)
INVENTORY = "inventories/lab_grpc.py"
WORKERS = {f"grpc://{address(h)}:{30000 + k}": True for h in HOSTS for k in range(INSTANCES)}
UNIT = r"(?:sglang\.service: )?"  # a host's only server: its gate's lines carry no unit


@pytest.fixture(scope="module")
def deployed() -> Iterator[str]:
    """The deploys' output, both run once."""
    for _ in booted_lab("--hosts", "2", "--gpus", str(INSTANCES)):
        out = ""
        for deploy in ("deploys/sglang.py", "deploys/router.py"):
            result = run("pyinfra", "-y", INVENTORY, deploy, timeout=900)
            out += result.stdout + result.stderr
            assert result.returncode == 0, out[-5000:]
        yield out


def workers() -> list[dict[str, Any]]:
    listed = run("curl", "-s", "-H", f"Authorization: Bearer {ADMIN_KEY_FILE.read_text().strip()}",
                 f"{ROUTER}/workers").stdout
    return [w for w in json.loads(listed)["workers"] if w.get("status") != "draining"]


def test_the_gate_asks_each_server_over_grpc(deployed: str) -> None:
    for host in HOSTS:
        for k in range(INSTANCES):
            target = f"{address(host)}:{30000 + k}"
            assert f"health: {target} readiness (grpc.health.v1) and HealthCheck: healthy" \
                in deployed, deployed[-3000:]
        assert re.search(rf"\[{host}\] {UNIT}arguments: SGLang 0\.5\.23, NEXTN, "
                         r"model \S+: as rendered", deployed), deployed[-3000:]
        assert re.search(rf"\[{host}\] {UNIT}smoke: '4", deployed), deployed[-3000:]
        # readiness waited for the servicer's planned warm-up: its ready line is in the journal
        assert re.search(rf"\[{host}\] {UNIT}ready in [\d.]+ s", deployed)
    # The port answers gRPC only; metrics come from the side port (port + 100).
    assert ssh("lab1", f"curl -s -o /dev/null -w '%{{http_code}}' --max-time 3 "
                       f"http://{address('lab1')}:30000/health").stdout != "200"
    assert "sglang:num_running_reqs" in ssh(
        "lab1", f"curl -s http://{address('lab1')}:30100/metrics").stdout


def test_smg_tokenizes_and_parses_at_the_gateway(deployed: str) -> None:
    listed = workers()
    assert {w["url"]: w["is_healthy"] for w in listed} == WORKERS
    assert {w["connection_mode"] for w in listed} == {"grpc"}
    unit = ssh("lab1", "systemctl show -p ExecStart --value sglang-router.service").stdout
    assert "--reasoning-parser qwen3 --tool-call-parser qwen_coder" in unit, unit
    smoke = run("sglang-fleet", "smoke", ROUTER, "--api-key-file", str(KEY_FILE))
    assert smoke.returncode == 0 and "smoke: '4." in smoke.stdout, smoke.stdout + smoke.stderr
    answer = json.loads(run(
        "curl", "-s", "-H", f"Authorization: Bearer {KEY_FILE.read_text().strip()}",
        "-H", "Content-Type: application/json", "-d", json.dumps(
            {"model": "qwen3.6-27b", "max_tokens": 64,
             "messages": [{"role": "user", "content": "What is 2+2?"}]}),
        f"{ROUTER}/v1/chat/completions").stdout)
    message = answer["choices"][0]["message"]
    assert message["reasoning_content"] and "<think>" not in (message["content"] or ""), answer


def test_the_grpc_port_answers_the_router_alone(deployed: str) -> None:
    """The servicer checks no key: its port let every allowed network in (the unit's
    allow-list is unit-wide; issue 44). Now a server answers the router's host (lab1) and its
    own host (the gate and status ask from there), and no other host."""
    assert connects("lab1", address("lab2"), 30000, source=address("lab1")) == "open"
    assert connects("lab2", address("lab2"), 30000, source=address("lab2")) == "open"
    assert connects("lab2", address("lab2"), 30000) == "open"  # from loopback
    assert connects("lab1", address("lab1"), 30000, source=address("lab2")) == "dropped"


def test_status_asks_each_servers_health_check(deployed: str) -> None:
    result = run("sglang-fleet", "status", INVENTORY, "--json")
    rows = json.loads(result.stdout)
    servers = [r for r in rows if r.get("kind") == "server"]
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert {r["url"]: r["health"] for r in servers} == {u: "ok" for u in WORKERS}
    assert all(r["running"] is not None for r in servers)  # from the side port's /metrics


def test_a_roll_through_smg_over_grpc_fails_no_request(deployed: str) -> None:
    with Load(ROUTER, KEY_FILE.read_text().strip(), "qwen3.6-27b", rate=25) as load:
        time.sleep(2)
        result = run("sglang-fleet", "roll", INVENTORY, "--data",
                     "sglang.memory.max_running_requests=40", timeout=900)
        time.sleep(2)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-5000:]
    for host in HOSTS:
        assert re.search(rf"{host}: out of the router for [\d.]+ s", out), out[-3000:]
    assert load.sent / load.seconds >= 20
    assert load.failed == 0, load.errors[:5]
    assert {w["url"]: w["is_healthy"] for w in workers()} == WORKERS
