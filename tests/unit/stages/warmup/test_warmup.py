"""The warm-up stage in pyinfra's style (facts in, commands out) and its host program against
real child processes standing in for a release's entry points."""

from __future__ import annotations

import dataclasses
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
from sglang_fleet.ops.unitfile import env_line
from sglang_fleet.stages.engine.deploy import Release
from sglang_fleet.stages.warmup import deploy as warmup
from sglang_fleet.stages.warmup.host import warm_caches
from tests.conftest import field_profile, free_port
from tests.fakes import Host, commands, executed
from tests.unit.test_hostile import CONTROL, HOSTILE, server_unit

PROFILE = field_profile({"parallel.instances": 1})  # a spare GPU to warm on
LAUNCH = render(PROFILE)
RELEASE = Release("sglang", "0.5.23", (), None, None, "/usr/bin/python3")


def smi(count: int) -> SmiReport:
    gpus = tuple(Gpu(i, "NVIDIA B200", 183359, "580.95.05", "10.0", True) for i in range(count))
    return SmiReport(gpus, None)


def running(release: Release, flags: tuple[str, ...]) -> dict[str, UnitState]:
    argv = (*program(release.python_bin, "sglang_fleet.remote.start_server"), LAUNCH.argv[2],
            *flags)
    return {LAUNCH.unit: UnitState(LAUNCH.unit, "loaded", "active", "running", "", 42, argv)}


class WarmHost(Host):
    """A host whose warm-up program answers ``result``; records every command, whether its
    output was printed and what went to its standard input."""

    def __init__(self, facts: dict[str, Any], result: dict[str, Any] | None = None) -> None:
        super().__init__(facts)
        self.result = result or {"mode": "compile", "seconds": 120.5, "ok": True}
        self.ran: list[str] = []
        self.printed: list[bool] = []
        self.stdin: dict[str, str] = {}

    def run_shell_command(self, command: str, **kwargs: Any) -> tuple[bool, CommandOutput]:
        self.ran.append(command)
        self.printed.append(kwargs.get("print_output", False))
        if "_stdin" in kwargs:
            self.stdin[command] = kwargs["_stdin"]
        if not command.startswith("systemd-run "):
            return True, CommandOutput([])
        lines = ["warm-up: Compiling DeepGEMM", f"WARMUP {json.dumps(self.result)}"]
        return bool(self.result["ok"]), CommandOutput([OutputLine("stdout", x) for x in lines])

    def warm_up_words(self) -> list[str]:
        [command] = [c for c in self.ran if c.startswith("systemd-run ")]
        return shlex.split(command)


@pytest.fixture
def use(monkeypatch: pytest.MonkeyPatch) -> Callable[[WarmHost], WarmHost]:
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
    assert executed(fake, warmup.caches_warmed, PROFILE, LAUNCH, RELEASE, 1800) == [True]
    assert fake.ran[-1].startswith(f"install -d -m 755 {warmup.MARKS} && touch {warmup.MARKS}/")
    words = fake.warm_up_words()
    assert words[:5] == ["systemd-run", "--quiet", "--wait", "--pipe", "--collect"]
    assert "--uid=sglang" in words and "--gid=sglang" in words
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
    executed(fake, warmup.caches_warmed, PROFILE, LAUNCH, RELEASE, 1800)
    words = fake.warm_up_words()
    assert words[words.index("--progress") + 1] == "10"
    printed = [c for c, p in zip(fake.ran, fake.printed, strict=True) if p]
    assert printed == [c for c in fake.ran if c.startswith("systemd-run ")]
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
    assert executed(fake, warmup.caches_warmed, PROFILE, LAUNCH, RELEASE, 1800) == [True]
    assert not any(c.startswith("install -d") for c in fake.ran)
    assert any("failed: the precompile exited with status 1" in s for s in fake.said)
    assert any("RuntimeError: CUDA error" in s for s in fake.said)


ENV_FILE = "/etc/sglang/sglang-warmup-0.env"


