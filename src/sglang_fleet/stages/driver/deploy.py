"""Driver stage: the OPEN driver of a pinned branch from NVIDIA's CUDA repository
(``repository``: held, kept out of unattended upgrades, loaded by a reboot (``reboot``) only
when the loaded module differs from the installed one), the fabric manager and NVLSM on
NVSwitch hosts, DCGM when host data asks (``dcgm``), and a verification with nvidia-smi.

    from sglang_fleet.stages.driver.deploy import install_driver
    install_driver()      # in a pyinfra deploy; reads the host's data (DriverConfig)
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import gevent  # type: ignore[import-untyped]
from pyinfra import logger
from pyinfra.api.command import FunctionCommand, StringCommand
from pyinfra.api.deploy import deploy
from pyinfra.api.operation import operation
from pyinfra.context import host
from pyinfra.facts.deb import DebPackages
from pyinfra.facts.server import KernelVersion
from pyinfra.facts.systemd import SystemdEnabled, SystemdStatus
from pyinfra.operations import apt, files, server

from sglang_fleet import hostconfig, paths
from sglang_fleet.facts.nvidia import (
    AptVersions,
    HeldPackages,
    LoadedModule,
    NvidiaFabric,
    NvidiaModule,
    NvidiaSmi,
)
from sglang_fleet.fleet.cutover import disrupt
from sglang_fleet.hostconfig import DRIVER_FLOOR, REBOOT_TIMEOUT, HostConfig
from sglang_fleet.ops import Ops, fail
from sglang_fleet.ops.packages import packages_baseline, packages_purged
from sglang_fleet.report import summary
from sglang_fleet.stages.driver.dcgm import DCGM_PACKAGES, DROP_INS, dcgm_running
from sglang_fleet.stages.driver.repository import APT_NO_UPGRADE, nvidia_repository, repository_url


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split("-")[0].split(".") if p.isdigit())


@dataclass(frozen=True)
class DriverConfig:
    """The driver stage's host data, checked (``hostconfig``)."""

    repo_base_url: str
    keyring_sha256: str | None
    branch: str
    version: str | None
    gpu_count: int | None
    allow_reboot: bool
    engine_cuda: str
    cuda_toolkit: str | None
    dcgm: bool
    reboot_timeout: int = REBOOT_TIMEOUT

    @classmethod
    def of(cls, cfg: HostConfig) -> DriverConfig:
        """The driver stage's part of the host's data (checked with the rest of it).

            DriverConfig.of(hostconfig.of(host)).packages   # ['nvidia-open-580', ...]
        """
        return cls(repo_base_url=cfg.nvidia_repo_base_url.rstrip("/"),
                   keyring_sha256=cfg.nvidia_keyring_sha256, branch=cfg.nvidia_driver_branch,
                   version=cfg.nvidia_driver_version, gpu_count=cfg.gpu_count,
                   allow_reboot=cfg.allow_reboot, engine_cuda=cfg.engine_cuda,
                   cuda_toolkit=cfg.cuda_toolkit, dcgm=cfg.install_dcgm,
                   reboot_timeout=cfg.reboot_timeout_seconds)

    @property
    def extras(self) -> list[str]:
        """The CUDA toolkit, and DCGM with its Prometheus exporter, when host data asks."""
        return ([f"cuda-toolkit-{self.cuda_toolkit}"] if self.cuda_toolkit else []) + \
            (DCGM_PACKAGES if self.dcgm else [])

    @property
    def packages(self) -> list[str]:
        """The open driver stack this stage installs and holds."""
        return [f"nvidia-open-{self.branch}", f"nvidia-driver-{self.branch}-open"]


def _installed(package: str) -> str | None:
    versions = host.get_fact(DebPackages).get(package)
    return sorted(versions)[-1] if versions else None


