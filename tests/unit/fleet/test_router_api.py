"""Workers added through the router's API carry the worker's API key (sglang-router 0.3.2 does not
pass its own --api-key on to workers added at runtime)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any, ClassVar

import pytest

from sglang_fleet.fleet import router_api as routerctl


class _Router(BaseHTTPRequestHandler):
    """The two calls Router.add makes: GET /workers, POST /workers (202)."""

    posted: ClassVar[list[tuple[dict[str, Any], str | None]]] = []

    def do_GET(self) -> None:
        self._answer(200, {"workers": []})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.posted.append((body, self.headers.get("Authorization")))
        self._answer(202, {"status": "accepted"})

    def _answer(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *_: Any) -> None:
        pass


@pytest.fixture
def router_url() -> Iterator[str]:
    _Router.posted.clear()
    server = HTTPServer(("127.0.0.1", 0), _Router)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()


def test_added_worker_carries_the_key(router_url: str) -> None:
    assert routerctl.Router(router_url, "router-key").add("http://10.0.0.11:30000")
    [(body, auth)] = _Router.posted
    assert body == {"url": "http://10.0.0.11:30000", "api_key": "router-key"}
    assert auth == "Bearer router-key"


def test_a_separate_worker_key(router_url: str) -> None:
    router = routerctl.Router(router_url, "router-key", worker_api_key="worker-key")
    router.add("http://10.0.0.12:30000")
    assert _Router.posted[0][0]["api_key"] == "worker-key"


def test_no_key_no_key_field(router_url: str) -> None:
    routerctl.Router(router_url, None).add("http://10.0.0.13:30000")
    assert _Router.posted[0] == ({"url": "http://10.0.0.13:30000"}, None)
