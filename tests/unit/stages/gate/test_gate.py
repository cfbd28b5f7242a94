"""The gate's and the weights stage's operations in pyinfra's style: facts (and what the host
program answers) in, commands out; a host in the wanted state gets no command and a noop."""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable
from typing import Any

import pytest
from pyinfra.connectors.util import CommandOutput, OutputLine

from sglang_fleet import ops
from sglang_fleet.config.render import Launch, render, render_all
from sglang_fleet.ops.host_programs import program
from sglang_fleet.ops.live import LiveCommand
from sglang_fleet.paths import (
    AWS_CREDENTIALS,
    CURRENT,
    LAST_GOOD,
    RELEASES,
    TOOLS,
    env_file,
    gate_record,
    unit_path,
)
from sglang_fleet.remote import eta
from sglang_fleet.stages.engine.deploy import Release
from sglang_fleet.stages.gate import deploy as gate
from sglang_fleet.stages.gate import program as checker
from sglang_fleet.stages.gate.program import GateResult
from sglang_fleet.stages.service import deploy as service
from sglang_fleet.stages.service import last_good
from sglang_fleet.stages.service.units import start_command
from sglang_fleet.stages.weights import deploy as weights
from sglang_fleet.stages.weights.host.download_model import MANIFEST
from tests.conftest import field_profile
from tests.fakes import Host, commands

UNIT = "sglang.service"
SAVED = f"{LAST_GOOD}/{UNIT}"
OLD, NEW = f"{RELEASES}/sglang-0.5.22-aaaa", f"{RELEASES}/sglang-0.5.23-bbbb"


class GateHost(Host):
    """A host whose gate program passes or fails with ``error``."""

    def __init__(self, facts: dict[str, Any], error: str | None = None,
                 shell: dict[str, list[str]] | None = None,
                 measured: dict[str, Any] | None = None) -> None:
        super().__init__(facts, shell)
        self.error = error
        self.measured = measured
        self.ran: list[str] = []

    def run_shell_command(self, command: str, **kwargs: Any) -> tuple[bool, CommandOutput]:
        if "sglang_fleet.stages.gate.host.check_server" not in command:
            return super().run_shell_command(command, **kwargs)
        self.ran.append(command)
        result = {"ok": self.error is None, "error": self.error,
                  "serving": {"version": "0.5.22", "model_path": "/m"},
                  **({"measured": self.measured} if self.measured else {})}
        lines = ["health: /health_generate 200", f"GATE {json.dumps(result)}"]
        return self.error is None, CommandOutput([OutputLine("stdout", x) for x in lines])


class Executing:
    is_executing = True


def sums(**by_path: str | None) -> Callable[..., str | None]:
    """A Sha256File fact: the checksum of each path given, None for any other."""
    return lambda path: by_path.get(path)


def files(*present: str) -> Callable[..., dict[str, Any] | None]:
    return lambda path: {"mode": 600} if path in present else None


@pytest.fixture
def use(monkeypatch: pytest.MonkeyPatch) -> Callable[[Host], Host]:
    monkeypatch.setattr(gate, "state", Executing())
    monkeypatch.setattr(gate, "logger", type("L", (), {"warning": print, "info": print})())

    def install(fake: Host) -> Host:
        for module in (checker, gate, last_good, ops, service, weights):
            monkeypatch.setattr(module, "host", fake, raising=False)
        return fake

    return install


@pytest.fixture(scope="module")
def launch() -> Launch:
    return render(field_profile(gpus=1))  # one server: sglang.service


def run_gate(launch: Launch, result: GateResult) -> list[Any]:
    return commands(gate.gate, field_profile(gpus=1), launch, 60, "", result)


