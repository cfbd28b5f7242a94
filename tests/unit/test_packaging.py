"""The lab is its own package (lab/fleet-lab): the product's wheel holds none of it, the
product's CLI imports it only for ``lab`` and ``demo``, and without it those two commands say
in one line how to install it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from tests.conftest import FIELD_PROFILE, ROOT

LAB_MODULES = "[m for m in sys.modules if m.split('.')[0] == 'sglang_fleet_lab']"


@pytest.fixture(scope="module")
def product_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The product's wheel, built as a release would build it (uv build)."""
    uv = shutil.which("uv")
    assert uv, "uv is needed to build the product's wheel: pip install uv"
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([uv, "build", "-q", "--wheel", "-o", str(out), str(ROOT)], check=True,
                   timeout=300)
    (wheel,) = out.glob("sglang_fleet-*.whl")
    return wheel


@pytest.fixture(scope="module")
def without_lab(product_wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """A python running the product from its wheel, without the lab: ``-S`` skips the .pth
    files that put the workspace's editable packages (the lab among them) on the path, and
    the product's dependencies come from this environment's site-packages."""
    unpacked = tmp_path_factory.mktemp("installed")
    with zipfile.ZipFile(product_wheel) as whl:
        whl.extractall(unpacked)
    path = [str(unpacked), sysconfig.get_paths()["purelib"]]
    return [sys.executable, "-I", "-S", "-c",
            f"import sys; sys.path[:0] = {path!r}; from sglang_fleet.cli import main; "
            f"code = main(sys.argv[1:]); print({LAB_MODULES}, file=sys.stderr); sys.exit(code)"]


def test_product_wheel_holds_no_lab(product_wheel: Path) -> None:
    names = zipfile.ZipFile(product_wheel).namelist()
    assert "sglang_fleet/cli/__init__.py" in names
    assert [n for n in names if "lab" in Path(n).parts[:2] or "sglang_fleet_lab" in n] == []
    metadata = zipfile.ZipFile(product_wheel).read(
        next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    requires = [line for line in metadata.splitlines() if line.startswith("Requires-Dist:")]
    assert any("pyinfra" in line for line in requires)
    assert [line for line in requires if "lab" in line] == []


@pytest.mark.parametrize("argv", [["lab", "status"], ["lab", "up", "--hosts", "1"], ["demo"]])
def test_lab_commands_without_the_lab_say_how_to_install_it(
        without_lab: list[str], argv: list[str], tmp_path: Path) -> None:
    result = subprocess.run([*without_lab, *argv], capture_output=True, text=True, timeout=60,
                            cwd=tmp_path)
    error, modules = result.stderr.splitlines()
    assert result.returncode == 2, result.stderr
    assert error.startswith(f"sglang-fleet {argv[0]}: the lab is not installed")
    assert "pip install ./lab/fleet-lab" in error and "uv sync" in error
    assert modules == "[]"


def test_product_commands_work_without_the_lab(without_lab: list[str], tmp_path: Path) -> None:
    result = subprocess.run([*without_lab, "check", str(FIELD_PROFILE)], capture_output=True,
                            text=True, timeout=60, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "ok for SGLang" in result.stdout


def _cli_in_subprocess(argv: list[str], env: dict[str, str]) -> list[str]:
    """The lab modules imported after ``sglang_fleet.cli.main(argv)`` in a fresh python."""
    code = (f"import json, sys; from sglang_fleet.cli import main; main({argv!r}); "
            f"print(json.dumps({LAB_MODULES}))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=60, env=env)
    assert result.returncode == 0, result.stderr
    return list(json.loads(result.stdout.splitlines()[-1]))


def test_product_cli_imports_the_lab_only_for_lab_commands(tmp_path: Path) -> None:
    env = {**os.environ, "SGLANG_FLEET_LAB_DIR": str(tmp_path)}
    assert _cli_in_subprocess(["check", str(FIELD_PROFILE)], env) == []
    assert "sglang_fleet_lab.cli" in _cli_in_subprocess(["lab", "status"], env)


def test_lab_status_from_another_directory(tmp_path: Path) -> None:
    """The installed ``sglang-fleet`` runs the lab's commands from any directory."""
    (tmp_path / "lab.json").write_text(json.dumps({"hosts": [
        {"name": "labzz", "address": "127.0.0.250", "gpus": 2, "hgx": True}]}))
    result = subprocess.run([str(Path(sys.executable).with_name("sglang-fleet")), "lab",
                             "status", "--json"], capture_output=True, text=True, timeout=60,
                            cwd=tmp_path, env={**os.environ, "SGLANG_FLEET_LAB_DIR": str(tmp_path)})
    assert result.returncode == 0, result.stderr
    (host,) = json.loads(result.stdout)
    assert (host["name"], host["gpus"], host["hgx"], host["state"]) == ("labzz", 2, True, "stopped")
