from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gevent.monkey  # type: ignore[import-untyped]
import httpx
import pytest
from sglang_sim.ports import free_port as free_port  # the tests import it from here

from sglang_fleet.config.profile import Profile, load
from tests import noconnect


def lab_slot(environ: MutableMapping[str, str]) -> None:
    """Each pytest-xdist worker runs its lab tests in a lab slot of its own: gwN in slot N (N
    after the run's SGLANG_FLEET_LAB_SLOT, when set). Set before anything reads the lab's
    state (sglang_fleet_lab.state reads it when first imported); the commands the tests run
    (sglang-fleet lab, pyinfra with inventories/lab.py) inherit it."""
    worker = environ.get("PYTEST_XDIST_WORKER", "")
    if worker.startswith("gw") and worker[2:].isdigit():
        base = environ.get("SGLANG_FLEET_LAB_SLOT", "").strip() or "0"
        environ["SGLANG_FLEET_LAB_SLOT"] = str(int(base) + int(worker[2:]))


lab_slot(os.environ)


def default_signals() -> None:
    """SIGINT and SIGQUIT as a terminal's processes have them. A run started in the background
    of a script inherits both ignored (POSIX: an asynchronous list without job control), and
    every process a test starts would inherit that: a job deaf to Ctrl-C, a simulated DP
    controller that outlives its rank's SIGQUIT. Tests that need one ignored say so."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGQUIT, signal.SIG_DFL)


default_signals()

# No test reaches the example inventory's hosts (inventories/b200.py): refused in this process,
# and processes tests start with it use noconnect.env() (tests/examples/test_examples.py checks).
noconnect.refuse_example_hosts()

# pyinfra_cli patches the whole process with gevent when it is imported (planning.load imports
# it to read an inventory, in some tests in-process): the test workers' own threads (pytest-xdist's
# execnet channel) cannot run patched, and reading an inventory needs no patching.
gevent.monkey.patch_all = lambda *args, **kwargs: True

ROOT = Path(__file__).resolve().parent.parent
MODEL = ROOT / "lab" / "models" / "qwen3.6-27b"  # the lab model the simulator serves


@pytest.fixture(autouse=True, scope="session")
def roll_journals(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The rolls tests run (in-process and the commands they start) keep their journals in
    the run's temporary directory, not this machine's ~/.local/state."""
    os.environ["XDG_STATE_HOME"] = str(tmp_path_factory.mktemp("state"))
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


# Minutes each lab module took (pytest --durations=0, four workers on a 2-core machine, the
# lab's root file system cached): the scheduler starts the longest first. A module not listed
# counts as 5.
LAB_MINUTES = {
    "tests/lab/test_fleet.py": 15, "tests/lab/test_serving.py": 8.7,
    "tests/lab/test_generate.py": 8.6, "tests/lab/test_multinode.py": 8.6,
    "tests/lab/test_compile_once.py": 7.3, "tests/lab/test_recovery.py": 6,
    "tests/lab/test_target_running_requests.py": 4, "tests/lab/test_gpu_status.py": 3.7,
    "tests/lab/test_security.py": 2.4, "tests/lab/test_demo.py": 2.4,
    "tests/lab/test_grpc.py": 3, "tests/lab/test_lab.py": 1.7, "tests/lab/test_driver.py": 1.4,
    "tests/lab/test_dp.py": 1.3,
}


def lab_scope(nodeid: str) -> str | None:
    """The lab module a test belongs to (its tests run together, in order, on one worker,
    in that worker's lab slot); None for a test that boots no lab."""
    path = nodeid.split("::", 1)[0]
    return path if path.startswith("tests/lab/") else None


