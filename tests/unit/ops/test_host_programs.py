"""The host programs as hosts get them: the package ``sglang_fleet_remote`` alone on PYTHONPATH
(no sglang_fleet, no site-packages), each module imported and run with ``python -m``."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sglang_fleet.ops import host_programs as hostcode


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


class RecordedFiles:
    """pyinfra's ``files`` as ``upload`` uses it, recording what it would put on the host."""

    def __init__(self) -> None:
        self.put_sources: list[str] = []

    def directory(self, **kwargs: object) -> None:
        pass

    def put(self, *, src: str, **kwargs: object) -> str:
        self.put_sources.append(src)
        return src


@pytest.mark.parametrize("module", hostcode.MODULES)
def test_upload_puts_every_module_a_program_imports(module: str, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """``upload(module)`` alone, as a stage calls it, puts all the host needs to import it: the
    package holding only what was uploaded imports ``module`` (a program split in parts gets
    its parts), and ``upload`` returns the named module's own operation."""
    recorded = RecordedFiles()
    monkeypatch.setattr(hostcode, "files", recorded)
    [own] = hostcode.upload(module)
    assert str(own) == str(hostcode.SOURCE / f"{module}.py")
    assert len(recorded.put_sources) == len(set(recorded.put_sources))  # each file once
    target = tmp_path / hostcode.PACKAGE
    target.mkdir()
    for src in recorded.put_sources:
        shutil.copy(src, target / Path(src).name)
    result = host_python(tmp_path, "-c", f"import {hostcode.PACKAGE}.{module}")
    assert result.returncode == 0, result.stderr


def test_upload_returns_the_named_modules_operations_once_each(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The gate's upload names modules check_server imports too: each is put once, and the
    operations come back one per module named, in order (``[launcher] = upload(...)``)."""
    recorded = RecordedFiles()
    monkeypatch.setattr(hostcode, "files", recorded)
    named = ("capacity", "crash", "eta", "readiness", "check_server")
    ops = hostcode.upload(*named)
    assert [Path(str(op)).stem for op in ops] == list(named)
    put = [Path(src).stem for src in recorded.put_sources]
    assert put[0] == "__init__" and len(put) == len(set(put))
    assert set(put) == {"__init__", *hostcode.imports("check_server")}


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


def test_prune_caches_follows_no_name_or_link_the_service_made(pythonpath: Path,
                                                               tmp_path: Path) -> None:
    """Run as root (the deploy's user) on a cache the service user shaped: a directory named
    "x\\n.ssh" (a fact listing splits it into "x" and ".ssh"), a version-named link to a victim
    directory, a link to the victim inside a stale version, a name no version has. Only the
    stale versions' own directories go; the victim and root's working directory are intact."""
    victim, cwd, root = tmp_path / "victim", tmp_path / "cwd", tmp_path / "cache" / "release"
    for directory in (victim / "inside", cwd / ".ssh", root / "x\n.ssh", root / "0.5.21" / "a",
                      root / "0.5.23", root / "notes"):
        directory.mkdir(parents=True)
    (victim / "inside" / "keep").write_text("root's")
    (root / "0.5.10").symlink_to(victim)
    (root / "0.5.21" / "a" / "victim").symlink_to(victim)
    (root / "0.5.21" / "a" / "kernel.so").write_text("")
    (root / "0.5.22").write_text("a file, not a cache")
    result = subprocess.run(
        [sys.executable, "-S", "-m", f"{hostcode.PACKAGE}.prune_caches", "--root", str(root),
         "--keep=0.5.23"], capture_output=True, text=True, cwd=cwd,
        env={"PATH": os.environ["PATH"], "PYTHONPATH": str(pythonpath)})
    assert result.returncode == 0, result.stderr
    assert result.stdout == "removed 0.5.21\n"
    assert sorted(p.name for p in root.iterdir()) == ["0.5.10", "0.5.22", "0.5.23", "notes",
                                                      "x\n.ssh"]
    assert (victim / "inside" / "keep").read_text() == "root's" and (cwd / ".ssh").is_dir()


def test_prune_caches_leaves_a_linked_root_alone(pythonpath: Path, tmp_path: Path) -> None:
    """``release -> /`` (the service swapped its directory for a link): nothing is removed."""
    victim = tmp_path / "victim"
    (victim / "0.5.1").mkdir(parents=True)
    (tmp_path / "release").symlink_to(victim)
    result = host_python(pythonpath, "-m", f"{hostcode.PACKAGE}.prune_caches", "--root",
                         str(tmp_path / "release"), "--keep=0.5.23")
    assert result.returncode == 0 and result.stdout == "", result.stderr
    assert (victim / "0.5.1").is_dir()


def test_modules_that_import_each_other_are_each_listed_once() -> None:
    """check_server imports check_grpc for a grpc:// server, and check_grpc imports
    check_server's helpers back, each inside a function: both go up, once each, whichever is
    named."""
    for module, other in (("check_server", "check_grpc"), ("check_grpc", "check_server")):
        found = hostcode.imports(module)
        assert found[-1] == module and other in found and len(found) == len(set(found))
        assert {"gate_grpc", "gate_grpc_smoke", "gate_http"} <= set(found)