def change_refused(cfg: DriverConfig, loaded: LoadedModule | None) -> str | None:
    """Why a driver change must not start: it would need a reboot that host data does not
    allow, and installing it would break NVML (``Driver/library version mismatch``) until then.

        change_refused(cfg(version="580.105.08", allow_reboot=False),
                       LoadedModule("580.95.05", True))   # "nvidia_driver_version 580.105.08: …"
    """
    if cfg.allow_reboot or cfg.version is None or loaded is None:
        return None
    if loaded.version == cfg.version and loaded.open:
        return None
    found = f"{loaded.version}{'' if loaded.open else ' (proprietary)'}"
    return (f"nvidia_driver_version {cfg.version}: refused, nothing installed: the loaded "
            f"driver is {found} and changing it needs a reboot, which host data does not allow "
            f"(set allow_reboot = True, or nvidia_driver_version = {loaded.version})")


@operation(is_idempotent=True)
def driver_change_allowed(cfg: DriverConfig) -> Ops:
    """Stop before anything is installed when changing the driver version would need a reboot
    that host data does not allow.

        driver_change_allowed(name="Driver change allowed", cfg=cfg)
    """
    refused = change_refused(cfg, host.get_fact(NvidiaModule))
    if refused:
        yield fail(refused)


@operation(is_idempotent=True)
def driver_packages(cfg: DriverConfig) -> Ops:
    """Install the open driver at the wanted version (unholding only to change it), then hold
    it. Resolved at execution time, against the repository this run has just configured.

    + cfg: the driver stage's validated host data; ``cfg.version`` None keeps what is installed

        driver_packages(name="Open driver, branch 580", cfg=cfg)
    """
    main = cfg.packages[1]
    offered = host.get_fact(AptVersions, package=main)
    installed = _installed(main)
    if cfg.version:
        wanted = next((v for v in offered if v.split("-")[0] == cfg.version), None)
        if wanted is None:  # also in the preview of a fresh host: the repository comes first
            yield fail(f"nvidia_driver_version {cfg.version}: the repository offers "
                       f"{', '.join(offered) or 'no ' + main}")
            return
    else:
        wanted = installed or (offered[0] if offered else None)
    if wanted is None:  # only in the preview of a fresh host: the repository is not there yet
        yield f"true  # {main} from the NVIDIA repository"
        return
    held = host.get_fact(HeldPackages)
    if installed != wanted:
        pinned = [f"{p}={wanted}" for p in cfg.packages]
        # in a roll: a driver change is not made under load (the host leaves whole first)
        yield from disrupt(
            f"apt-mark unhold {' '.join(cfg.packages)} >/dev/null",
            "DEBIAN_FRONTEND=noninteractive apt-get install -y --allow-downgrades "
            f"--allow-change-held-packages -o Dpkg::Options::=--force-confold "
            f"{' '.join(pinned)} nvidia-driver-pinning-{cfg.branch}")
    if installed != wanted or not set(cfg.packages) <= set(held):
        yield f"apt-mark hold {' '.join(cfg.packages)}"


@operation(is_idempotent=True)
def load_driver(cfg: DriverConfig) -> Ops:
    """Reboot only when the loaded module is not the installed open driver, and only when
    ``allow_reboot`` says so; otherwise stop with what was found.

        load_driver(name="Driver loaded", cfg=cfg)
    """
    installed = _installed(cfg.packages[1])
    loaded = host.get_fact(NvidiaModule)
    if installed is None:
        yield fail(f"{cfg.packages[1]} is not installed")
        return
    want = installed.split("-")[0]
    if loaded is not None and loaded.version == want and loaded.open:
        return
    found = "none" if loaded is None else \
        f"{loaded.version}{'' if loaded.open else ' (proprietary)'}"
    if not cfg.allow_reboot:
        yield fail(f"reboot needed: loaded {found}, installed {want} "
                   "(set allow_reboot = True in host data to let the deploy reboot)")
        return
    logger.info(f"{host.print_prefix}rebooting: loaded driver {found}, installed {want}")
    yield from disrupt(reboot_and_wait(cfg.reboot_timeout))


def reboot_and_wait(timeout: int, delay: float = 5, interval: float = 2) -> Ops:
    """pyinfra's ``server.reboot``, its wait said with the host's name and, when the host is
    not back within ``timeout`` s, failing this host alone with a plain message.

        yield from disrupt(reboot_and_wait(900))     # in an operation
    """
    waits = False  # the first Python step after the reboot command is the wait
    for command in server.reboot._inner(delay=delay, interval=interval, reboot_timeout=timeout):
        if waits and isinstance(command, FunctionCommand):
            command, waits = FunctionCommand(_wait_back, (command, timeout), {}), False
        elif isinstance(command, StringCommand):
            waits = True
        yield command


