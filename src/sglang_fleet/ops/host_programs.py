"""The host programs (``sglang_fleet/remote/``) on a host: uploaded one way, run one way.

Every stage that runs code on a host uploads the modules it runs with ``upload`` (root's files
in a root-owned directory the service cannot write; with each, every module of the package it
imports, read from its relative imports) and runs them with ``program``: the interpreter the
program needs, ``-m sglang_fleet_remote.<module>``, and a ``PYTHONPATH`` that adds that
directory alone.

    launcher = upload("start_server")            # in a stage's pyinfra deploy
    program(release.python_bin, "start_server", "sglang.launch_server", "--port", "30000")
    # ['/usr/bin/env', 'PYTHONPATH=/opt/sglang/tools/pythonpath', '/opt/.../bin/python', '-m',
    #  'sglang_fleet_remote.start_server', 'sglang.launch_server', '--port', '30000']
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

from pyinfra.api.operation import OperationMeta
from pyinfra.operations import files

from sglang_fleet import remote
from sglang_fleet.paths import TOOLS

PACKAGE = "sglang_fleet_remote"  # the package's name on hosts (it imports itself relatively)
PYTHONPATH = f"{TOOLS}/pythonpath"  # root's (0755): holds the package and nothing else
HOST_DIR = f"{PYTHONPATH}/{PACKAGE}"
SOURCE = Path(remote.__file__).resolve().parent
# Every module of the package: the programs a stage runs, and the parts they import.
MODULES = ("cache_archive", "cache_copy", "cache_pack", "cache_unpack", "capacity",
           "capacity_figures", "capacity_log", "check_grpc", "check_server", "check_servers",
           "crash", "download_model", "eta", "gate_grpc", "gate_grpc_smoke", "gate_http",
           "gate_smoke", "gate_soak", "gate_unit", "grpc_health",
           "member_start", "progress", "prune_caches", "readiness", "start_server",
           "start_router", "terminal", "warm_caches")


def module_file(module: str) -> str:
    """Where a module of the package is on a host.

        module_file("check_server")  # '/opt/sglang/tools/pythonpath/sglang_fleet_remote/...py'
    """
    if module not in MODULES:
        raise ValueError(f"{module!r} is not a module of sglang_fleet/remote/")
    return f"{HOST_DIR}/{module}.py"


@functools.cache
def imports(module: str) -> tuple[str, ...]:
    """``module`` and every module of the package it imports, directly or through another, each
    once and after the modules it imports: what must be on the host for it to run. Read from
    its relative imports (``from . import x``, ``from .x import y``), the only way a module of
    the package imports another (it is uploaded alone).

        imports("cache_copy")
        # ('cache_archive', 'prune_caches', 'cache_pack', 'cache_unpack', 'cache_copy')
    """
    return tuple(_imports(module, ()))


def _imports(module: str, importers: tuple[str, ...]) -> list[str]:
    """``imports`` of ``module``, imported by ``importers`` in turn: a module that imports one
    of them back (inside a function, as check_grpc and check_server do) is already listed."""
    module_file(module)  # a module the package has
    found: list[str] = []
    for node in ast.walk(ast.parse((SOURCE / f"{module}.py").read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            names = [node.module.split(".")[0]] if node.module else \
                [alias.name for alias in node.names]
            for name in (n for n in names if n not in (*importers, module)):
                found += [m for m in _imports(name, (*importers, module)) if m not in found]
    return [*found, module]


def upload(*modules: str) -> list[OperationMeta]:
    """Put these modules of ``sglang_fleet/remote/`` on the host, each with the modules it
    imports (``imports``) and the package's ``__init__``: root's, readable by all, writable by
    root only. Returns one operation per module named, in order: a stage restarts what runs a
    module when that module's upload changed (the modules services run, start_server and
    start_router, import none; a change to a module imported alone would not show there).

        [launcher] = upload("start_router")
        upload("check_server")  # and capacity, capacity_log, gate_http, ... that it imports
    """
    files.directory(name=f"Host programs {HOST_DIR} (root's; the services only read it)",
                    path=HOST_DIR, user="root", group="root", mode="755")
    files.put(name=f"Host program package {PACKAGE}", src=str(SOURCE / "__init__.py"),
              dest=f"{HOST_DIR}/__init__.py", user="root", group="root", mode="644")
    puts: dict[str, OperationMeta] = {}
    for module in modules:
        for needed in imports(module):
            if needed not in puts:  # once each, though several programs import it
                puts[needed] = files.put(
                    name=f"Host program {PACKAGE}.{needed}", src=str(SOURCE / f"{needed}.py"),
                    dest=module_file(needed), user="root", group="root", mode="644")
    return [puts[module] for module in modules]


def program(python: str, module: str, *args: str) -> list[str]:
    """The argv that runs a module of the package on the host with ``python`` (``env`` sets
    ``PYTHONPATH`` the same way in a shell command and a unit's ExecStart).

        program("/usr/bin/python3", "check_server", "--health-only")[-3:]
        # ['-m', 'sglang_fleet_remote.check_server', '--health-only']
    """
    module_file(module)  # a module the package has
    return ["/usr/bin/env", f"PYTHONPATH={PYTHONPATH}", python, "-m", f"{PACKAGE}.{module}",
            *args]
