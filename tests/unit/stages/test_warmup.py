"""The warm-up stage in pyinfra's style (facts in, commands out) and its host program against
real child processes standing in for a release's entry points."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pyinfra.connectors.util import CommandOutput, OutputLine

from sglang_fleet import ops
from sglang_fleet.config.render import Launch, render
from sglang_fleet.facts.nvidia import Gpu, SmiReport
from sglang_fleet.facts.systemd import UnitState
from sglang_fleet.ops.host_programs import program
from sglang_fleet.remote import warm_caches
from sglang_fleet.stages import warmup
from sglang_fleet.stages.engine import Release
from tests.conftest import field_profile, free_port
from tests.fakes import Host, commands

PROFILE = field_profile({"parallel.instances": 1})  # a spare GPU to warm on
LAUNCH = render(PROFILE)
RELEASE = Release("sglang", "0.5.23", (), None, None, "/usr/bin/python3")


def smi(count: int) -> SmiReport:
    gpus = tuple(Gpu(i, "NVIDIA B200", 183359, "580.95.05", "10.0", True) for i in range(count))
    return SmiReport(gpus, None)


def running(release: Release, flags: tuple[str, ...]) -> dict[str, UnitState]:
    argv = (*program(release.python_bin, "start_server"), LAUNCH.argv[2], *flags)
    return {LAUNCH.unit: UnitState(LAUNCH.unit, "loaded", "active", "running", "", 42, argv)}


class WarmHost(Host):
    """A host whose warm-up program answers ``result`` (and records the command)."""

    def __init__(self, facts: dict[str, Any], result: dict[str, Any] | None = None) -> None:
        super().__init__(facts)
        self.result = result or {"mode": "compile", "seconds": 120.5, "ok": True}
        self.ran: list[str] = []
        self.printed: list[bool] = []

    def run_shell_command(self, command: str, **kwargs: Any) -> tuple[bool, CommandOutput]:
        self.ran.append(command)
        self.printed.append(kwargs.get("print_output", False))
        lines = ["warm-up: Compiling DeepGEMM", f"WARMUP {json.dumps(self.result)}"]
        return bool(self.result["ok"]), CommandOutput([OutputLine("stdout", x) for x in lines])


@pytest.fixture
def use(monkeypatch: pytest.MonkeyPatch) -> Callable[[WarmHost], WarmHost]:
    monkeypatch.setattr(warmup, "state", type("S", (), {"is_executing": True}))
    said: list[str] = []
    monkeypatch.setattr(warmup, "logger", type("L", (), {"warning": said.append,
                                                        "info": said.append})())

    def install(fake: WarmHost) -> WarmHost:
        fake.said = said  # type: ignore[attr-defined]
        for module in (warmup, ops):
            monkeypatch.setattr(module, "host", fake, raising=False)
        return fake

    return install


def facts(units: dict[str, UnitState], gpus: int = 8, precompile: bool = True,
          marked: bool = False) -> dict[str, Any]:
    return {"UnitStates": units, "NvidiaSmi": smi(gpus), "PortListeners": [],
            "FindFiles": ["/x/sglang/compile_deep_gemm.py"] if precompile else [],
            "File": {"mode": 644} if marked else None}


OLD = Release("sglang", "0.5.19", (), None, None, "/usr/bin/python3")


def test_spare_gpus_are_those_no_instance_uses() -> None:
    assert warmup.spare_gpus(PROFILE, 8) == [1]
    assert warmup.spare_gpus(PROFILE, 1) == []
    assert warmup.precompile_module(LAUNCH) == "sglang.compile_deep_gemm"


def test_a_new_release_is_compiled_on_a_spare_gpu_then_marked(use: Callable[..., Any]) -> None:
    fake = use(WarmHost(facts(running(OLD, LAUNCH.argv[3:]))))
    [mark] = commands(warmup.caches_warmed, PROFILE, LAUNCH, RELEASE, 1800)
    assert mark.startswith(f"install -d -m 755 {warmup.MARKS} && touch {warmup.MARKS}/")
    words = shlex.split(fake.ran[0])
    assert words[:5] == ["systemd-run", "--quiet", "--wait", "--pipe", "--collect"]
    assert "--uid=sglang" in words and "--setenv=CUDA_VISIBLE_DEVICES=1" in words
    tail = words[words.index("--mode"):]
    assert tail[:10] == ["--mode", "compile", "--python", RELEASE.python_bin, "--module",
                         "sglang.compile_deep_gemm", "--port", str(LAUNCH.port + 1000),
                         "--timeout", "1800"]
    assert tail[tail.index("--") + 1:] == list(LAUNCH.argv[3:])
    assert not any("api" in w.lower() and "key" in w.lower() for w in words)
    assert any("120.5 s while sglang.service served" in s for s in fake.said)


def test_the_warm_up_says_its_progress_as_it_comes(use: Callable[..., Any]) -> None:
    """Every 10 s a line from the host program (--progress), printed by pyinfra as it comes."""
    fake = use(WarmHost(facts(running(OLD, LAUNCH.argv[3:]))))
    commands(warmup.caches_warmed, PROFILE, LAUNCH, RELEASE, 1800)
    words = shlex.split(fake.ran[0])
    assert words[words.index("--progress") + 1] == "10" and fake.printed == [True]
    assert any("warm-up (compile) of sglang-0.5.23" in s and "up to 1800 s" in s
               for s in fake.said)


@pytest.mark.parametrize("given, noop", [
    (facts(running(RELEASE, LAUNCH.argv[3:])), "runs this release with these flags"),
    (facts({}), "is not serving"),
    (facts(running(OLD, LAUNCH.argv[3:]), marked=True), "the caches are warm"),
])
def test_nothing_to_warm(use: Callable[..., Any], given: dict[str, Any], noop: str) -> None:
    fake = use(WarmHost(given))
    assert commands(warmup.caches_warmed, PROFILE, LAUNCH, RELEASE, 1800) == []
    assert noop in fake.noops[0] and fake.ran == []


@pytest.mark.parametrize("given, said", [
    (facts(running(OLD, LAUNCH.argv[3:]), gpus=1), "no GPUs beside the servers'"),
    (facts(running(OLD, LAUNCH.argv[3:]), precompile=False), "has no sglang.compile_deep_gemm"),
])
def test_a_warm_up_that_cannot_run_is_said(use: Callable[..., Any], given: dict[str, Any],
                                           said: str) -> None:
    fake = use(WarmHost(given))
    assert commands(warmup.caches_warmed, PROFILE, LAUNCH, RELEASE, 1800) == []
    assert fake.ran == [] and any(said in s and "compiles" in s for s in fake.said)


def test_a_failed_warm_up_warns_and_marks_nothing(use: Callable[..., Any]) -> None:
    result = {"mode": "compile", "ok": False, "error": "the precompile exited with status 1",
              "tail": ["RuntimeError: CUDA error"]}
    fake = use(WarmHost(facts(running(OLD, LAUNCH.argv[3:])), result))
    assert commands(warmup.caches_warmed, PROFILE, LAUNCH, RELEASE, 1800) == []
    assert any("failed: the precompile exited with status 1" in s for s in fake.said)
    assert any("RuntimeError: CUDA error" in s for s in fake.said)


def test_the_key_ignores_port_host_and_gpus_but_not_flags() -> None:
    two = render(PROFILE, instance=0)
    key = warmup.warm_key(two, RELEASE, "compile")
    argv = list(two.argv)
    argv[argv.index("--port") + 1] = "31999"
    moved = Launch(two.version, tuple(argv), {**two.env, "CUDA_VISIBLE_DEVICES": "3"})
    assert warmup.warm_key(moved, RELEASE, "compile") == key
    assert warmup.warm_key(two, OLD, "compile") != key
    assert warmup.warm_key(two, RELEASE, "full") != key


# The host program, with stand-ins for a release's entry points.
ENTRY = textwrap.dedent('''
    import http.server, sys, time
    args = sys.argv[1:]
    port = int([args[i + 1] for i, a in enumerate(args) if a == "--port"][-1])  # argparse's
    if "--fail" in args:
        print("RuntimeError: CUDA error", flush=True); sys.exit(3)
    if "--smg-grpc-mode" in args:    # no HTTP to ask
        print("gRPC server listening", flush=True); time.sleep(60); sys.exit(4)
    if "--timeout" in args:          # the precompile: compile, then exit
        print("Compiling DeepGEMM kernels", flush=True); sys.exit(0)
    class H(http.server.BaseHTTPRequestHandler):
        def _ok(self):
            self.send_response(200); self.end_headers(); self.wfile.write(b"{}")
        do_GET = do_POST = _ok
        def log_message(self, *a): pass
    print("The server is fired up and ready to roll!", flush=True)
    http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
''')


def run_program(tmp_path: Path, *args: str) -> tuple[int, dict[str, Any], str]:
    (tmp_path / "entry.py").write_text(ENTRY)
    argv = [sys.executable, "-m", "sglang_fleet.remote.warm_caches", "--python",
            sys.executable, "--module", "entry", "--port", str(free_port()), "--timeout", "30",
            *args]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120,
                          env={"PYTHONPATH": f"{tmp_path}:{Path(warm_caches.__file__).parents[2]}"})
    line = next(x for x in proc.stdout.splitlines() if x.startswith("WARMUP "))
    return proc.returncode, json.loads(line[7:]), proc.stdout


def test_program_compile_runs_the_entry_point_to_its_end(tmp_path: Path) -> None:
    code, result, out = run_program(tmp_path, "--mode", "compile", "--", "--model-path", "/m")
    assert code == 0 and result["ok"] and "warm-up: Compiling DeepGEMM kernels" in out


def test_program_full_starts_generates_and_stops(tmp_path: Path) -> None:
    code, result, out = run_program(tmp_path, "--mode", "full", "--", "--model-path", "/m")
    assert code == 0 and result["ok"] and "fired up" in out


def test_a_grpc_mode_server_is_warmed_over_http(tmp_path: Path) -> None:
    launch = render(field_profile({"parallel.instances": 1, "server.router_connection": "grpc",
                                   "server.api_key_secret": None}))
    assert "--smg-grpc-mode" in launch.argv
    code, result, out = run_program(tmp_path, "--mode", "full", "--", *launch.argv[3:])
    assert code == 0 and result["ok"] and "fired up" in out, out


def test_program_reports_a_failing_entry_point(tmp_path: Path) -> None:
    code, result, _ = run_program(tmp_path, "--mode", "full", "--", "--fail")
    assert code == 1 and not result["ok"]
    assert "exited with status 3" in result["error"] and "RuntimeError: CUDA error" in \
        result["tail"]