def test_a_passing_gate_keeps_its_release_as_the_last_good_once(
        use: Callable[[Host], Host], launch: Launch) -> None:
    env = env_file(UNIT)
    keyless = sums(**{env: "e"})  # its environment without the keys (test_last_good)
    use(GateHost({"Sha256File": sums(**{unit_path(UNIT): "u2", SAVED: "u1", env: "ek",
                                        f"{SAVED}.env": "e"}), "KeylessSha256": keyless}))
    result = GateResult()
    assert run_gate(launch, result) == [last_good.keep_command(UNIT)]
    assert last_good.keep_command(UNIT).startswith(
        f"umask 077 && install -d -m 700 {LAST_GOOD} && cp -p {unit_path(UNIT)} {SAVED} && ")
    assert not result.failed()
    fake = use(GateHost({"Sha256File": sums(**{unit_path(UNIT): "u", SAVED: "u", env: "ek",
                                               f"{SAVED}.env": "e"}), "KeylessSha256": keyless}))
    assert run_gate(launch, result) == []
    assert fake.noops == [f"{UNIT} passed the gate and is the last good release already"]


def test_the_gate_runs_check_server_with_the_system_python(
        use: Callable[[Host], Host], launch: Launch) -> None:
    fake = use(GateHost({"Sha256File": sums()}))
    run_gate(launch, GateResult())
    [command] = fake.ran  # type: ignore[attr-defined]
    assert shlex.split(command)[:5] == program("python3", checker.CHECKER)


def test_the_gate_keeps_its_record_and_the_host_line_sums_every_unit(
        use: Callable[[Host], Host], launch: Launch, capsys: pytest.CaptureFixture[str]) -> None:
    """Each unit's gate writes its GateResult when it runs; the host's line, built before any of
    them ran, reads all of them after the last one."""
    results = []
    for i, tps in enumerate((5000.0, 7000.0, None)):  # the third soak was disabled
        soak = {"tokens_per_s": tps} if tps else None
        fake = use(GateHost({"Sha256File": sums()}, measured=eta.record(
            f"sglang-{i}.service", f"inv{i}", "0.5.23", f"2026-07-01T10:0{i}:00Z", 48, soak,
            {"tokens_per_s": 140.0})))
        results.append(GateResult())
        run_gate(launch, results[-1])
        [command] = fake.ran  # type: ignore[attr-defined]
        assert shlex.split(command)[-2:] == ["--record", gate_record(UNIT)]
    assert results[1].measured and results[1].measured["tokens_per_s"] == 7000.0
    units = [f"sglang-{i}.service" for i in range(3)]
    assert commands(gate.host_capacity, units, results, "900000,1000") == []
    out = capsys.readouterr().out.splitlines()
    assert "[h1] host: 144 running requests on 3 of 3 servers (each server's effective max " \
        "running requests, from its startup log)" in out
    assert "[h1] host: 12,000 output tok/s, the sum of 2 of 3 servers' measured throughput " \
        "(from this run's gate soaks at 2026-07-01T10:00:00Z … 2026-07-01T10:01:00Z)" in out
    assert any(line.startswith("[h1] host: job 900,000 completions x 1,000 tokens: about "
                               "20.8 h at the measured 12,000 output tok/s") for line in out)
    assert any(line.startswith("[h1] host: not counted: sglang-2.service (in the capacity, not "
                               "the throughput") for line in out)


def test_a_failed_gate_leaves_the_restore_to_the_next_operation(
        use: Callable[[Host], Host], launch: Launch) -> None:
    fake = use(GateHost({"File": files(SAVED)}, error="soak: 3 of 32 failed"))
    result = GateResult()
    assert run_gate(launch, result) == []
    assert result.failed() and result.error == "soak: 3 of 32 failed"
    assert "the next operation puts the last good release back" in fake.noops[0]


def test_a_failed_gate_without_a_last_good_release_fails_at_once(
        use: Callable[[Host], Host], launch: Launch) -> None:
    use(GateHost({"File": files()}, error="sglang.service failed to start: boom"))
    result = GateResult()
    [command] = run_gate(launch, result)
    assert "error: sglang.service failed to start: boom (no earlier good release to return " \
           "to)" in shlex.split(command)[1]
    assert not result.failed()


