from __future__ import annotations

import socket
import time
from pathlib import Path
from typing import Any

import gevent.monkey  # type: ignore[import-untyped]
import httpx
import pytest

from sglang_fleet.config.profile import Profile, load
from tests import noconnect

# No test reaches the example inventory's hosts (inventories/b200.py): refused in this process,
# and processes tests start with it use noconnect.env() (tests/examples/test_examples.py checks).
noconnect.refuse_example_hosts()

# pyinfra_cli patches the whole process with gevent when it is imported (planning.load imports
# it to read an inventory, in some tests in-process): the test workers' own threads (pytest-xdist's
# execnet channel) cannot run patched, and reading an inventory needs no patching.
gevent.monkey.patch_all = lambda *args, **kwargs: True

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"
PROFILES = sorted((ROOT / "src" / "sglang_fleet" / "profiles").glob("*.yaml"))
FIELD_PROFILE = ROOT / "src" / "sglang_fleet" / "profiles" / "qwen3.6-27b-mtp.yaml"


def field_profile(overrides: dict[str, Any] | None = None, gpus: int = 8) -> Profile:
    """The shipped profile for a host of ``gpus`` GPUs (its ``instances: auto`` resolved)."""
    return load(FIELD_PROFILE, overrides).for_gpus(gpus, "a test host")


@pytest.fixture
def write_profile(tmp_path: Path):  # type: ignore[no-untyped-def]
    """Write a profile YAML (text) to a temporary file and return its path."""

    def write(text: str, name: str = "p.yaml") -> Path:
        path = tmp_path / name
        path.write_text(text)
        return path

    return write


MINIMAL = """
model:
  source: hf://Qwen/Qwen3.6-27B@0123abc
  served_name: qwen3.6-27b
"""


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Two workers: every test under tests/lab/ on one, in order (they share the machine's one
    lab), everything else one by one on either. (xdist's own ``xdist_group`` marks do not
    reach its scheduler under pytest 9: the node id suffix it relies on is not kept.)"""
    from xdist.scheduler import LoadScopeScheduling  # type: ignore[import-untyped]

    class LabTogether(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return "lab" if nodeid.startswith("tests/lab/") else nodeid

    return LabTogether(config, log)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """A skipped test is a failed test here: what cannot run must say why and fail."""
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    stats = reporter.stats if reporter else {}
    skipped = len(stats.get("skipped", [])) + len(stats.get("xfailed", []))
    if skipped and exitstatus == 0:
        if reporter:
            reporter.write_line(f"FAILED: {skipped} test(s) skipped; every test must run", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def wait_for_health(url: str, seconds: float = 30) -> None:
    """Until a server started by a test answers ``/health`` with 200 (or ``seconds`` pass)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            time.sleep(0.1)


def free_port() -> int:
    """A TCP port nothing listens on now, on the loopback."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Origin:
    """An HTTP server on the loopback, in a thread: it records each request's path and
    Authorization header and answers ``routes`` (path -> (status, headers, body)), else 404.

        elsewhere = Origin({})                    # where a redirect leads
        first = Origin({"/v1/models": (302, {"Location": elsewhere.url + "/v1/models"}, b"")})
    """

    def __init__(self, routes: dict[str, tuple[int, dict[str, str], bytes]],
                 tls: tuple[Path, Path] | None = None) -> None:
        """``tls``: (certificate, key) files: it answers https with them."""
        import http.server
        import ssl
        import threading

        self.routes = routes
        self.seen: list[tuple[str, str | None]] = []
        origin = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(length)
                origin.seen.append((self.path, self.headers.get("Authorization")))
                status, headers, body = origin.routes.get(self.path, (404, {}, b"not found"))
                self.send_response(status)
                for name, value in {**headers, "Content-Length": str(len(body))}.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = _answer

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        if tls:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(*tls)
            self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        scheme = "https" if tls else "http"
        self.url = f"{scheme}://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def keys(self) -> list[str | None]:
        return [key for _, key in self.seen]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