def test_the_warm_up_runs_in_the_service_units_sandbox_answering_this_host_alone(
        use: Callable[..., Any]) -> None:
    """Every hardening line of the rendered sglang.service is a property of the warm-up's
    unit, with an IP allow-list of localhost alone; no environment on its command line."""
    fake = use(WarmHost(facts(running(OLD, LAUNCH.argv[3:]))))
    executed(fake, warmup.caches_warmed, PROFILE, LAUNCH, RELEASE, 1800)
    words = fake.warm_up_words()
    properties = [w.removeprefix("--property=") for w in words if w.startswith("--property=")]
    unit = [line for line in server_unit("plain", "plain").splitlines()
            if line and not line.startswith("#")]
    hardening = unit[unit.index("DevicePolicy=closed"):unit.index("UMask=0027") + 1]
    assert len(hardening) > 20 and all(line in properties for line in hardening)
    for line in ("NoNewPrivileges=yes", "ProtectSystem=strict", "CapabilityBoundingSet=",
                 "ReadWritePaths=/var/lib/sglang/state /var/cache/sglang",
                 "IPAddressAllow=localhost", "IPAddressDeny=any", f"EnvironmentFile={ENV_FILE}"):
        assert line in properties
    assert not any(w.startswith(("--setenv", "-E")) for w in words)


def written_env(fake: WarmHost) -> str:
    [(command, text)] = fake.stdin.items()
    assert f"cat > {ENV_FILE}.sglang-fleet-new" in command and "chmod 600" in command
    return text


def test_the_warm_up_has_one_off_keys_in_a_root_only_file_never_on_a_command_line(
        use: Callable[..., Any]) -> None:
    fake = use(WarmHost(facts(running(OLD, LAUNCH.argv[3:]))))
    executed(fake, warmup.caches_warmed, PROFILE, LAUNCH, RELEASE, 1800)
    text = written_env(fake)
    env = dict(line.split("=", 1) for line in text.splitlines() if not line.startswith("#"))
    key, admin = env["SGLANG_API_KEY"].strip("'"), env["SGLANG_ADMIN_API_KEY"].strip("'")
    assert len(key) == len(admin) == 64 and key != admin
    assert env["CUDA_VISIBLE_DEVICES"] == "'1'" and env["HOME"] == "'/var/lib/sglang/state'"
    assert not any(key in c or admin in c for c in fake.ran)
    # written before the warm-up, removed after it
    assert fake.ran[1].startswith("systemd-run ") and fake.ran[2] == f"rm -f {ENV_FILE}"
    again = use(WarmHost(facts(running(OLD, LAUNCH.argv[3:]))))
    executed(again, warmup.caches_warmed, PROFILE, LAUNCH, RELEASE, 1800)
    assert key not in written_env(again)


def test_a_failed_warm_up_removes_its_keys_too(use: Callable[..., Any]) -> None:
    result = {"mode": "full", "ok": False, "error": "the warm-up server exited"}
    fake = use(WarmHost(facts(running(OLD, LAUNCH.argv[3:])), result))
    executed(fake, warmup.caches_warmed, PROFILE, LAUNCH, RELEASE, 1800)
    assert fake.ran[-1] == f"rm -f {ENV_FILE}"


@pytest.mark.parametrize("text", HOSTILE)
def test_hostile_environment_values_stay_literal_in_the_env_file(
        use: Callable[..., Any], text: str) -> None:
    launch = dataclasses.replace(LAUNCH, env={**LAUNCH.env, "X": text})
    fake = use(WarmHost(facts(running(OLD, launch.argv[3:]))))
    executed(fake, warmup.caches_warmed, PROFILE, launch, RELEASE, 1800)
    if CONTROL.search(text):  # refused, said, nothing run
        assert fake.ran == [] and any("control character" in s for s in fake.said)
        return
    lines = written_env(fake).splitlines()
    assert env_line("X", text) in lines and len(lines) == len(warmup.warm_env(LAUNCH, [1])
                                                               .splitlines()) + 1
    assert not any("X=" in w for w in fake.warm_up_words())  # the file's alone


