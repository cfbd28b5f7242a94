"""``sglang-fleet smoke URL`` against the SGLang simulator (a real process on loopback)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import ROOT, free_port, wait_for_health


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    tmp = tmp_path_factory.mktemp("smoke")
    smi = tmp / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho '0, NVIDIA B200, 183359'\n")
    smi.chmod(0o755)
    key = tmp / "api-key"
    key.write_text("smoke-test-key\n")
    port = free_port()
    env = {**os.environ, "PATH": f"{tmp}:{os.environ['PATH']}", "SGLANG_SIM_LOAD_SECONDS": "0"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "sglang_sim.launch_server", "--model-path",
         str(ROOT / "lab" / "models" / "qwen3.6-27b"), "--host", "127.0.0.1", "--port", str(port),
         "--speculative-algorithm", "NEXTN", "--mamba-radix-cache-strategy", "extra_buffer",
         "--reasoning-parser", "qwen3", "--served-model-name", "qwen3.6-27b",
         "--api-key", "smoke-test-key"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
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
