"""Run the simulator as SGLang is run: a process with flags, a model directory and nvidia-smi."""

from __future__ import annotations

import os
import random
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from sglang_sim.ports import free_port as free_port  # the tests import it from here

# SIGINT and SIGQUIT as a terminal's processes have them: a run in the background of a script
# inherits both ignored (POSIX), and so would every simulator and child a test starts.
signal.signal(signal.SIGINT, signal.default_int_handler)
signal.signal(signal.SIGQUIT, signal.SIG_DFL)

REPO = Path(__file__).resolve().parents[3]
MODEL = REPO / "lab" / "models" / "qwen3.6-27b"
MTP = ["--speculative-algorithm", "NEXTN", "--speculative-num-steps", "3",
       "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4"]


# What a server logs once it listens: uvicorn's line, after its bind (every server with HTTP);
# a rank above 0 has uvicorn log nothing and says this as its health thread starts (SGLang's
# order), so for those ranks the line is no proof of the bind.
LISTENING = ("Uvicorn running on", "Dummy health check server started")


def grpc_port() -> int:
    """A port for a gRPC-mode server: SGLang derives port + 10000 (its native gRPC port, which
    it range-checks), and the HTTP sidecar takes port + 1, so both it and the next are free."""
    while True:
        port = random.randint(20000, 55000)
        with socket.socket() as a, socket.socket() as b:
            try:
                a.bind(("127.0.0.1", port))
                b.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        return port


@pytest.fixture(scope="session")
def gpu_bin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory with an ``nvidia-smi`` that answers like an 8-GPU B200 host."""
    path = tmp_path_factory.mktemp("bin")
    smi = path / "nvidia-smi"
    smi.write_text("#!/bin/sh\nfor i in 0 1 2 3 4 5 6 7; do echo \"$i, NVIDIA B200, 183359\"; "
                   "done\n")
    smi.chmod(0o755)
    return path


@dataclass
class Sim:
    proc: subprocess.Popen[str]
    url: str
    log: Path

    def output(self) -> str:
        return self.log.read_text()

    def client(self, **kw: Any) -> httpx.Client:
        return httpx.Client(base_url=self.url, **{"timeout": 30, **kw})

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        return self.proc.wait()


class Launcher:
    def __init__(self, gpu_bin: Path, tmp: Path) -> None:
        self.gpu_bin = gpu_bin
        self.tmp = tmp
        self.started: list[Sim] = []

    def start(self, *flags: str, env: dict[str, str] | None = None, model: Path = MODEL,
              wait: bool = True, port: int | None = None, session: bool = False,
              host: str = "127.0.0.1", cwd: Path | None = None) -> Sim:
        full_env = {**os.environ, "PATH": f"{self.gpu_bin}:{os.environ['PATH']}",
                    "SGLANG_SIM_LOAD_SECONDS": "0.2", "SGLANG_SIM_DRAIN_POLL_SECONDS": "0.2",
                    "SGLANG_SIM_CAPTURE_SECONDS": "0.05",
                    **(env or {})}
        for _ in range(5):
            chosen = port or free_port()
            log = self.tmp / f"sim-{chosen}.log"
            argv = [sys.executable, "-m", "sglang_sim.launch_server", "--model-path", str(model),
                    "--host", host, "--port", str(chosen), *flags]
            with log.open("w") as out:
                proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                        env=full_env, text=True, start_new_session=session,
                                        cwd=cwd)
            sim = Sim(proc, f"http://{host}:{chosen}", log)
            self.started.append(sim)
            if not wait:
                return sim
            try:
                self.wait_healthy(sim)
                return sim
            except AssertionError:
                # a free port another test's server took before this one bound it: another
                if port is not None or "address already in use" not in sim.output():
                    raise
        raise AssertionError("5 free ports in a row were taken before the simulator bound them")

    @staticmethod
    def wait_healthy(sim: Sim, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if sim.proc.poll() is not None:
                raise AssertionError(f"simulator exited {sim.proc.returncode}:\n{sim.output()}")
            try:
                # its listener's line first: until this server has bound, another may answer
                if (any(line in sim.output() for line in LISTENING)
                        and httpx.get(sim.url + "/health", timeout=2).status_code == 200):
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise AssertionError(f"simulator not healthy in {timeout} s:\n{sim.output()}")

    def run(self, *flags: str, env: dict[str, str] | None = None,
            timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """Run to exit (for launches that must fail)."""
        full_env = {**os.environ, "PATH": f"{self.gpu_bin}:{os.environ['PATH']}",
                    "SGLANG_SIM_LOAD_SECONDS": "0.1", "SGLANG_SIM_CAPTURE_SECONDS": "0.05",
                    **(env or {})}
        argv = [sys.executable, "-m", "sglang_sim.launch_server", "--model-path", str(MODEL),
                "--host", "127.0.0.1", "--port", str(grpc_port()), *flags]
        return subprocess.run(argv, capture_output=True, text=True, env=full_env,
                              timeout=timeout)


@pytest.fixture
def sims(gpu_bin: Path, tmp_path: Path) -> Iterator[Launcher]:
    launcher = Launcher(gpu_bin, tmp_path)
    yield launcher
    for sim in launcher.started:
        if sim.proc.poll() is None:
            sim.proc.kill()
            sim.proc.wait()


@pytest.fixture(scope="module")
def field_sim(gpu_bin: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sim]:
    """The field's launch: Qwen3.6-27B, MTP, extra_buffer, qwen3 reasoning, metrics."""
    launcher = Launcher(gpu_bin, tmp_path_factory.mktemp("field"))
    sim = launcher.start(*MTP, "--mamba-radix-cache-strategy", "extra_buffer",
                         "--reasoning-parser", "qwen3", "--enable-metrics")
    yield sim
    sim.stop()


