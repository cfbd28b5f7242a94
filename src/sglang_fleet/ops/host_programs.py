"""The host programs on a host: each component's ``host/`` folder and the shared
``sglang_fleet/remote/``, uploaded whole and run one way.

The tree keeps its package names on the host (in a root-owned directory the service cannot
write), so a program imports the same names there as here; the packages above a folder are
empty there (standard library only: tests/unit/ops/test_host_programs.py holds every folder to
it).

    [launcher] = upload(SHARED, "sglang_fleet.remote.start_server")   # in a component's deploy
    program(release.python_bin, "sglang_fleet.remote.start_server", "sglang.launch_server")
    # ['/usr/bin/env', 'PYTHONPATH=/opt/sglang/tools/pythonpath', '/opt/.../bin/python', '-m',
    #  'sglang_fleet.remote.start_server', 'sglang.launch_server']
"""

from __future__ import annotations

import io
from pathlib import Path

from pyinfra.api.operation import OperationMeta
from pyinfra.operations import files

import sglang_fleet
from sglang_fleet.paths import TOOLS

PYTHONPATH = f"{TOOLS}/pythonpath"  # root's (0755): holds the host programs and nothing else
SOURCE = Path(sglang_fleet.__file__).resolve().parent
SHARED = "sglang_fleet.remote"  # what several components run or import on hosts


def folders() -> tuple[str, ...]:
    """Every folder of host programs: ``remote/`` and each component's ``host/``."""
    return (SHARED, *sorted(f"sglang_fleet.stages.{p.parent.name}.host"
                            for p in SOURCE.glob("stages/*/host")))


def _local(package: str) -> Path:
    return SOURCE.joinpath(*package.split(".")[1:])


def _remote(package: str) -> str:
    return f"{PYTHONPATH}/{package.replace('.', '/')}"


def module_file(module: str) -> str:
    """Where a host program is on a host.

        module_file("sglang_fleet.stages.gate.host.check_server")
        # '/opt/sglang/tools/pythonpath/sglang_fleet/stages/gate/host/check_server.py'
    """
    package, _, name = module.rpartition(".")
    if package not in folders() or not (_local(package) / f"{name}.py").is_file():
        raise ValueError(f"{module!r} is not a host program (sglang_fleet/remote/ or a "
                         "component's host/ folder)")
    return f"{_remote(package)}/{name}.py"


def upload(package: str, *watched: str) -> list[OperationMeta]:
    """Put a folder of host programs on the host whole (files no longer in it go), with
    ``remote/``. Returns one operation per ``watched`` module: a deploy restarts what runs that
    program when its file changed, not for a change elsewhere in the folder.

        upload("sglang_fleet.stages.gate.host")
        [launcher] = upload("sglang_fleet.stages.router.host",
                            "sglang_fleet.stages.router.host.start_router")
    """
    watch = [files.put(name=f"Host program {module}", src=str(_local(module.rpartition(".")[0])
                                                               / f"{module.rpartition('.')[2]}.py"),
                       dest=module_file(module), user="root", group="root", mode="644")
             for module in watched]
    parents = {".".join(package.split(".")[:n]) for n in range(1, package.count(".") + 1)}
    for parent in sorted(parents - {SHARED, package}):
        files.put(name=f"Host package {parent}", src=io.StringIO(""),
                  dest=f"{_remote(parent)}/__init__.py", user="root", group="root", mode="644")
    for folder in dict.fromkeys((SHARED, package)):
        files.sync(name=f"Host programs {folder} (root's; the services only read them)",
                   src=str(_local(folder)), dest=_remote(folder), user="root", group="root",
                   mode="644", dir_mode="755", delete=True, exclude="*.pyc",
                   exclude_dir=["__pycache__", "*/__pycache__"])
    return watch


def program(python: str, module: str, *args: str) -> list[str]:
    """The argv that runs a host program on the host with ``python`` (``env`` sets
    ``PYTHONPATH`` the same way in a shell command and a unit's ExecStart).

        program("/usr/bin/python3", "sglang_fleet.remote.capacity", "--help")[-3:]
        # ['-m', 'sglang_fleet.remote.capacity', '--help']
    """
    module_file(module)  # a host program
    return ["/usr/bin/env", f"PYTHONPATH={PYTHONPATH}", python, "-m", module, *args]