def test_the_key_ignores_port_host_and_gpus_but_not_flags() -> None:
    two = render(PROFILE, instance=0)
    key = warmup.warm_key(two, RELEASE, "compile")
    argv = list(two.argv)
    argv[argv.index("--port") + 1] = "31999"
    moved = Launch(two.version, tuple(argv), {**two.env, "CUDA_VISIBLE_DEVICES": "3"})
    assert warmup.warm_key(moved, RELEASE, "compile") == key
    assert warmup.warm_key(two, OLD, "compile") != key
    assert warmup.warm_key(two, RELEASE, "full") != key


# The host program, with stand-ins for a release's entry points: keys as SGLang takes them
# (``--api-key`` guards every endpoint but /health*), the precompile's requests keyless.
ENTRY = textwrap.dedent('''
    import http.server, sys, time
    args = sys.argv[1:]
    def flag(name):
        return ([args[i + 1] for i, a in enumerate(args) if a == name] or [None])[-1]
    port, key, admin = int(flag("--port")), flag("--api-key"), flag("--admin-api-key")
    print("argv:", *args, flush=True)
    print("keys:", *[n for n, k in (("api", key), ("admin", admin)) if k], flush=True)
    if key and key.encode() in open("/proc/self/cmdline", "rb").read():
        print("a key is on the command line", flush=True)
    if "--fail" in args:
        print("RuntimeError: CUDA error", flush=True); sys.exit(3)
    if "--smg-grpc-mode" in args:    # no HTTP to ask
        print("gRPC server listening", flush=True); time.sleep(60); sys.exit(4)
    if "--timeout" in args:          # the precompile: asks its own server without a key
        if key:
            print("Sync request failed: Unauthorized", flush=True); sys.exit(5)
        print("Compiling DeepGEMM kernels", flush=True); sys.exit(0)
    class H(http.server.BaseHTTPRequestHandler):
        def _answer(self):
            allowed = self.path.startswith("/health") or not key or \\
                self.headers.get("Authorization") == f"Bearer {key}"
            self.send_response(200 if allowed else 401); self.end_headers()
            self.wfile.write(b"{}")
        do_GET = do_POST = _answer
        def log_message(self, *a): pass
    print("The server is fired up and ready to roll!", flush=True)
    http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
''')
KEYS = {"SGLANG_API_KEY": "client" * 6, "SGLANG_ADMIN_API_KEY": "admin" * 8}


def run_program(tmp_path: Path, *args: str,
                env: dict[str, str] | None = None) -> tuple[int, dict[str, Any], str]:
    (tmp_path / "entry.py").write_text(ENTRY)
    argv = [sys.executable, "-m", "sglang_fleet.stages.warmup.host.warm_caches", "--python",
            sys.executable, "--module", "entry", "--port", str(free_port()), "--timeout", "30",
            *args]
    path = f"{tmp_path}:{Path(warm_caches.__file__).parents[4]}"
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120,
                          env={"PYTHONPATH": path, **(env or {})})
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


def test_program_full_hands_the_keys_in_process_and_asks_with_the_client_key(
        tmp_path: Path) -> None:
    code, result, out = run_program(tmp_path, "--mode", "full", "--", "--model-path", "/m",
                                    env=KEYS)
    assert code == 0 and result["ok"], out
    assert "keys: api admin" in out and "on the command line" not in out
    assert "--api-key <redacted> --admin-api-key <redacted>" in out  # masked as it prints
    assert not any(key in out for key in KEYS.values())


def test_program_compile_gets_the_admin_key_alone(tmp_path: Path) -> None:
    """SGLang's precompile asks its own server without a key: a client key would stop it."""
    code, result, out = run_program(tmp_path, "--mode", "compile", "--", "--model-path", "/m",
                                    env=KEYS)
    assert code == 0 and result["ok"], out
    assert "keys: admin\n" in out.replace("warm-up: ", "")


def test_program_reports_a_failing_entry_point(tmp_path: Path) -> None:
    code, result, _ = run_program(tmp_path, "--mode", "full", "--", "--fail")
    assert code == 1 and not result["ok"]
    assert "exited with status 3" in result["error"] and "RuntimeError: CUDA error" in \
        result["tail"]
