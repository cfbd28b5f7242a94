"""The cutover's one seam: every command that disturbs a host's servers goes through
``cutover.disrupt``, so in a roll the host (or, with --batch-instances, those servers) is out
of every router before it runs.

Each operation that may disturb the servers is built here with the fake host (facts in,
commands out) in a roll, in the branch where it does; every command that matches a disruptive
pattern (``DISRUPTIONS``, read off the stages' commands) must come after a leave that covers
it. Every operation of the product is either driven here or named calm with the reason, so a
new operation cannot slip past; and no stage calls ``leave_routers`` itself."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

import pytest
from pyinfra.api.command import FunctionCommand, StringCommand
from pyinfra.operations import files

import sglang_fleet
from sglang_fleet import ops, paths
from sglang_fleet.config.render import Launch, render
from sglang_fleet.facts.nvidia import Gpu, LoadedModule, SmiReport
from sglang_fleet.facts.ports import Listener
from sglang_fleet.fleet import cutover, roll_directory
from sglang_fleet.hostconfig import HostConfig
from sglang_fleet.ops import packages, secretfile
from sglang_fleet.stages.driver import deploy as driver
from sglang_fleet.stages.gate import resize
from sglang_fleet.stages.gate.program import GateResult
from sglang_fleet.stages.service import deploy as service
from sglang_fleet.stages.service import group_restart, last_good, units
from tests.conftest import field_profile
from tests.fakes import RELEASE, Host, commands, driver_host

# --- what disturbs the servers, and the check --------------------------------------------------

HOST = frozenset({"*"})  # a leave of the whole host


@dataclass(frozen=True)
class Disruption:
    """A command that disturbs the servers: its pattern (on the command without quoted text
    or comments), what must be out before it (``host``: the host whole; ``unit``: the server
    unit it names, or the host; ``server``: some server of the host) and why."""

    pattern: str
    scope: str
    what: str


SERVER = rf"(?P<unit>{paths.SERVER_UNIT_PATTERN})(?![\w.-])"  # never the router's own unit
PACKAGES = (r"\b(?:apt-get|apt|aptitude|dpkg)\b[^;&|]*\s"
            r"(?:install|reinstall|remove|purge|-i|-r|-P)\s[^;&|]*")  # a package change
DISRUPTIONS = (
    # service.unit_started, last_good.restore_unit, resize.sized_restart (start_command)
    Disruption(rf"\bsystemctl\s+(?:restart|start|stop|kill|try-restart|reload-or-restart)\s+"
               rf"{SERVER}", "unit", "a server (re)started, stopped or killed"),
    # service.retire_other_units (a server the profile no longer runs)
    Disruption(rf"\bsystemctl\s+(?:disable|mask)\s+--now\s+{SERVER}", "unit",
               "a server stopped for good"),
    # service.stale_servers_stopped (whatever else holds a server's port)
    Disruption(r"\b(?:kill|pkill|killall)\s+-(?:TERM|KILL|INT|HUP|9|15|2|1)\b", "server",
               "a process on a server's port killed"),
    # driver.load_driver (driver.reboot_and_wait)
    Disruption(r"(?<![\w/-])(?:reboot|shutdown\s+-r|systemctl\s+(?:reboot|kexec))(?![\w-])",
               "host", "a reboot"),
    # driver.driver_packages
    Disruption(PACKAGES + r"\b(?:nvidia-(?:open|driver|kernel|dkms)|libnvidia-)", "host",
               "the driver stack installed or removed under the servers"),
    # driver.fabric
    Disruption(PACKAGES + r"\bnvidia-fabricmanager\b", "host",
               "the fabric manager installed or removed under the servers"),
    Disruption(r"\bsystemctl\s+(?:restart|stop|kill|try-restart)\s+nvidia-fabricmanager\b",
               "host", "the fabric manager restarted under the servers"),
    # none yields these today: the driver unloaded or a GPU reset under the servers
    Disruption(r"\b(?:rmmod|modprobe\s+-r)\s+nvidia|\bnvidia-smi\s+(?:-r|--gpu-reset)\b",
               "host", "the driver unloaded or a GPU reset"),
)


def leave_of(command: Any) -> frozenset[str] | None:
    """What a command takes out of the routers: ``HOST``, some server units, or None (it is
    no leave)."""
    if isinstance(command, FunctionCommand):
        if command.function is cutover._leave:
            return HOST
        if command.function is cutover._leave_units:
            return frozenset(command.args[0])
    return None


def text_of(command: Any) -> str:
    """A shell command's text without quoted text (``fail``'s messages) or comments; empty
    for uploads and Python callbacks."""
    text = command if isinstance(command, str) else \
        command.get_raw_value() if isinstance(command, StringCommand) else ""
    return re.sub(r"(^|\s)#[^\n]*", r"\1", re.sub(r"'[^']*'", "''", text))


def disruptions(command: Any) -> list[tuple[Disruption, str | None]]:
    """The disruptions a command matches, each with the server unit it names."""
    text = text_of(command)
    return [(d, m.groupdict().get("unit")) for d in DISRUPTIONS
            for m in re.finditer(d.pattern, text)]


def unled(found: list[Any]) -> list[str]:
    """The disruptive commands of one operation's commands that no leave covering them comes
    before, each said with why.

        unled([units.start_command("sglang.service")])
        # ["a server (re)started, ...: '(systemctl reset-failed ...' with sglang.service in ..."]
    """
    out: set[str] = set()
    problems = []
    for command in found:
        left = leave_of(command)
        if left is not None:
            out |= left
            continue
        for disruption, unit in disruptions(command):
            if not covered(out, disruption.scope, unit):
                wanted = {"host": "the whole host", "unit": f"{unit} (or the host)",
                          "server": "its server"}[disruption.scope]
                problems.append(f"{disruption.what}: {text_of(command)!r} with {wanted} in "
                                "the routers (yield it through cutover.disrupt)")
    return problems


def covered(out: set[str], scope: str, unit: str | None) -> bool:
    """Whether what is out of the routers (``*``: the host) covers a disruption's scope."""
    if scope == "server":
        return bool(out)
    return "*" in out or (scope == "unit" and unit in out)


