"""``sglang-fleet smoke URL`` against the SGLang simulator (a real process on loopback)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import ROOT, Origin, free_port, one_gpu_env, start_sim, wait_for_health


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    tmp = tmp_path_factory.mktemp("smoke")
    key = tmp / "api-key"
    key.write_text("smoke-test-key\n")
    env = one_gpu_env(tmp)
    sim = start_sim(tmp, "--speculative-algorithm", "NEXTN", "--mamba-radix-cache-strategy",
                    "extra_buffer", "--reasoning-parser", "qwen3", "--served-model-name",
                    "qwen3.6-27b", "--api-key", "smoke-test-key", env=env)
    proc, url = sim.proc, sim.url
    wait_for_health(url)
    yield url, key
    proc.terminate()
    proc.wait(20)


def smoke(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sglang_fleet.cli", "smoke", *args],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)


def test_smoke_report(server: tuple[str, Path]) -> None:
    url, key = server
    result = smoke(url, "--api-key-file", str(key), "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["ok"] and report["model"] == "qwen3.6-27b"
    assert report["smoke"]["answer"].startswith("4")
    assert report["smoke"]["tokens_per_s"] > 0 and report["smoke"]["accept_length"] > 1
    human = smoke(url, "--api-key-file", str(key))
    assert human.returncode == 0 and human.stdout.startswith(f"{url} (qwen3.6-27b): smoke: '4")


def test_smoke_without_the_key(server: tuple[str, Path]) -> None:
    url, _ = server
    result = smoke(url)
    assert result.returncode == 1
    assert "answered 401 (an API key is needed: --api-key-file" in result.stderr


def test_smoke_nothing_listening() -> None:
    result = smoke(f"http://127.0.0.1:{free_port()}", "--json")
    assert result.returncode == 1 and json.loads(result.stdout)["ok"] is False


@pytest.fixture
def redirected() -> Iterator[tuple[Origin, Origin]]:
    """A server whose every endpoint redirects to another port (another origin), and that one,
    which would answer as a server does."""
    models = json.dumps({"data": [{"id": "m"}]}).encode()
    elsewhere = Origin({"/v1/models": (200, {}, models)})
    moved = {path: (302, {"Location": f"{elsewhere.url}{path}"}, b"")
             for path in ("/v1/models", "/v1/chat/completions")}
    first = Origin(moved)
    yield first, elsewhere
    first.close()
    elsewhere.close()


def test_smoke_sends_the_key_to_no_other_origin(redirected: tuple[Origin, Origin],
                                                tmp_path: Path) -> None:
    first, elsewhere = redirected
    key = tmp_path / "key"
    key.write_text("smoke-test-key-0123\n")
    result = smoke(first.url, "--api-key-file", str(key))
    assert result.returncode == 1
    assert f"a redirect to {elsewhere.url}, not followed" in result.stderr
    assert first.keys() == ["Bearer smoke-test-key-0123"] and elsewhere.seen == []


def test_the_gates_requests_follow_no_redirect(redirected: tuple[Origin, Origin]) -> None:
    """The gate's host program (check_server) on the host: a 3xx is the answer."""
    from sglang_fleet.stages.gate.host import check_server

    first, elsewhere = redirected
    status, raw = check_server.request(f"{first.url}/v1/models", "k" * 20)
    assert status == 302 and raw.decode().startswith(f"a redirect to {elsewhere.url},")
    with pytest.raises(check_server.GateError, match=f"redirect to {elsewhere.url}, not"):
        check_server.smoke(first.url, "k" * 20, "m")
    assert elsewhere.seen == [] and len(first.seen) == 2


def test_credentials_in_the_url_are_refused_unshown() -> None:
    result = smoke("http://user:hunter2-pw@127.0.0.1:1")
    # a URL wrong as written: a usage error, before anything is sent
    assert result.returncode == 2 and "holds credentials" in result.stderr
    assert "hunter2" not in result.stderr + result.stdout