def test_gate_failed_says_what_serves_after_the_restore(
        use: Callable[[Host], Host], launch: Launch) -> None:
    use(GateHost({"PortListeners": []}))
    passed = GateResult()
    assert commands(gate.restored, field_profile(gpus=1), launch, 60, passed) == []
    assert commands(gate.gate_failed, launch, passed) == [] and passed.serving == ""
    result = GateResult("soak: 3 of 32 failed")
    assert commands(gate.restored, field_profile(gpus=1), launch, 60, result) == []
    [command] = commands(gate.gate_failed, launch, result)
    assert ("error: soak: 3 of 32 failed; the last good release serves again (sglang.service "
            "alone on port 30000, /health_generate 200, /server_info: SGLang 0.5.22") in command



class TogetherHost(GateHost):
    """A host whose check_servers answers for each server it is given: ``failing`` units'
    checks fail, the last one's output is cut short (no CHECKED line) when ``cut``."""

    def __init__(self, failing: tuple[str, ...] = (), cut: bool = False) -> None:
        super().__init__({"Sha256File": sums(), "File": lambda path: {"mode": 600}})
        self.failing, self.cut = failing, cut

    def run_shell_command(self, command: str, **kwargs: Any) -> tuple[bool, CommandOutput]:
        if "sglang_fleet.stages.gate.host.check_servers" not in command:
            return super().run_shell_command(command, **kwargs)
        self.ran.append(command)
        lines = []
        for argv in json.loads(shlex.split(command)[-1]):
            unit = argv[argv.index("--unit") + 1]
            error = f"{unit}: soak: 1 of 32 failed" if unit in self.failing else None
            lines += [f"health: {unit}", f"GATE {json.dumps({'ok': not error, 'error': error})}",
                      f"CHECKED {json.dumps({'unit': unit, 'exit': 1 if error else 0})}"]
        out = [OutputLine("stdout", x) for x in lines[:-1 if self.cut else None]]
        return True, CommandOutput(out + [OutputLine("stderr", "Killed")] * self.cut)


@pytest.mark.parametrize("cut", [False, True])
def test_a_hosts_servers_are_checked_at_once_and_each_gate_judges_its_own(
        use: Callable[[Host], Host], monkeypatch: pytest.MonkeyPatch, cut: bool) -> None:
    """One check_servers call runs every server's full checks; each server's gate then judges
    what was found for it, without running check_server again (a gate after a sized restart
    does: the check is used once). A cut-short output fails the server it left unfinished."""
    monkeypatch.setattr(checker, "state", Executing())
    profile = field_profile(gpus=3)
    launches = render_all(profile)
    fake = use(TogetherHost(failing=("sglang-1.service",), cut=cut))
    results = [GateResult() for _ in launches]
    assert commands(checker.check_together, profile, launches, "", None, 600, results) == []
    [command] = fake.ran  # type: ignore[attr-defined]
    argv = shlex.split(command)
    assert argv[:5] == program("python3", checker.TOGETHER) and argv[5] == "--servers"
    assert json.loads(argv[6]) == [checker.arguments(
        profile, launch, *checker.gate_flags(profile, launch, "", None), budget=600)
        for launch in launches]
    assert [r.checked and r.checked[0] for r in results] == [True, False, not cut]
    for launch, result in zip(launches, results, strict=True):
        commands(gate.gate, profile, launch, 600, "", result)
        assert result.checked is None
    assert len(fake.ran) == 1  # type: ignore[attr-defined]
    assert [r.error for r in results] == [
        None, "sglang-1.service: soak: 1 of 32 failed",
        "the checks of sglang-2.service ended before they said whether it passed "
        "(check_servers cut short: Killed)" if cut else None]
    commands(gate.gate, profile, launches[0], 600, "", results[0])  # checks anew
    assert len(fake.ran) == 2  # type: ignore[attr-defined]
    assert "sglang_fleet.stages.gate.host.check_server " in fake.ran[-1]  # type: ignore[attr-defined]