def test_the_check_finds_a_disruptive_command_no_leave_covers() -> None:
    leave_1, leave_host = (FunctionCommand(cutover._leave_units, (["sglang-1.service"],), {}),
                           FunctionCommand(cutover._leave, (), {}))
    restart_1 = units.start_command("sglang-1.service")
    assert len(unled([restart_1])) == 1
    assert unled([leave_1, restart_1]) == [] and unled([leave_host, restart_1]) == []
    assert len(unled([leave_1, units.start_command("sglang-2.service")])) == 1
    assert len(unled([leave_1, "( sleep 1 && reboot ) </dev/null >/dev/null 2>&1 &"])) == 1
    assert unled([leave_host, "systemctl restart nvidia-fabricmanager"]) == []
    # the router's unit, a message naming a reboot, a probe of a process: nothing disturbed
    assert unled([units.start_command(paths.ROUTER_UNIT), ops.fail("reboot needed"),
                  "kill -0 42", "systemctl enable --now nvidia-fabricmanager.service",
                  "apt-mark unhold nvidia-open-580 >/dev/null"]) == []


def test_an_operation_that_forgets_the_seam_fails_the_check() -> None:
    """A stage's operation as someone might write it: the restart without ``disrupt``."""

    def careless(unit: str) -> Iterator[str]:
        yield "systemctl daemon-reload"
        yield units.start_command(unit)

    [problem] = unled(list(careless("sglang-3.service")))
    assert problem.startswith("a server (re)started, stopped or killed: '(systemctl "
                              "reset-failed sglang-3.service") and "cutover.disrupt" in problem


# --- every operation that may disturb the servers, driven into that branch in a roll ----------

class RollHost(Host):
    """The fake host with host data and pyinfra's temporary upload names (``files.template``)."""

    data: ClassVar[dict[str, Any]] = {}

    def get_temp_filename(self, dest: str, temp_directory: str | None = None) -> str:
        return f"/tmp/upload-{Path(dest).name}"


