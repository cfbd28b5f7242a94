"""The host programs (``sglang_fleet/remote/``) on a host: uploaded one way, run one way.

Every stage that runs code on a host uploads the modules it runs with ``upload`` (root's files
in a root-owned directory the service cannot write) and runs them with ``program``: the
interpreter the program needs, ``-m sglang_fleet_remote.<module>``, and a ``PYTHONPATH`` that
adds that directory alone.

    launcher = upload("start_server")            # in a stage's pyinfra deploy
    program(release.python_bin, "start_server", "sglang.launch_server", "--port", "30000")
    # ['/usr/bin/env', 'PYTHONPATH=/opt/sglang/tools/pythonpath', '/opt/.../bin/python', '-m',
    #  'sglang_fleet_remote.start_server', 'sglang.launch_server', '--port', '30000']
"""

from __future__ import annotations

from pathlib import Path

from pyinfra.api.operation import OperationMeta
from pyinfra.operations import files

from sglang_fleet import remote
from sglang_fleet.paths import TOOLS

PACKAGE = "sglang_fleet_remote"  # the package's name on hosts (it imports itself relatively)
PYTHONPATH = f"{TOOLS}/pythonpath"  # root's (0755): holds the package and nothing else
HOST_DIR = f"{PYTHONPATH}/{PACKAGE}"
SOURCE = Path(remote.__file__).resolve().parent
MODULES = ("cache_copy", "capacity", "check_server", "crash", "download_model", "eta",
           "prune_caches", "readiness", "start_server", "start_router", "warm_caches")


def module_file(module: str) -> str:
    """Where a module of the package is on a host.

        module_file("check_server")  # '/opt/sglang/tools/pythonpath/sglang_fleet_remote/...py'
    """
    if module not in MODULES:
        raise ValueError(f"{module!r} is not a module of sglang_fleet/remote/")
    return f"{HOST_DIR}/{module}.py"


def upload(*modules: str) -> list[OperationMeta]:
    """Put these modules of ``sglang_fleet/remote/`` (and the package's ``__init__``) on the host,
    root's, readable by all, writable by root only. Returns one operation per module, in order:
    a stage restarts what runs a module when that module's upload changed.

        [launcher] = upload("start_router")
    """
    files.directory(name=f"Host programs {HOST_DIR} (root's; the services only read it)",
                    path=HOST_DIR, user="root", group="root", mode="755")
    files.put(name=f"Host program package {PACKAGE}", src=str(SOURCE / "__init__.py"),
              dest=f"{HOST_DIR}/__init__.py", user="root", group="root", mode="644")
    return [files.put(name=f"Host program {PACKAGE}.{module}", src=str(SOURCE / f"{module}.py"),
                      dest=module_file(module), user="root", group="root", mode="644")
            for module in modules]


def program(python: str, module: str, *args: str) -> list[str]:
    """The argv that runs a module of the package on the host with ``python`` (``env`` sets
    ``PYTHONPATH`` the same way in a shell command and a unit's ExecStart).

        program("/usr/bin/python3", "check_server", "--health-only")[-3:]
        # ['-m', 'sglang_fleet_remote.check_server', '--health-only']
    """
    module_file(module)  # a module the package has
    return ["/usr/bin/env", f"PYTHONPATH={PYTHONPATH}", python, "-m", f"{PACKAGE}.{module}",
            *args]
