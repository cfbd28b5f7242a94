"""memory.target_running_requests in the deploy's operations, pyinfra's way: facts and what
the gate program answers in, commands out. The gate short of the target asks for one sized
restart (never twice), the restart writes the service stage's own unit with the size, the
size that passed is remembered and read back before the next deploy renders."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import pytest
from pyinfra.api.command import FileUploadCommand
from pyinfra.connectors.util import CommandOutput, OutputLine
from pyinfra.operations import files

from sglang_fleet import ops
from sglang_fleet.config import sizing
from sglang_fleet.config.render import Launch, render
from sglang_fleet.facts.nvidia import Gpu, SmiReport
from sglang_fleet.paths import LAST_GOOD, SIZING, unit_path
from sglang_fleet.remote import capacity
from sglang_fleet.stages.gate import deploy as gate
from sglang_fleet.stages.gate import resize
from sglang_fleet.stages.gate.program import GateResult
from sglang_fleet.stages.service import deploy as service
from sglang_fleet.stages.service import last_good, units
from tests.fakes import RELEASE, Host, commands
from tests.unit.config.test_sizing import sim_flags, target_profile
from tests.unit.remote.test_capacity import field_0_5_12
from tests.unit.remote.test_capacity_sim import startup_log

UNIT = "sglang-0.service"  # the first of the shipped profile's eight servers
SAVED = f"{LAST_GOOD}/{UNIT}"
SMI = SmiReport(tuple(Gpu(i, "NVIDIA B200", 183359, "580.95.05", "10.0", True)
                      for i in range(8)), None)


class TargetHost(Host):
    """A host whose gate program passes with the capacity of ``cap`` (a parsed log)."""

    data: ClassVar[dict[str, Any]] = {}

    def __init__(self, cap: capacity.Capacity, facts: dict[str, Any] | None = None) -> None:
        super().__init__({"NvidiaSmi": SMI, **(facts or {})})
        self.cap = cap
        self.ran: list[str] = []

    def get_temp_filename(self, dest: str, temp_directory: str | None = None) -> str:
        return f"/tmp/upload-{Path(dest).name}"

    def run_shell_command(self, command: str, **kwargs: Any) -> tuple[bool, CommandOutput]:
        if "sglang_fleet.stages.gate.host.check_server" not in command:
            return super().run_shell_command(command, **kwargs)
        self.ran.append(command)
        result = {"ok": True, "capacity": self.cap.as_json()}
        return True, CommandOutput([OutputLine("stdout", f"GATE {json.dumps(result)}")])


class Executing:
    is_executing = True
    inventory = None  # what files.template hands its templates
    config = type("Config", (), {"DIFF": False})()
    cwd = None


@pytest.fixture
def use(monkeypatch: pytest.MonkeyPatch) -> Callable[[Host], Host]:
    monkeypatch.setattr(gate, "state", Executing())
    monkeypatch.setattr(files, "state", Executing())  # the operations resize yields from
    quiet = type("L", (), {"warning": print, "info": print})()
    for module in (gate, resize):
        monkeypatch.setattr(module, "logger", quiet)

    def install(fake: Host) -> Host:
        for module in (gate, last_good, ops, service, resize, files):
            monkeypatch.setattr(module, "host", fake, raising=False)
        return fake

    return install


@pytest.fixture(scope="module")
def seed_log(tmp_path_factory: pytest.TempPathFactory) -> capacity.Capacity:
    """The simulator's 0.5.23 start with the seed's 24 slots: 4 running requests."""
    mp = pytest.MonkeyPatch()
    try:
        lines = startup_log("0.5.23", sim_flags(first(), "--max-mamba-cache-size", "24"),
                            tmp_path_factory.mktemp("seed"), mp)
    finally:
        mp.undo()
    return capacity.parse(lines, "0.5.23")


def first() -> Launch:
    return render(sizing.apply(target_profile("0.5.23"), None))


def run_gate(result: GateResult, final: bool) -> list[Any]:
    return commands(gate.gate, sizing.apply(target_profile("0.5.23"), None), first(), 60, "",
                    result, final=final)


def sums(**by_path: str) -> Callable[..., str | None]:
    return lambda path: by_path.get(path)


def test_a_first_gate_short_of_the_target_asks_for_one_sized_restart(
        use: Callable[[Host], Host], seed_log: capacity.Capacity) -> None:
    fake = TargetHost(seed_log)
    use(fake)
    result = GateResult()
    assert run_gate(result, final=False) == []  # not kept as the last good release
    assert result.resize == 240 and result.resizing() and not result.failed()
    assert "--target 48" in fake.ran[0]  # the advice aims at the target
    assert fake.noops == [f"{UNIT} passed the gate short of its target: the next operation "
                          "restarts it with --max-mamba-cache-size 240"]


def test_the_gate_after_the_sized_restart_fails_short_of_the_target(
        use: Callable[[Host], Host], seed_log: capacity.Capacity) -> None:
    use(TargetHost(seed_log, {"File": lambda path: {"mode": 600} if path == SAVED else None}))
    result = GateResult(resize=240)
    assert run_gate(result, final=True) == []
    assert result.failed() and not result.resizing()
    assert result.error == (f"{UNIT}: with --max-mamba-cache-size 240, max running requests is "
                            "4 (from the log), below memory.target_running_requests 48, and a "
                            "deploy restarts a server at most once to size it")


def test_a_target_that_cannot_fit_fails_the_first_gate_with_its_reason(
        use: Callable[[Host], Host]) -> None:
    use(TargetHost(capacity.parse(field_0_5_12(), "0.5.12"),
                   {"File": lambda path: {"mode": 600} if path == SAVED else None}))
    result = GateResult()
    assert run_gate(result, final=False) == []
    assert result.resize is None and result.failed()
    assert "GiB short. Levers: memory.mem_fraction_static" in (result.error or "")


def test_a_gate_that_reaches_the_target_keeps_its_release(
        use: Callable[[Host], Host], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sized = render(sizing.apply(target_profile("0.5.23"), 240))
    cap = capacity.parse(startup_log("0.5.23", sim_flags(sized), tmp_path, monkeypatch), "0.5.23")
    use(TargetHost(cap, {"Sha256File": sums(**{unit_path(UNIT): "u2", SAVED: "u1"})}))
    result = GateResult(resize=240)
    assert run_gate(result, final=True) == [last_good.keep_command(UNIT)]
    assert result.resizing()  # the size passed: remember_size runs next


def test_the_sized_restart_writes_the_service_stages_unit_with_the_size(
        use: Callable[[Host], Host], seed_log: capacity.Capacity) -> None:
    use(TargetHost(seed_log))
    profile = sizing.apply(target_profile("0.5.23"), None)
    out = commands(resize.sized_restart, profile, first(), RELEASE, GateResult(resize=240))
    [upload] = [c for c in out if isinstance(c, FileUploadCommand)]
    assert upload.dest == unit_path(UNIT)
    text = upload.src.read() if hasattr(upload.src, "read") else Path(upload.src).read_text()
    sized = render(sizing.apply(target_profile("0.5.23"), 240))
    assert service.exec_start(sized, RELEASE) in text and "--max-mamba-cache-size 240" in text
    assert out[-2:] == ["systemctl daemon-reload", units.start_command(UNIT)]
    assert commands(resize.sized_restart, profile, first(), RELEASE, GateResult()) == []


def test_the_size_that_passed_is_remembered_and_rendered_by_the_next_deploy(
        use: Callable[[Host], Host], seed_log: capacity.Capacity) -> None:
    use(TargetHost(seed_log))
    profile = sizing.apply(target_profile("0.5.23"), None)
    out = commands(resize.remember_size, profile, first(), GateResult(resize=240))
    [upload] = [c for c in out if isinstance(c, FileUploadCommand)]
    digest = sizing.key(first(), 183359)
    assert upload.dest == f"{SIZING}/{digest}.json"
    assert not isinstance(upload.src, str)
    record = upload.src.read()
    assert json.loads(record)["max_mamba_cache_size"] == 240
    # The next deploy: the record read back as a fact, before anything renders.
    use(TargetHost(seed_log, {"RememberedSize": lambda digest: record if digest ==
                              sizing.key(first(), 183359) else None}))
    resolved = resize.with_remembered_size(target_profile("0.5.23"))
    assert render(resolved).args["max_mamba_cache_size"] == 240
    # Another GPU memory is another key: SGLang sizes the first start again.
    other = SmiReport(tuple(Gpu(i, "NVIDIA H100", 81559, "580", "9.0", True) for i in range(8)),
                      None)
    use(TargetHost(seed_log, {"NvidiaSmi": other, "RememberedSize": lambda digest: record
                              if digest == sizing.key(first(), 183359) else None}))
    assert resize.with_remembered_size(target_profile("0.5.23")).memory.max_mamba_cache_size \
        is None
    # A host without nvidia-smi yet (before the driver stage): no record is looked up.
    use(TargetHost(seed_log, {"NvidiaSmi": SmiReport((), "nvidia-smi is not installed")}))
    assert resize.with_remembered_size(target_profile("0.5.23")).memory.max_running_requests \
        == 48
