"""The lab is its own package (lab/fleet-lab): the product's wheel holds none of it, the
product's CLI imports it only for ``lab`` and ``demo``, and without it those two commands say
in one line how to install it. generate is one too (generate/), which the product depends on
and which depends on no part of the product: what it shares with the deploy is a copy, held
equal here."""

from __future__ import annotations

import inspect
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from sglang_fleet.config import validators
from sglang_fleet.remote import capacity_figures, terminal
from sglang_fleet_generate import capacity, text
from tests.conftest import FIELD_PROFILE, ROOT

LAB_MODULES = "[m for m in sys.modules if m.split('.')[0] == 'sglang_fleet_lab']"


def built(source: Path, name: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel of the package in ``source``, built as a release would build it (uv build)."""
    uv = shutil.which("uv")
    assert uv, "uv is needed to build the product's wheel: pip install uv"
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([uv, "build", "-q", "--wheel", "-o", str(out), str(source)], check=True,
                   timeout=300)
    (wheel,) = out.glob(f"{name}-*.whl")
    return wheel


@pytest.fixture(scope="module")
def product_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return built(ROOT, "sglang_fleet", tmp_path_factory)


@pytest.fixture(scope="module")
def generate_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return built(ROOT / "generate", "sglang_fleet_generate", tmp_path_factory)


def requires(wheel: Path) -> list[str]:
    """The wheel's Requires-Dist lines."""
    names = zipfile.ZipFile(wheel).namelist()
    metadata = zipfile.ZipFile(wheel).read(
        next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    return [line for line in metadata.splitlines() if line.startswith("Requires-Dist:")]


@pytest.fixture(scope="module")
def without_lab(product_wheel: Path, generate_wheel: Path,
                tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """A python running the product from its wheel (and generate's), without the lab: ``-S``
    skips the .pth files that put the workspace's editable packages (the lab among them) on
    the path, and the product's dependencies come from this environment's site-packages."""
    unpacked = tmp_path_factory.mktemp("installed")
    for wheel in (product_wheel, generate_wheel):
        with zipfile.ZipFile(wheel) as whl:
            whl.extractall(unpacked)
    path = [str(unpacked), sysconfig.get_paths()["purelib"]]
    return [sys.executable, "-I", "-S", "-c",
            f"import sys; sys.path[:0] = {path!r}; from sglang_fleet.cli import main; "
            f"code = main(sys.argv[1:]); print({LAB_MODULES}, file=sys.stderr); sys.exit(code)"]


def test_product_wheel_holds_no_lab(product_wheel: Path) -> None:
    names = zipfile.ZipFile(product_wheel).namelist()
    assert "sglang_fleet/cli/__init__.py" in names
    assert [n for n in names if "lab" in Path(n).parts[:2] or "sglang_fleet_lab" in n] == []
    assert [n for n in names if "generate" in n] == []
    assert any("pyinfra" in line for line in requires(product_wheel))
    assert [line for line in requires(product_wheel) if "lab" in line] == []
    assert "Requires-Dist: sglang-fleet-generate" in requires(product_wheel)


def test_generate_wheel_needs_no_part_of_the_deploy(generate_wheel: Path) -> None:
    """generate/tests/test_cli.py runs it with pyinfra and sglang_fleet unimportable."""
    names = zipfile.ZipFile(generate_wheel).namelist()
    assert "sglang_fleet_generate/cli.py" in names
    assert [n for n in names if n.startswith("sglang_fleet/")] == []
    assert [line for line in requires(generate_wheel)
            if "pyinfra" in line or "sglang-fleet" in line] == []


def test_the_deploys_text_forms_are_generates() -> None:
    """The deploy checks strings, hosts and URLs with generate's code itself, not a copy."""
    for name in ("MAX_TEXT", "control_char", "text_problem", "host_problem",
                 "without_userinfo", "url_problem"):
        assert getattr(validators, name) is getattr(text, name), name


@pytest.mark.parametrize(("copy", "original", "names"), [
    (text, terminal, ["_CONTROLS", "_ONE_LINE", "_LINES", "printable"]),
    (capacity, capacity_figures, ["running_limit"])])
def test_generate_copies_of_the_deploy_are_the_same(copy: object, original: object,
                                                    names: list[str]) -> None:
    """What generate copied from the deploy (it imports none of it) is the same code."""
    for name in names:
        mine, theirs = getattr(copy, name), getattr(original, name)
        if callable(mine):
            assert inspect.getsource(mine) == inspect.getsource(theirs), name
        else:
            assert mine == theirs, name


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
