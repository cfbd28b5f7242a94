"""The real gateways (smg 1.13.0, the default, and sglang-router 0.3.2), started as the router
unit starts them (``router.argv`` through ``stages/router/host/start_router.py``, keys from the
environment), in front of simulators on loopback: what the product relies on, checked on each.

The first run downloads both wheels from PyPI into ``~/.cache/sglang-fleet/gateways``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from sglang_fleet.fleet import inventory as fleet
from sglang_fleet.fleet.router_api import Router
from sglang_fleet.stages.router import deploy as router
from sglang_fleet_generate import capacity
from sglang_fleet_generate.http_pool import Pool
from sglang_fleet_generate.outage import is_trouble
from sglang_fleet_lab import gateways
from tests.conftest import ROOT, Sims

KEY, ADMIN = "client-key-0123456789", "admin-key-0123456789"
CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


class Gateway(gateways.LoopbackRouter):
    def __init__(self, package: str, tmp: Path, workers: list[str]) -> None:
        config = gateways.loopback_config(package, KEY, ADMIN, policy="round_robin")
        super().__init__(config, workers, tmp)

    def chat(self, key: str | None = KEY, **body: object) -> httpx.Response:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return httpx.post(f"{self.config.url}/v1/chat/completions", headers=headers,
                          json={"model": MODEL_NAME, **CHAT, **body}, timeout=30)


MODEL_NAME = str(ROOT / "lab" / "models" / "qwen3.6-27b")  # what the simulator serves as
PACKAGES = list(fleet.ROUTER_PACKAGES)


@pytest.fixture(params=PACKAGES)
def package(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def two(sims: Sims) -> list[str]:
    return [sims.start("--api-key", KEY, "--max-running-requests", "8", decode="200")
            for _ in range(2)]


@pytest.fixture
def gateway(package: str, two: list[str], tmp_path: Path) -> Iterator[Gateway]:
    gw = Gateway(package, tmp_path, two)
    for url in two:
        gw.api.wait_healthy(url, 60)
    yield gw
    if gw.proc.poll() is None:
        gw.proc.kill()  # its SIGTERM (5 s for smg) has a test of its own
        gw.proc.wait()
    log = gw.log.read_text()
    assert KEY not in log and ADMIN not in log, "a key in the router's log"


def test_the_deploys_worker_list_is_what_the_router_routes_to(
        gateway: Gateway, two: list[str]) -> None:
    """The deploy's sync (``router._sync``): smg from the file it watches, sglang-router
    through its API; a worker taken out and put back either way."""
    config, api = gateway.config, gateway.api
    gateway.write(two[1:])
    router._sync(None, None, config, two[1:], file_changed=True)
    assert set(api.workers(routed_only=True)) == {two[1]}
    gateway.write(two)
    router._sync(None, None, config, two, file_changed=True)
    api.wait_healthy(two[0], 60)
    assert set(api.workers(routed_only=True)) == set(two)


def test_only_the_admin_key_opens_the_workers_api(gateway: Gateway) -> None:
    assert Router(gateway.config.url, KEY).http.get("/workers").status_code == 401
    assert Router(gateway.config.url, None).http.get("/workers").status_code == 401
    assert gateway.api.http.get("/workers").status_code == 200
    assert gateway.chat().status_code == 200
    assert gateway.chat(key=None).status_code == 401 and gateway.chat(ADMIN).status_code == 401


def test_a_worker_taken_out_finishes_its_requests_and_comes_back_at_once(
        gateway: Gateway, two: list[str]) -> None:
    """A roll's cutover: out (DELETE; smg lists it draining for 5 s), a stream already on it
    finishes with 200, new requests go to the other, and it is put straight back (smg's 409
    while it drains is waited out)."""
    api, url = gateway.api, two[0]
    with httpx.stream("POST", f"{url}/v1/chat/completions",
                      headers={"Authorization": f"Bearer {KEY}"},
                      json={"model": MODEL_NAME, **CHAT, "max_tokens": 400, "stream": True},
                      timeout=60) as stream:
        assert api.remove(url) is True
        assert url not in api.workers(routed_only=True)
        assert all(gateway.chat().status_code == 200 for _ in range(6))
        assert stream.status_code == 200 and b"[DONE]" in b"".join(stream.iter_bytes())
    assert api.add(url) is True
    api.wait_healthy(url, 60)
    assert api.add(url) is False  # there already: nothing posted


def test_with_no_worker_the_answer_is_the_fleets_trouble_and_health_fails(
        gateway: Gateway, two: list[str]) -> None:
    """What generate's outage breaker reads: every worker out of the router."""
    for url in two:
        gateway.api.remove(url)
    answer = gateway.chat()
    assert is_trouble(answer.status_code, answer.content), (answer.status_code, answer.text)
    health = httpx.get(f"{gateway.config.url}/health_generate", timeout=30)
    ready = httpx.get(f"{gateway.config.url}/readiness", timeout=30)
    assert (health.status_code, ready.status_code) == (503, 503), (health.text, ready.text)


