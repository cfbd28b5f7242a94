"""check_servers, the gate of a host's servers at once, as a real program: one check_server
process per server, started together, against simulator processes and a server that answers
/health_generate only while two checks ask at once."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from sglang_fleet.config.render import render_all
from sglang_fleet.stages.gate.program import split
from tests.conftest import Sims, field_profile, free_port

MODEL = "qwen3.6-27b"


def check_servers(*servers: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sglang_fleet.stages.gate.host.check_servers",
                           "--servers", json.dumps(list(servers))],
                          capture_output=True, text=True, timeout=120)


def smoke_only(unit: str, url: str, env: Path) -> list[str]:
    return ["--unit", unit, "--url", url, "--env-file", str(env), "--model", MODEL,
            "--smoke-only"]


@pytest.fixture
def env(tmp_path: Path) -> Path:
    path = tmp_path / "sglang.env"
    path.write_text("SGLANG_API_KEY=k\n")
    return path


@pytest.fixture
def together() -> Iterator[str]:
    """A server whose /health_generate answers 200 only once two requests wait on it at the
    same time (503 after 15 s alone), and 404 to anything else."""
    both = threading.Barrier(2, timeout=15)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            status = 404
            if self.path == "/health_generate":
                try:
                    both.wait()
                    status = 200
                except threading.BrokenBarrierError:
                    status = 503
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_each_servers_lines_come_in_order_with_its_exit_status(
        tmp_path: Path, env: Path) -> None:
    sims = Sims(tmp_path)
    try:
        good = sims.start("--served-model-name", MODEL)
        closed = f"http://127.0.0.1:{free_port()}"
        done = check_servers(smoke_only("sglang-0.service", good, env),
                             smoke_only("sglang-1.service", closed, env))
    finally:
        sims.stop_all()
    assert done.returncode == 1, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert [line for line in lines if line.startswith("CHECKED ")] == [
        'CHECKED {"unit": "sglang-0.service", "exit": 0}',
        'CHECKED {"unit": "sglang-1.service", "exit": 1}']
    (passed, first), (failed, second) = split(render_all(field_profile(gpus=2)), lines)
    assert passed and any(line.startswith("smoke: '4") for line in first), first
    assert not failed and any(f"{closed}/health_generate" in line for line in second), second


def test_the_checks_run_at_once(together: str, env: Path) -> None:
    """Both checks pass /health_generate, which answers only while both ask: run one after the
    other, the first would get 503. Each then fails at the chat completion (404), after it."""
    done = check_servers(smoke_only("sglang-0.service", together, env),
                         smoke_only("sglang-1.service", together, env))
    errors = [json.loads(line[5:])["error"] for line in done.stdout.splitlines()
              if line.startswith("GATE ")]
    assert len(errors) == 2 and all("/v1/chat/completions" in e for e in errors), done.stdout


@pytest.mark.parametrize("raw", ["[]", "{}", '[["--url", "u"]]', '[["--unit"]]', '[[1]]', "x"])
def test_a_bad_server_list_is_refused(raw: str) -> None:
    done = subprocess.run([sys.executable, "-m", "sglang_fleet.stages.gate.host.check_servers",
                           "--servers", raw], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stdout.startswith("error: --servers must be a JSON list"), done.stdout