def _wait_back(state: Any, host: Any, wait: FunctionCommand, timeout: int) -> bool:
    # the arguments' names make pyinfra pass it the state and the host
    logger.info(f"{host.print_prefix}waiting for {host.name} to come back from its reboot: "
                f"{timeout} s left")
    tic = time.monotonic()
    try:
        # pyinfra's bound counts tries, and a try at a silent host lasts its connect timeout
        with gevent.Timeout(timeout, TimeoutError(f"waited {timeout} s")):
            wait.execute(state, host, {})
    except Exception as e:  # pyinfra's own answer to an exception here is a traceback
        logger.error(f"{host.print_prefix}error: {host.name} did not come back from its "
                     f"reboot ({e}; the wait is reboot_timeout_seconds): this host fails, the "
                     "others carry on")
        return False
    logger.info(f"{host.print_prefix}back from its reboot after {time.monotonic() - tic:.0f} s")
    return True


@operation(is_idempotent=True)
def persistence_mode() -> Ops:
    """Persistence mode on every GPU (the driver stays initialised between processes).

        persistence_mode(name="Persistence mode")
    """
    report = host.get_fact(NvidiaSmi)
    if not report.ok:
        return
    if not all(g.persistence for g in report.gpus):
        yield "nvidia-smi -pm 1"


@operation(is_idempotent=True)
def fabric(cfg: DriverConfig) -> Ops:
    """On NVSwitch hosts (a Fabric state in nvidia-smi): the fabric manager of exactly the
    installed driver version, NVLSM and the InfiniBand tools it needs, enabled and running.

        fabric(name="NVSwitch fabric", cfg=cfg)
    """
    if host.get_fact(NvidiaFabric) is None:
        return
    driver = _installed(cfg.packages[1])
    fm = _installed("nvidia-fabricmanager")
    if fm != driver:
        if fm is not None:
            logger.warning(f"{host.print_prefix}nvidia-fabricmanager {fm} does not match the "
                           f"driver {driver}: installing nvidia-fabricmanager {driver}")
        # in a roll: the fabric restarts under the servers (the host leaves whole first)
        yield from disrupt(
            "apt-mark unhold nvidia-fabricmanager >/dev/null",
            "DEBIAN_FRONTEND=noninteractive apt-get install -y --allow-downgrades "
            f"--allow-change-held-packages nvidia-fabricmanager={driver} nvlsm "
            "infiniband-diags",
            "apt-mark hold nvidia-fabricmanager",
            "systemctl daemon-reload",  # the package replaced the unit
            "systemctl restart nvidia-fabricmanager")
    elif _installed("nvlsm") is None:
        yield "DEBIAN_FRONTEND=noninteractive apt-get install -y nvlsm infiniband-diags"
    units = ["nvlsm.service", "nvidia-fabricmanager.service"]
    enabled = host.get_fact(SystemdEnabled, services=units)
    running = host.get_fact(SystemdStatus, services=units)
    for unit in units:
        if not (enabled.get(unit) and running.get(unit)):
            yield f"systemctl enable --now {unit}"


def _fabric_problem(cfg: DriverConfig) -> str | None:
    state_ = host.get_fact(NvidiaFabric)
    deadline = time.monotonic() + 60
    while state_ is not None and state_[0] != "Completed" and time.monotonic() < deadline:
        time.sleep(2)  # the fabric takes a moment after the fabric manager starts
        state_ = host.get_fact(NvidiaFabric)
    if state_ is None or state_[0] == "Completed":
        return None
    fm, driver = _installed("nvidia-fabricmanager"), _installed(cfg.packages[1])
    cause = (f"nvidia-fabricmanager {fm} does not match driver {driver}" if fm != driver
             else "the fabric manager or nvlsm is not running")
    return f"fabric state {state_[0]} ({cause})"