def test_a_killed_worker_costs_no_request_and_its_breaker_opens(
        gateway: Gateway, two: list[str], sims: Sims) -> None:
    """SIGKILL of a worker under requests: the router retries elsewhere (no failed request)
    and the worker's circuit breaker opens after ``router_breaker_failures`` failures."""
    sims.procs[0].kill()
    answers = [gateway.chat().status_code for _ in range(20)]
    assert answers == [200] * 20
    metrics = httpx.get(f"http://127.0.0.1:{gateway.config.metrics_port}/metrics").text
    states = [line for line in metrics.splitlines()
              if line.startswith("smg_worker_cb_state") and two[0] in line]
    assert states and states[0].rsplit(" ", 1)[1] == "1", states  # 1: open
    gateway.api.wait_healthy(two[1], 5)
    deadline = time.monotonic() + 10
    while gateway.api.workers()[two[0]].get("is_healthy"):
        assert time.monotonic() < deadline, "the dead worker is still healthy after 10 s"
        time.sleep(0.2)


def test_metrics_for_the_prometheus_target(gateway: Gateway) -> None:
    """The names the README's router queries use are on the metrics port."""
    gateway.chat()
    text = httpx.get(f"http://127.0.0.1:{gateway.config.metrics_port}/metrics").text
    names = {line.split("{", 1)[0].split(" ", 1)[0] for line in text.splitlines()
             if line and not line.startswith("#")}
    assert {"smg_worker_health", "smg_router_requests_total", "smg_worker_cb_state",
            "smg_http_requests_total"} <= names, sorted(names)


def test_capacity_through_the_router_with_the_client_key(gateway: Gateway) -> None:
    """generate sizes itself through the router with the client key: healthy workers from
    /readiness, one worker's limit from /get_server_info (smg passes it to a worker;
    sglang-router 0.3.2 answers for itself, without a limit)."""
    import asyncio

    async def read() -> tuple[int | None, str]:
        pool = Pool({"Authorization": f"Bearer {KEY}"}, timeout=10, only=gateway.config.url)
        try:
            return await capacity.fleet_capacity(pool, gateway.config.url)
        finally:
            await pool.aclose()

    limit, how = asyncio.run(read())
    if gateway.config.package == "smg":
        assert (limit, how) == (16, "2 healthy workers x 8 (one worker's /get_server_info "
                                    "through the router)")
    else:
        assert limit is None, how


def test_sigterm_stops_it_with_status_0_within_the_grace(gateway: Gateway) -> None:
    tic = time.monotonic()
    assert gateway.stop() == 0
    assert time.monotonic() - tic < router.GRACE


def test_a_restarted_router_starts_with_the_list(package: str, two: list[str],
                                                 tmp_path: Path) -> None:
    """The list a restart starts with: smg's file, sglang-router's --worker-urls."""
    gw = Gateway(package, tmp_path, two)
    try:
        for url in two:
            gw.api.wait_healthy(url, 60)
    finally:
        gw.stop()


def test_smg_takes_a_bad_file_as_no_change(two: list[str], tmp_path: Path) -> None:
    gw = Gateway("smg", tmp_path, two)
    try:
        for url in two:
            gw.api.wait_healthy(url, 60)
        gw.workers_json.write_text("{not json")
        time.sleep(2)
        assert set(gw.api.workers(routed_only=True)) == set(two)
        assert "keeping the last good manifest" in gw.log.read_text()
    finally:
        gw.stop()


def test_the_unit_starts_each_package_with_its_list(package: str) -> None:
    config = _config(package)
    text = router.exec_start(config)
    if package == "smg":
        assert "--discovery-file /etc/sglang-router/workers.json" in text
        assert "$SGLANG_ROUTER_WORKERS" not in text
        assert json.loads(router.workers_text(config, ["http://a:1"])) == {
            "version": 1, "workers": [{"url": "http://a:1"}]}
    else:
        assert text.endswith("--worker-urls $SGLANG_ROUTER_WORKERS")
        assert "discovery" not in text


def _config(package: str) -> fleet.RouterConfig:
    return fleet.RouterConfig(
        package=package, version=fleet.ROUTER_PACKAGES[package], index_url=None,
        find_links=None, bind="0.0.0.0", port=30080, metrics_port=29000,
        url="http://10.0.0.9:30080", policy="cache_aware", health_interval=5,
        health_failures=3, health_successes=2, breaker_failures=3, breaker_timeout=10,
        api_key=KEY, admin_key=ADMIN)