def test_restore_unit_puts_back_the_unit_and_the_current_link(
        use: Callable[[Host], Host]) -> None:
    env = env_file(UNIT)
    facts = {"File": files(SAVED, f"{SAVED}.env"),
             "Sha256File": sums(**{unit_path(UNIT): "u2", SAVED: "u1", f"{SAVED}.env": "e"}),
             "KeylessSha256": sums(**{env: "e"}),
             "FindInFile": [f"ExecStart=/usr/bin/env PYTHONPATH=x {OLD}/bin/python -m y"],
             "Link": {"link_target": NEW}}
    use(Host(facts))
    assert commands(last_good.restore_unit, UNIT) == [
        f"{last_good._copy_back_command(UNIT)} && {start_command(UNIT)}",
        f"ln -sfn {OLD} {CURRENT}.new && mv -T {CURRENT}.new {CURRENT}"]


def test_restore_unit_starts_only_a_stopped_unit(use: Callable[[Host], Host]) -> None:
    env = env_file(UNIT)
    facts = {"File": files(SAVED, f"{SAVED}.env"),
             "Sha256File": sums(**{unit_path(UNIT): "u", SAVED: "u", f"{SAVED}.env": "e"}),
             "KeylessSha256": sums(**{env: "e"}),
             "FindInFile": [f"ExecStart={OLD}/bin/python"], "Link": {"link_target": OLD}}
    fake = use(Host({**facts, "UnitCondition": {"ActiveState": "active"}}))
    assert commands(last_good.restore_unit, UNIT) == []
    assert fake.noops == [f"{UNIT} runs its last good release"]
    use(Host({**facts, "UnitCondition": {"ActiveState": "failed", "Result": "exit-code"}}))
    assert commands(last_good.restore_unit, UNIT) == [start_command(UNIT)]
    use(Host({"File": files(SAVED)}))
    [command] = commands(last_good.restore_unit, UNIT)
    assert "nothing to go back to" in command


def test_tools_venv_syncs_the_shipped_lock_unless_synced(use: Callable[[Host], Host]) -> None:
    locked = weights.tools_lock_sha256()
    installed = sums(**{weights.HOST_TOOLS_INSTALLED: locked})
    fake = use(Host({"PythonImports": True, "Sha256File": installed}))
    assert commands(weights.tools_venv) == []
    assert fake.noops == [f"{weights.TOOLS_PYTHON} imports boto3, huggingface_hub at the "
                          "locked versions"]
    for facts in ({"PythonImports": False, "Sha256File": installed},
                  {"PythonImports": True, "Sha256File": sums()},  # an unpinned venv of before
                  {"PythonImports": True, "Sha256File": sums(**{
                      weights.HOST_TOOLS_INSTALLED: "0" * 64})}):  # an older lock
        use(Host(facts))
        venv, install = commands(weights.tools_venv)
        assert venv.endswith(f"venv --quiet --allow-existing --python /usr/bin/python3 "
                             f"{TOOLS}")
        words = shlex.split(install)
        assert words[words.index("sync") - 1:words.index("&&")] == [
            "pip", "sync", "--quiet", "--require-hashes", "--no-build", "--python",
            weights.TOOLS_PYTHON, weights.HOST_TOOLS_LOCK]
        assert "boto3" not in install  # nothing but the lock names a package
        assert words[-3:] == ["cp", weights.HOST_TOOLS_LOCK, weights.HOST_TOOLS_INSTALLED]


def manifest_of(dest: str, source: str | None) -> Callable[..., list[str] | None]:
    """A FindInFile fact: DEST's manifest recording SOURCE (None: no manifest)."""
    def find(path: str, pattern: str) -> list[str] | None:
        assert path == f"{dest}/{MANIFEST}" and pattern == '^ "source": '
        return None if source is None else [f' "source": {json.dumps(source)},']
    return find


