"""Router and teardown configuration from host data, the router's command line, and reading a
server's requests in flight from its metrics."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

import pytest
from pyinfra.api.inventory import Inventory

from sglang_fleet.errors import InputError
from sglang_fleet.fleet import inventory as fleet
from sglang_fleet.fleet import router_api as routerctl
from sglang_fleet.hostconfig import HostConfig
from sglang_fleet.stages.router.deploy import argv, env_text
from sglang_fleet.stages.router.host import start_router
from sglang_fleet.stages.teardown.deploy import Purge

KEYS = {"sglang-api-key": "client-key-0123456789",
        "sglang-router-admin-key": "admin-key-0123456789"}


def routers(**data: Any) -> list[fleet.RouterConfig]:
    data.setdefault("secrets", KEYS)
    inventory = Inventory(([("r1", {"ssh_hostname": "10.0.0.9", **data})], {}),
                          routers=(["r1"], {}))  # type: ignore[no-untyped-call]
    return fleet.routers(inventory)


def test_router_defaults_and_url() -> None:
    [config] = routers()
    assert (config.url, config.port, config.policy, config.api_key, config.admin_key) == \
        ("http://10.0.0.9:30080", 30080, "cache_aware", *KEYS.values())
    [bound] = routers(router_host="10.1.1.1", router_port=31000, secrets={},
                      router_allow_no_key=True)
    assert bound.url == "http://10.1.1.1:31000" and bound.api_key is bound.admin_key is None


@pytest.mark.parametrize(("secrets", "message"), [
    ({}, "secrets.sglang-api-key: the router needs the secret"),
    ({"sglang-api-key": KEYS["sglang-api-key"]},
     "secrets.sglang-router-admin-key: the router needs the secret"),
    ({"sglang-api-key": "k", "sglang-router-admin-key": KEYS["sglang-router-admin-key"]},
     "secrets.sglang-api-key: must be 16 to 512"),
    ({"sglang-api-key": KEYS["sglang-api-key"], "sglang-router-admin-key": KEYS["sglang-api-key"]},
     "router_admin_api_key_secret: the router's admin key is the client key"),
])
def test_router_fails_closed_without_its_keys(secrets: dict[str, str], message: str) -> None:
    with pytest.raises(InputError, match=message):
        routers(secrets=secrets)


def test_router_keys_reach_the_router_in_process_only() -> None:
    environ = {"SGLANG_API_KEY": "c" * 16, "SGLANG_ROUTER_ADMIN_KEY": "a" * 16, "PATH": "/bin"}
    flags = start_router.key_flags(environ)
    assert flags == ["--api-key", "c" * 16,
                     "--control-plane-api-keys", f"sglang-fleet:sglang-fleet:admin:{'a' * 16}"]
    assert environ == {"PATH": "/bin"}
    [config] = routers()
    text = env_text(config)
    assert text == (f"SGLANG_API_KEY='{KEYS['sglang-api-key']}'\n"
                    f"SGLANG_ROUTER_ADMIN_KEY='{KEYS['sglang-router-admin-key']}'\n")


def test_router_command_line_never_holds_the_key() -> None:
    [config] = routers(router_policy="round_robin")
    line = argv(config)
    assert line[5:10] == ["smg.cli", "launch", "--host", "0.0.0.0", "--port"]
    assert line[line.index("--policy") + 1] == "round_robin"
    assert not set(KEYS.values()) & set(line) and "--api-key" not in line


@pytest.mark.parametrize(("data", "message"), [
    ({"router_policy": "fastest"}, "router_policy: unknown policy 'fastest'"),
    ({"router_port": "30080"}, "router_port: must be a positive integer"),
    ({"router_health_check_interval_secs": 0}, "router_health_check_interval_secs: must be"),
])
def test_bad_router_data_is_named(data: dict[str, Any], message: str) -> None:
    with pytest.raises(InputError, match=message) as err:
        routers(**data)
    assert "pyinfra data of r1" in str(err.value) and "fix:" in str(err.value)


def test_no_routers_group_means_no_router() -> None:
    assert fleet.routers(Inventory((["h1"], {}))) == []  # type: ignore[no-untyped-call]


def test_purge_names() -> None:
    def purge(data: dict[str, Any]) -> Purge:
        return Purge.of(HostConfig.from_data(data, "h"))

    assert purge({}) == Purge()
    assert purge({"purge": "engine,weights"}) == Purge(engine=True, weights=True)
    assert purge({"purge": ["engine", "weights", "driver"]}).everything
    with pytest.raises(InputError, match=r"purge: unknown 'models'.*\n.*fix: a comma-separated"):
        purge({"purge": "engine,models"})


METRICS = """# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="m",engine_type="unified",tp_rank="0"} 3.0
sglang:num_queue_reqs{model_name="m",engine_type="unified",tp_rank="0"} 2.0
sglang:num_running_reqs_offline_batch{model_name="m"} 7.0
"""


@pytest.fixture
def metrics_url() -> Iterator[list[str]]:
    """A server answering /metrics with whatever the test puts in the list."""
    body = [METRICS]

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            data = body[0].encode()
            self.send_response(200 if self.path == "/metrics" else 404)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    body.append(f"http://127.0.0.1:{server.server_port}")
    yield body
    server.shutdown()


def test_requests_in_flight_from_metrics(metrics_url: list[str]) -> None:
    url = metrics_url[1]
    assert routerctl.in_flight(url) == 5
    assert routerctl.drained(url, timeout=0.2, poll=0.05) == (False, 5)
    metrics_url[0] = METRICS.replace("3.0", "0.0").replace("2.0", "0.0")
    assert routerctl.drained(url, timeout=0.2) == (True, 0)
    metrics_url[0] = "# no sglang metrics here\n"
    assert routerctl.in_flight(url) is None
    assert routerctl.in_flight("http://127.0.0.1:9") is None


@pytest.mark.parametrize("key", ["router_api_key_secret", "router_admin_api_key_secret"])
def test_a_key_pasted_for_its_secrets_name_is_never_shown(key: str) -> None:
    """The key itself where the NAME of its secret belongs: the error names the setting and
    masks the value, for the admin key as for the client key."""
    pasted = "sk-LIVE-0123456789abcdef"
    with pytest.raises(InputError) as err:
        routers(**{key: pasted})
    message = str(err.value)
    assert f"{key}: the value is not the NAME of a secret" in message and "fix: " in message
    assert pasted not in message