def died_of_a_child(output: str, returncode: int, cause: str, running: bool = True) -> None:
    """How SGLang ends when a child fails (see sglang_sim/processes.py for the sources): the
    cause, the server's SIGQUIT handler (running or launch phase), kill_process_tree's line
    (0.5.13+), and the server itself killed by SIGKILL."""
    assert returncode == -9, (returncode, output[-3000:])
    assert cause in output, output[-3000:]
    handler = ("SIGQUIT received. signum=None, frame=None. It usually means one child failed."
               if running else
               "Received sigquit from a child process. It usually means the child failed.")
    assert handler in output, output[-3000:]
    assert output.index(cause) < output.index(handler)
    assert re.search(r"kill_process_tree called: parent_pid=(\d+), include_parent=True, "
                     r"pid=\1", output), output[-3000:]


GRPC = ["--smg-grpc-mode", "--reasoning-parser", "qwen3", "--enable-metrics"]
NO_PLANNED_WARMUP = {"SMG_SGLANG_SERVICER_WARMUP": "off"}


def wait_serving(sim: Sim, timeout: float = 30) -> None:
    """Ready as the gRPC servicer says it: its last start-up line (no HTTP to ask)."""
    deadline = time.monotonic() + timeout
    while "The server is fired up and ready to roll!" not in sim.output():
        if sim.proc.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(f"not serving (exit {sim.proc.poll()}):\n{sim.output()}")
        time.sleep(0.1)


def target(sim: Sim) -> str:
    return sim.url.removeprefix("http://")


def sidecar(sim: Sim) -> str:
    """The HTTP sidecar's URL beside a gRPC-mode server: port + 1."""
    host, port = sim.url.rsplit(":", 1)
    return f"{host}:{int(port) + 1}"


def generate(ids: list[int], stream: bool, max_new: int = 64) -> Any:
    """A GenerateRequest for ``ids`` (smg-grpc-proto's message)."""
    from smg_grpc_proto import sglang_scheduler_pb2 as pb

    return pb.GenerateRequest(request_id=f"t-{time.time()}", stream=stream,
                              tokenized=pb.TokenizedInput(input_ids=ids),
                              sampling_params=pb.SamplingParams(max_new_tokens=max_new))


@pytest.fixture(scope="module")
def grpc_sim(gpu_bin: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sim]:
    """A simulator in gRPC mode (no planned warm-up), for a module's tests."""
    launcher = Launcher(gpu_bin, tmp_path_factory.mktemp("grpc"))
    sim = launcher.start(*GRPC, env=NO_PLANNED_WARMUP, wait=False, port=grpc_port())
    wait_serving(sim)
    yield sim
    sim.stop()


@pytest.fixture(scope="module")
def stub(grpc_sim: Sim) -> Iterator[Any]:
    """A SglangScheduler stub on ``grpc_sim``."""
    import grpc
    from smg_grpc_proto import sglang_scheduler_pb2_grpc as pb_grpc

    with grpc.insecure_channel(target(grpc_sim)) as channel:
        yield pb_grpc.SglangSchedulerStub(channel)