def test_staged_runs_the_downloader_unless_the_manifest_is_there(
        use: Callable[[Host], Host]) -> None:
    dest = "/var/lib/sglang/models/q"
    fake = use(Host({"FindInFile": manifest_of(dest, "s3://m/q")}))
    assert commands(weights.staged, "s3://m/q", dest, None, None) == []
    assert fake.noops == [f"{dest} holds a staged model of s3://m/q (its {MANIFEST})"]
    use(Host({"FindInFile": manifest_of(dest, "s3://m/q/")}))  # as an earlier release wrote it
    assert commands(weights.staged, "s3://m/q", dest, None, None) == []
    use(Host({"FindInFile": manifest_of(dest, None)}))
    [command] = commands(weights.staged, "s3://m/q", dest, "http://s3:9000", None)
    assert isinstance(command, LiveCommand)  # its progress lines shown as they come
    assert shlex.split(str(command)) == [
        f"AWS_SHARED_CREDENTIALS_FILE={AWS_CREDENTIALS}",
        *program(weights.TOOLS_PYTHON, weights.DOWNLOADER, "s3://m/q", dest, "--endpoint-url",
                 "http://s3:9000")]


def test_staged_again_when_the_manifest_records_another_source(
        use: Callable[[Host], Host]) -> None:
    """A directory whose manifest records another source holds weights of that source: the
    deploy runs the downloader (which stages again), never passes them off as this source's."""
    dest = "/var/lib/sglang/models/org--model--v1"
    use(Host({"FindInFile": manifest_of(dest, "hf://org/model@v1")}))
    [command] = commands(weights.staged, "s3://org/model/v1", dest, None, None,
                         "/var/lib/sglang/models/old")
    assert shlex.split(str(command))[1:] == program(
        weights.TOOLS_PYTHON, weights.DOWNLOADER, "s3://org/model/v1", dest, "--reuse",
        "/var/lib/sglang/models/old")


def test_a_changed_source_names_the_served_directory_and_the_restart(
        use: Callable[[Host], Host]) -> None:
    old = render(field_profile({"model.source": "hf://org/model@v1"}, gpus=1))
    new = field_profile({"model.source": "s3://org/model/v1"}, gpus=1)
    line = f"ExecStart={service.exec_start(old, Release('p', '1', (), None, None, 'py'))}"
    use(Host({"FindInFile": lambda path, pattern: [line] if path == unit_path(UNIT) else None}))
    served = weights.served_model(new)
    assert served == old.args["model_path"]
    dest = render(new).args["model_path"]
    assert dest != served
    assert weights.stage_name("s3://org/model/v1", dest, served) == (
        f"Stage s3://org/model/v1 (the model source changed: the server ran {served}; it "
        f"restarts onto {dest})")
    assert weights.stage_name("s3://org/model/v1", dest, dest) == "Stage s3://org/model/v1"


class ForgedHost(GateHost):
    """A host whose gate program quotes a server that forges lines: escapes in a journal line
    it prints, in its error and in the version /server_info names."""

    def run_shell_command(self, command: str, **kwargs: Any) -> tuple[bool, CommandOutput]:
        if "sglang_fleet.stages.gate.host.check_server" not in command:
            return super().run_shell_command(command, **kwargs)
        self.ran.append(command)
        back = "--health-only" in command  # the restored release answers
        result = {"ok": back, "error": None if back else self.error,
                  "serving": {"version": "0.5.22\x1b[2K", "model_path": "/m"}}
        lines = ["journal: \x1b[1A\x1b[2K\rforged", f"GATE {json.dumps(result)}"]
        return back, CommandOutput([OutputLine("stdout", x) for x in lines])


def test_the_gate_shows_what_the_host_said_with_its_escapes(
        use: Callable[[Host], Host], launch: Launch, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(checker, "logger", type("L", (), {"info": print})())
    use(ForgedHost({"File": files(SAVED), "PortListeners": []},
                   error="sglang.service failed to start: \x1b[2K\rScheduler hit an exception"))
    result = GateResult()
    assert run_gate(launch, result) == []
    assert "journal: \\x1b[1A\\x1b[2K\\x0dforged" in capsys.readouterr().out
    assert result.error == "sglang.service failed to start: \\x1b[2K\\x0dScheduler hit an " \
                           "exception"
    assert commands(gate.restored, field_profile(gpus=1), launch, 60, result) == []
    assert "/server_info: SGLang 0.5.22\\x1b[2K, model /m" in result.serving