def schedule_order(scopes: list[str]) -> list[str]:
    """Lab modules first, longest first (each worker takes the next when it is nearly done,
    so the workers' labs end about together), then every other test in collection order,
    filling in.

    >>> schedule_order(["tests/a.py::t", "tests/lab/test_dp.py", "tests/lab/test_fleet.py"])
    ['tests/lab/test_fleet.py', 'tests/lab/test_dp.py', 'tests/a.py::t']
    """
    lab = [s for s in scopes if lab_scope(s)]
    lab.sort(key=lambda s: -LAB_MINUTES.get(s, 5))
    return lab + [s for s in scopes if not lab_scope(s)]


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Workers each with a lab slot of its own (``lab_slot``): every lab module on one
    worker, its tests in order (they share the module's lab), the modules spread over the
    workers, longest first; everything else one by one on either. (xdist's own
    ``xdist_group`` marks do not reach its scheduler under pytest 9: the node id suffix it
    relies on is not kept.)"""
    from xdist.scheduler import LoadScopeScheduling  # type: ignore[import-untyped]

    class LabModules(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return lab_scope(nodeid) or nodeid

        def schedule(self) -> None:
            # LoadScopeScheduling.schedule, with the work queue in schedule_order.
            assert self.collection_is_completed
            if self.collection is not None:
                for node in self.nodes:
                    self._reschedule(node)
                return
            if not self._check_nodes_have_same_collection():
                self.log("**Different tests collected, aborting run**")
                return
            self.collection: list[str] = list(next(iter(self.registered_collections.values())))
            if not self.collection:
                return
            units: dict[str, dict[str, bool]] = {}
            for nodeid in self.collection:
                units.setdefault(self._split_scope(nodeid), {})[nodeid] = False
            for scope in schedule_order(list(units)):
                self.workqueue[scope] = units[scope]
            for node in self.nodes[:len(self.workqueue)]:
                self._assign_work_unit(node)
            for node in self.nodes:
                if node in self.assigned_work:
                    self._reschedule(node)
                else:
                    node.shutdown()

    return LabModules(config, log)


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


def one_gpu_env(tmp: Path, **more: str) -> dict[str, str]:
    """A simulator's environment on one B200, loading at once: an ``nvidia-smi`` in ``tmp``
    that lists GPU 0 (the simulator sizes itself from it), first on PATH; ``more`` on top."""
    smi = tmp / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho '0, NVIDIA B200, 183359'\n")
    smi.chmod(0o755)
    return {**os.environ, "PATH": f"{tmp}:{os.environ['PATH']}", "SGLANG_SIM_LOAD_SECONDS": "0",
            **more}


@dataclass(frozen=True)
class Started:
    """A simulator a test started, listening: its process, URL and log."""

    proc: subprocess.Popen[bytes]
    url: str
    log: Path


def start_sim(tmp: Path, *flags: str, env: Mapping[str, str],
              port: int | None = None) -> Started:
    """The simulator with ``flags`` on ``port``, else on a free one (another if that one is
    taken before the server binds it), once it listens; its log is ``tmp/sim-PORT.log``.

        sim = start_sim(tmp_path, "--api-key", KEY, env=env); wait_for_health(sim.url)
    """
    for _ in range(5):
        chosen = port or free_port()
        log = tmp / f"sim-{chosen}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "sglang_sim.launch_server", "--model-path",
                 str(MODEL), "--host", "127.0.0.1",
                 "--port", str(chosen), *flags], env=env, stdout=out, stderr=subprocess.STDOUT)
        if wait_bound(proc, log):
            return Started(proc, f"http://127.0.0.1:{chosen}", log)
        if port is not None or b"address already in use" not in log.read_bytes():
            raise AssertionError(f"simulator exited {proc.returncode}:\n"
                                 f"{log.read_text()[-2000:]}")
    raise AssertionError("5 free ports in a row were taken before the simulator bound them")


def wait_bound(proc: subprocess.Popen[bytes], log: Path, seconds: float = 30) -> bool:
    """Until the server ``proc``, writing to ``log``, says its HTTP listener is bound (uvicorn's
    line: True) or exits (False); killed after ``seconds``. An answer on its port proves
    nothing: another test's server may have taken the port first, and this one then fails to
    bind (uvicorn's ``[Errno 98] ... address already in use``) and exits."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if b"Uvicorn running on" in log.read_bytes():
            return True
        if proc.poll() is not None:
            return False
        time.sleep(0.05)
    proc.kill()
    proc.wait()
    raise AssertionError(f"{log.name}: no listener in {seconds} s:\n{log.read_text()[-2000:]}")


def wait_http(url: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=1).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"{url} did not answer in {timeout} s")


class Sims:
    """Simulator processes started as SGLang is: flags, a model directory, nvidia-smi."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.procs: list[subprocess.Popen[bytes]] = []
        self.env = one_gpu_env(tmp)

    def start(self, *flags: str, release: str = "0.5.23", decode: str = "1000000",
              port: int | None = None, env: dict[str, str] | None = None) -> str:
        env = {**self.env, "SGLANG_SIM_VERSION": release,
               "SGLANG_SIM_DECODE_STEPS_PER_SECOND": decode, **(env or {})}
        sim = start_sim(self.tmp, "--reasoning-parser", "qwen3", *flags, env=env, port=port)
        self.procs.append(sim.proc)
        wait_http(sim.url + "/health")
        return sim.url

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


@pytest.fixture
def sims(tmp_path: Path) -> Iterator[Sims]:
    launcher = Sims(tmp_path)
    yield launcher
    launcher.stop_all()


def write_input(path: Path, n: int, max_tokens: int = 8, extra: list[str] | None = None) -> Path:
    with path.open("w") as f:
        for i in range(n):
            f.write(json.dumps({"id": f"r{i}", "max_tokens": max_tokens,
                                "messages": [{"role": "user", "content": f"q {i}"}]}) + "\n")
        for line in extra or []:
            f.write(line + "\n")
    return path


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