@operation(is_idempotent=True)
def verify(cfg: DriverConfig) -> Ops:
    """GPU count, B200, memory, driver floor for the engine's CUDA, compute capability 10.0 and
    (on NVSwitch hosts) a completed fabric; one line per host.

        verify(name="GPUs as expected", cfg=cfg)
    """
    report = host.get_fact(NvidiaSmi)
    if not report.ok:
        yield fail(f"nvidia-smi: {report.error}")
        return
    gpus, problems = report.gpus, []
    if cfg.gpu_count is not None and len(gpus) != cfg.gpu_count:
        problems.append(f"{len(gpus)} GPUs, host data says {cfg.gpu_count}")
    if not gpus:
        problems.append("no GPUs")
    for g in gpus:
        if "B200" not in g.name:
            problems.append(f"GPU {g.index} is {g.name}, not a B200")
        if g.memory_mib < 180_000:
            problems.append(f"GPU {g.index} has {g.memory_mib} MiB")
        if g.compute_cap != "10.0":
            problems.append(f"GPU {g.index} has compute capability {g.compute_cap}")
    driver = gpus[0].driver_version if gpus else "?"
    floor = DRIVER_FLOOR[cfg.engine_cuda]
    if gpus and _version_key(driver) < _version_key(floor):
        problems.append(f"driver {driver} is below {floor}, needed by CUDA {cfg.engine_cuda}")
    fabric_problem = _fabric_problem(cfg)
    if fabric_problem:
        problems.append(fabric_problem)
    if problems:
        yield fail("; ".join(problems))
        return
    fabric_state = host.get_fact(NvidiaFabric)
    logger.info(f"{host.print_prefix}{len(gpus)} x {gpus[0].name}, {gpus[0].memory_mib} MiB, "
                f"driver {driver} (open, >= {floor} for CUDA {cfg.engine_cuda}), compute "
                f"capability {gpus[0].compute_cap}"
                + (f", fabric {fabric_state[0]}" if fabric_state else ""))


@deploy("NVIDIA driver")
def install_driver() -> None:
    """Converge the host's NVIDIA stack; read the configuration from the host's data."""
    cfg = DriverConfig.of(hostconfig.of(host))
    summary.failed_hosts_at_exit()
    url = repository_url(cfg.repo_base_url)
    driver_change_allowed(name="A driver change needs no reboot, or may reboot", cfg=cfg)
    packages_baseline(name="Packages before sglang-fleet (for teardown)")
    nvidia_repository(url, cfg.keyring_sha256)
    apt.packages(name="Kernel headers for DKMS",
                 packages=[f"linux-headers-{host.get_fact(KernelVersion)}"])
    driver_packages(name=f"Open driver, branch {cfg.branch}", cfg=cfg)
    if cfg.extras:
        apt.packages(name="CUDA toolkit and DCGM", packages=cfg.extras)
    if cfg.dcgm:
        dcgm_running()
    load_driver(name="Loaded driver is the installed one", cfg=cfg)
    persistence_mode(name="Persistence mode")
    fabric(name="NVSwitch fabric (fabric manager, NVLSM)", cfg=cfg)
    verify(name="Verify GPUs with nvidia-smi", cfg=cfg)


@deploy("Remove the NVIDIA driver")
def remove_driver() -> None:
    """Take away what install_driver put on the host (teardown with purge=driver); the loaded
    module stays in the kernel until the next reboot."""
    cfg = DriverConfig.of(hostconfig.of(host))
    purged = packages_purged(name="Driver stack", owned=[
        *cfg.packages, "nvidia-fabricmanager", f"nvidia-driver-pinning-{cfg.branch}", "nvlsm",
        *cfg.extras, "cuda-keyring"], shared=[f"linux-headers-{host.get_fact(KernelVersion)}"])
    files.file(name="Unattended-upgrades exclusion", path=APT_NO_UPGRADE, present=False)
    for unit, drop_in in DROP_INS.items():
        files.directory(name=f"{unit} drop-in", path=drop_in.rsplit("/", 1)[0], present=False)
    files.directory(name="Downloaded keyring package", path=paths.KEYRING_DIR, present=False)
    apt.update(name="Forget the NVIDIA repository", _if=purged.did_change)