class Executing:
    """pyinfra's state while it runs operations (what ``files.template`` reads of it too)."""

    is_executing = True
    inventory = None
    config = SimpleNamespace(DIFF=False)
    cwd = None


MODULES = ("driver.deploy", "service.deploy", "service.last_good", "gate.resize", "gate.deploy",
           "gate.program", "warmup.deploy", "router.deploy", "compiled.deploy",
           "compiled.records", "teardown.deploy", "engine.deploy", "weights.deploy",
           "service.group_restart", "gate.group")
Use = Callable[[dict[str, Any]], Host]


@pytest.fixture
def use(monkeypatch: pytest.MonkeyPatch) -> Iterator[Use]:
    """In a roll (the cutover active), executing: install a fake host with ``facts``."""
    roll_dir = roll_directory.RollDirectory.create()
    monkeypatch.setenv(roll_directory.ENV, str(roll_dir.directory))
    stages = [importlib.import_module(f"sglang_fleet.stages.{name}") for name in MODULES]
    for module in (*stages, files):
        monkeypatch.setattr(module, "state", Executing(), raising=False)

    def install(facts: dict[str, Any]) -> Host:
        fake = RollHost(facts)
        for module in (*stages, files, ops, packages, secretfile):
            monkeypatch.setattr(module, "host", fake, raising=False)
        return fake

    yield install
    roll_dir.close()


def launch() -> Launch:
    return render(field_profile(gpus=1))  # one server: sglang.service


CFG = driver.DriverConfig.of(HostConfig.from_data({"nvidia_driver_version": "580.95.05",
                                                   "allow_reboot": True}, "h1"))
INSTALLED = {"nvidia-driver-580-open": ["580.95.05-1"]}


def driver_change(use: Use) -> list[list[Any]]:
    use(driver_host(["580.95.05-1"], "580.82.07-1", []).facts)
    return [commands(driver.driver_packages, CFG)]


def reboot(use: Use) -> list[list[Any]]:
    use({"DebPackages": INSTALLED, "NvidiaModule": LoadedModule("580.82.07", True)})
    return [commands(driver.load_driver, CFG)]


def fabric_change(use: Use) -> list[list[Any]]:
    units = {"nvlsm.service": False, "nvidia-fabricmanager.service": False}
    use({"NvidiaFabric": ("In Progress", "N/A"), "SystemdEnabled": units,
         "SystemdStatus": units,
         "DebPackages": {**INSTALLED, "nvidia-fabricmanager": ["580.82.07-1"]}})
    return [commands(driver.fabric, CFG)]


def persistence(use: Use) -> list[list[Any]]:
    use({"NvidiaSmi": SmiReport((Gpu(0, "NVIDIA B200", 183359, "580.95.05", "10.0", False),),
                                None)})
    return [commands(driver.persistence_mode)]


def stale_server(use: Use) -> list[list[Any]]:
    use({"PortListeners": [Listener(4242, "me", "Mon Nov 30 22:40:01 2026", None,
                                    "python3 -m sglang.launch_server")]})
    return [commands(service.stale_servers_stopped, launch(), 600)]


def retired_units(use: Use) -> list[list[Any]]:
    use({"FindFiles": [f"{paths.UNITS}/sglang-{i}.service" for i in range(3)]})
    return [commands(service.retire_other_units, keep=["sglang-0.service"]),
            commands(service.retire_other_units, keep=[])]  # teardown's remove_service


def restarts(use: Use) -> list[list[Any]]:
    """As the stages call it: a server behind the routers; the router's unit and the DCGM
    exporter not."""
    use({"UnitCondition": {"ActiveState": "failed", "UnitFileState": "disabled"}})
    return [commands(service.unit_started, "sglang-2.service", restart=True, routed=True),
            commands(service.unit_started, paths.ROUTER_UNIT, restart=True),
            commands(service.unit_started, "nvidia-dcgm-exporter.service", restart=True)]


