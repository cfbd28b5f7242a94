"""The host programs as hosts get them: the package ``sglang_fleet_remote`` alone on PYTHONPATH
(no sglang_fleet, no site-packages), each module imported and run with ``python -m``."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sglang_fleet import hostcode


@pytest.fixture(scope="module")
def pythonpath(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of sglang_fleet/remote/ under its host name, as ``upload`` puts it."""
    root = tmp_path_factory.mktemp("pythonpath")
    target = root / hostcode.PACKAGE
    target.mkdir()
    for name in ("__init__", *hostcode.MODULES):
        shutil.copy(hostcode.SOURCE / f"{name}.py", target / f"{name}.py")
    return root


def host_python(pythonpath: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The system python of a host: standard library only (``-S``: no site-packages), run from
    a directory that holds nothing importable."""
    return subprocess.run([sys.executable, "-S", *args], capture_output=True, text=True,
                          cwd=pythonpath.parent, env={"PATH": os.environ["PATH"],
                                                      "PYTHONPATH": str(pythonpath)})


def test_every_module_of_the_package_is_uploaded_by_name() -> None:
    on_disk = {p.stem for p in hostcode.SOURCE.glob("*.py")} - {"__init__"}
    assert on_disk == set(hostcode.MODULES)


@pytest.mark.parametrize("module", hostcode.MODULES)
def test_each_module_imports_alone(pythonpath: Path, module: str) -> None:
    result = host_python(pythonpath, "-c", f"import {hostcode.PACKAGE}.{module}")
    assert result.returncode == 0, result.stderr


def test_check_server_runs_with_python_m(pythonpath: Path) -> None:
    result = host_python(pythonpath, "-m", f"{hostcode.PACKAGE}.check_server", "--help")
    assert result.returncode == 0, result.stderr
    assert "--soak-requests" in result.stdout


def test_start_server_says_how_to_use_it(pythonpath: Path) -> None:
    result = host_python(pythonpath, "-m", f"{hostcode.PACKAGE}.start_server")
    assert result.returncode == 1
    assert "usage: python -m sglang_fleet_remote.start_server MODULE" in result.stderr


def test_program_names_only_modules_the_package_has() -> None:
    assert hostcode.program("/usr/bin/python3", "capacity")[:2] == [
        "/usr/bin/env", f"PYTHONPATH={hostcode.PYTHONPATH}"]
    with pytest.raises(ValueError, match="not a module of sglang_fleet/remote/"):
        hostcode.program("/usr/bin/python3", "stage_weights")
