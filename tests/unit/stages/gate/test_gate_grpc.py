"""The gate's gRPC calls (stages/gate/host/gate_grpc.py) against the simulator in gRPC mode,
which serves
smg-grpc-servicer's SglangScheduler from smg-grpc-proto's definitions (docs/lab.md)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sglang_fleet.config import connection
from sglang_fleet.report import status
from sglang_fleet.report.grpc_health import GrpcHealth
from sglang_fleet.stages.gate.host import grpc_health
from sglang_fleet.stages.gate.host.gate_grpc import Scheduler
from sglang_fleet.stages.gate.host.gate_http import GateError
from tests.conftest import ROOT, free_port, one_gpu_env

READY = b"The server is fired up and ready to roll!"


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("grpc")
    env = one_gpu_env(tmp, SMG_SGLANG_SERVICER_WARMUP="off")
    for _ in range(5):
        port, log = free_port(), tmp / "sim.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "sglang_sim.launch_server", "--model-path",
                 str(ROOT / "lab" / "models" / "qwen3.6-27b"), "--host", "127.0.0.1",
                 "--port", str(port), "--smg-grpc-mode", "--reasoning-parser", "qwen3",
                 "--max-running-requests", "8", "--enable-metrics",
                 "--smg-http-sidecar-port", str(connection.sidecar_port(port))], env=env,
                stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while READY not in log.read_bytes() and proc.poll() is None \
                and time.monotonic() < deadline:
            time.sleep(0.1)
        if READY in log.read_bytes():
            break
        proc.kill()
        proc.wait()
    else:
        raise AssertionError(log.read_text()[-2000:])
    yield f"127.0.0.1:{port}"
    proc.terminate()
    proc.wait(30)


def test_health_and_effective_arguments(target: str) -> None:
    with Scheduler(target) as server:
        assert server.ready()
        assert server.health() == (True, "Health check passed")
        info = server.server_info()
    assert info["version"] == "0.5.23"
    assert info["max_running_requests"] == 8 and isinstance(info["max_running_requests"], int)
    assert info["reasoning_parser"] == "qwen3" and info["port"] == int(target.split(":")[1])


def test_generate_streams_tokens_and_counts_them(target: str) -> None:
    with Scheduler(target) as server:
        streamed = server.generate([9707, 11, 1079], 12)
        whole = server.generate([9707, 11, 1079], 12, stream=False)
        assert server.queued() == 0
    assert streamed.finish_reason in ("stop", "length")
    assert streamed.completion_tokens == len(streamed.output_ids) > 0
    assert streamed.prompt_tokens == 3 and streamed.first_token_s is not None
    assert whole.output_ids == streamed.output_ids  # greedy


def test_no_server_is_a_gate_error_in_one_line() -> None:
    closed = f"127.0.0.1:{free_port()}"
    with Scheduler(closed) as server:
        healthy, why = server.health(timeout=3)
        assert not healthy and "HealthCheck: UNAVAILABLE" in why
        with pytest.raises(GateError, match=r"GetServerInfo: UNAVAILABLE"):
            server.server_info(timeout=3)
        with pytest.raises(GateError, match=r"Generate: (UNAVAILABLE|DEADLINE_EXCEEDED)"):
            server.generate([1, 2], 4, timeout=3)



def test_the_smoke_tokenizes_the_chat_turn_and_reads_the_answer(target: str) -> None:
    from sglang_fleet.stages.gate.host.gate_grpc_smoke import grpc_smoke, prompt_ids

    model = str(ROOT / "lab" / "models" / "qwen3.6-27b")
    ids = prompt_ids(model)
    assert ids[0] == 248045 and ids[-2:] == [248068, 10]  # <|im_start|> ... <think>\n
    with Scheduler(target) as server:
        s = grpc_smoke(server, model, "qwen3", "0.5.23")
        assert s["sane"] and "4" in s["answer"] and s["reasoning_chars"] > 0
        assert s["tokens"] > 0 and s["tokens_per_s"] > 0
        plain = grpc_smoke(server, model, None, "0.5.23")  # a parser not read: not split
    assert plain["reasoning_chars"] == 0 and plain["answer"] != s["answer"]  # the thought too


def test_a_model_directory_without_a_tokenizer_is_a_gate_error(tmp_path: Path) -> None:
    from sglang_fleet.stages.gate.host.gate_grpc_smoke import prompt_ids

    with pytest.raises(GateError, match=f"tokenizer in {tmp_path} did not load"):
        prompt_ids(str(tmp_path))


def test_check_server_gates_a_grpc_server_with_the_same_steps(
        target: str, tmp_path: Path) -> None:
    """check_server with a grpc:// URL: health, effective arguments, smoke, soak and capacity,
    the unit's state and journal from systemctl and journalctl stand-ins (the simulator's
    log as its journal)."""
    import json

    log = next((p for p in tmp_path.parent.glob("grpc*/sim.log")), None)
    assert log is not None
    (tmp_path / "systemctl").write_text(
        "#!/bin/sh\nprintf 'ActiveState=active\\nSubState=running\\nInvocationID=i1\\n'\n")
    (tmp_path / "journalctl").write_text(f"#!/bin/sh\ncase \"$*\" in *json*) ;; "
                                         f"*) cat {log} ;; esac\n")
    for tool in ("systemctl", "journalctl"):
        (tmp_path / tool).chmod(0o755)
    env_file = tmp_path / "env"
    env_file.write_text("")
    run = subprocess.run(
        [sys.executable, "-m", "sglang_fleet.stages.gate.host.check_server",
         "--unit", "sglang.service",
         "--url", f"grpc://{target}", "--env-file", str(env_file), "--model", "m",
         "--model-dir", str(ROOT / "lab" / "models" / "qwen3.6-27b"),
         "--reasoning-parser", "qwen3", "--budget", "30", "--soak-requests", "6",
         "--expect", json.dumps({"max_running_requests": 8, "reasoning_parser": "qwen3"})],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"})
    gate = json.loads(run.stdout.splitlines()[-1].removeprefix("GATE "))
    assert run.returncode == 0 and gate["ok"], run.stdout + run.stderr
    assert "health: " in run.stdout and "HealthCheck: healthy" in run.stdout
    assert "arguments: SGLang 0.5.23" in run.stdout
    assert gate["soak"]["requests"] == 6 and gate["soak"]["failed"] == 0
    assert gate["smoke"]["sane"] and gate["capacity"]

    wrong = subprocess.run(
        [sys.executable, "-m", "sglang_fleet.stages.gate.host.check_server",
         "--unit", "sglang.service",
         "--url", f"grpc://{target}", "--env-file", str(env_file), "--model", "m",
         "--model-dir", str(ROOT / "lab" / "models" / "qwen3.6-27b"), "--budget", "30",
         "--expect", json.dumps({"max_running_requests": 16})],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"})
    assert wrong.returncode == 1
    assert "max_running_requests: serving 8, rendered 16" in wrong.stdout


def asked_on_host(target: str, capsys: pytest.CaptureFixture[str]) -> tuple[bool, str] | None:
    """What status reads from a server's host: stages/gate/host/grpc_health.py's line, through
    the fact
    that runs it over SSH (its port answers the routers and the host alone)."""
    assert grpc_health.main([target]) == 0
    return GrpcHealth().process(capsys.readouterr().out.splitlines())


def test_status_reads_health_over_grpc_and_metrics_from_the_side_port(
        target: str, capsys: pytest.CaptureFixture[str]) -> None:
    row = status.Row("server", "lab1", f"grpc://{target}")
    row.grpc_health = asked_on_host(target, capsys)
    status._http(row)
    assert row.health == "ok"
    assert (row.running, row.queued) == (0, 0) and row.model.endswith("qwen3.6-27b")


def test_status_says_a_grpc_server_that_is_not_there_is_unreachable(
        capsys: pytest.CaptureFixture[str]) -> None:
    target = f"127.0.0.1:{free_port()}"
    with Scheduler(target) as server:
        assert not server.ready(1)
    row = status.Row("server", "lab1", f"grpc://{target}")
    row.grpc_health = asked_on_host(target, capsys)
    status._http(row)
    assert (row.health, row.running) == ("unreachable (gRPC UNAVAILABLE)", None)
    unasked = status.Row("server", "lab1", f"grpc://{target}")  # its host was not read
    status._http(unasked)
    assert unasked.health.startswith("not read") and unasked.running is None