def group_restarts(use: Use) -> list[list[Any]]:
    """A group that restarts: rank 0 stopped first, then the others, all started together."""
    use({})
    record = group_restart.GroupRestart("g", wanted_by=["b200-02"])
    return [commands(group_restart.group_stopped, "sglang.service", record, False),
            commands(group_restart.group_started, "sglang.service", record)]


def router_removed(use: Use) -> list[list[Any]]:
    use({"File": {"mode": 644}})
    return [commands(service.unit_absent, paths.ROUTER_UNIT)]


def restores(use: Use) -> list[list[Any]]:
    """Its files differ from the last good ones (copied back, restarted), then in place but
    down (started)."""
    fake = use({"File": {"mode": 600}, "Sha256File": lambda path: path, "FindInFile": [],
                "Link": None})
    found = [commands(last_good.restore_unit, "sglang-1.service")]
    fake.facts.update(Sha256File=lambda path: "same", KeylessSha256=lambda path: "same",
                      UnitCondition={"ActiveState": "failed"})
    found.append(commands(last_good.restore_unit, "sglang-1.service"))
    fake.facts.update(File=lambda path: None if "last-good" in path else {"mode": 600},
                      UnitCondition={"ActiveState": "inactive"})
    return [*found, commands(last_good.restore_files, "sglang-1.service")]


def sized_restart(use: Use) -> list[list[Any]]:
    use({"NvidiaSmi": SmiReport((Gpu(0, "NVIDIA B200", 183359, "580.95.05", "10.0", True),),
                                None)})
    profile = field_profile(gpus=1)
    return [commands(resize.sized_restart, profile, launch(), RELEASE, GateResult(resize=240))]


# Each operation that may disturb the servers, and the branches it is driven into (at least
# one of its command lists disturbs them, unless the value's name says otherwise).
DRIVEN: dict[str, Callable[[Use], list[list[Any]]]] = {
    "stages.driver.deploy.driver_packages": driver_change,
    "stages.driver.deploy.load_driver": reboot,
    "stages.driver.deploy.fabric": fabric_change,
    "stages.driver.deploy.persistence_mode": persistence,
    "stages.service.deploy.stale_servers_stopped": stale_server,
    "stages.service.deploy.retire_other_units": retired_units,
    "stages.service.deploy.unit_started": restarts,
    "stages.service.deploy.unit_absent": router_removed,
    "stages.service.group_restart.group_stopped": group_restarts,
    "stages.service.group_restart.group_started": group_restarts,
    "stages.service.last_good.restore_unit": restores,
    "stages.gate.resize.sized_restart": sized_restart,
}
CALM_WHEN_DRIVEN = {persistence, router_removed}  # driven to show they disturb nothing

# Operations that never disturb a server, and why.
CALM = {
    "ops.packages.packages_baseline": "records the packages present before the product's",
    "ops.packages.packages_purged": "teardown only (purge=driver), after remove_service has "
                                    "stopped every server; never in a roll",
    "ops.secretfile.secrets_absent": "teardown: the secret files",
    "ops.secretfile.secret_file": "a file; the restart it may cause is unit_running's",
    "fleet.cutover.prepared": "tells the roll the host is prepared (a file on the controller)",
    "fleet.cutover.turn": "waits for the host's turn",
    "stages.compiled.deploy.kernels_announced": "says which kernels the host needs",
    "stages.compiled.deploy.kernels_received":
        "unpacks kernels into the caches before any restart",
    "stages.compiled.deploy.kernels_shared":
        "packs a gated host's kernels for the hosts after it",
    "stages.compiled.records.kernels_recorded": "records what the kernels were compiled for",
    "stages.driver.deploy.driver_change_allowed": "a check",
    "stages.driver.deploy.verify": "a check",
    "stages.engine.deploy.current_link":
        "the units name their release: the link follows them",
    "stages.service.deploy.firewall_file": "a file (and nftables); the restart it may cause is "
                                    "unit_running's",
    "stages.engine.deploy.prune": "never a release current or previous names",
    "stages.engine.deploy.release_dir": "a new release beside the serving one",
    "stages.engine.deploy.uv_tool": "the product's uv",
    "stages.gate.deploy.gate": "the checks; keeps the files as the last good release",
    "stages.gate.program.check_together": "the checks of a host's servers at once",
    "stages.gate.deploy.gate_failed": "a verdict",
    "stages.gate.deploy.restored": "waits for a restored server to answer",
    "stages.gate.deploy.host_capacity": "a sum",
    "stages.gate.group.group_kept": "keeps the files as the last good release",
    "stages.gate.group.group_unchanged": "reads each member's MainPID",
    "stages.gate.group.member_started": "reads a member's journal",
    "stages.service.group_restart.restart_wanted":
        "decides whether the group restarts; enables the unit",
    "stages.gate.deploy.smoke": "a smoke generation",
    "stages.service.last_good.check_restored": "health and a smoke generation",
    "stages.service.last_good.restore_files":
        "the files back without a restart (driven in restores)",
    "stages.gate.resize.remember_size": "a file",
    "stages.router.deploy.router_release": "the router's release beside the running one",
    "stages.router.deploy.workers_in_step": "the router's workers, through its API",
    "stages.service.deploy.wave_ready":
        "waits for a wave, then puts it back into the routers",
    "stages.teardown.deploy.out_of_routers": "takes the host out of the routers (teardown)",
    "stages.warmup.deploy.caches_warmed":
        "warms the caches on spare GPUs, beside the servers",
    "stages.weights.deploy.present": "a check",
    "stages.weights.deploy.staged": "weights downloaded beside the ones served",
    "stages.weights.deploy.tools_venv": "the download tools",
}


@pytest.mark.parametrize("name", sorted(DRIVEN))
def test_every_disruptive_command_comes_after_its_leave(name: str, use: Use) -> None:
    found = DRIVEN[name](use)
    assert [problem for listed in found for problem in unled(listed)] == []
    disturbing = [c for listed in found for c in listed if disruptions(c)]
    # the scenario reaches the branch that disturbs the servers (or, calm, that it does not)
    assert bool(disturbing) is (DRIVEN[name] not in CALM_WHEN_DRIVEN)


@pytest.mark.parametrize("name", sorted(n for n, f in DRIVEN.items()
                                         if f not in CALM_WHEN_DRIVEN))
def test_without_the_leave_the_same_operations_fail_the_check(
        name: str, use: Use, monkeypatch: pytest.MonkeyPatch) -> None:
    """The test can fail: with ``disrupt`` yielding no leave, every driven operation's
    disruptive commands are found unled."""
    monkeypatch.setattr(cutover, "leave_routers", lambda units=None: iter(()))
    found = DRIVEN[name](use)
    assert [problem for listed in found for problem in unled(listed)] != []


def operations() -> dict[str, Any]:
    """Every pyinfra operation the product defines (``ops``, ``fleet``, ``roll``, ``stages``), by
    dotted name under ``sglang_fleet``: its deploys have ``_inner`` too, but no generator."""
    found = {}
    for package in ("ops", "fleet", "roll", "stages"):
        base = importlib.import_module(f"sglang_fleet.{package}")
        names = [base.__name__] + [m.name for m in pkgutil.walk_packages(
            base.__path__, f"{base.__name__}.") if ".host" not in m.name]
        for module in map(importlib.import_module, names):
            for attr, value in vars(module).items():
                inner = getattr(value, "_inner", None)
                if inspect.isgeneratorfunction(inner) and inner.__module__ == module.__name__:
                    found[f"{module.__name__.removeprefix('sglang_fleet.')}.{attr}"] = value
    return found


def test_every_operation_is_driven_here_or_named_calm() -> None:
    """A new operation is classed here: driven in a roll into the branch where it disturbs
    the servers, or named calm with why."""
    assert not set(DRIVEN) & set(CALM)
    assert sorted(operations()) == sorted([*DRIVEN, *CALM])


def test_no_stage_takes_a_host_out_of_the_routers_but_through_the_seam() -> None:
    root = Path(sglang_fleet.__file__).parent
    by_hand = [str(path.relative_to(root)) for path in sorted(root.rglob("*.py"))
               if "leave_routers" in path.read_text() and path.name != "cutover.py"]
    assert by_hand == []
