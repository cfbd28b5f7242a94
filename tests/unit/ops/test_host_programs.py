"""The host programs as hosts get them: each folder of host programs under its package name,
the packages above it empty, alone on PYTHONPATH (no site-packages), each module imported and
run with ``python -m``."""

from __future__ import annotations

import ast
import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sglang_fleet.ops import host_programs as hostcode

# What a host program may import beyond the standard library: what the venv that runs it has
# (the module, then the top-level names).
VENV_IMPORTS = {
    "sglang_fleet.remote.start_server": {"uvicorn"},  # the release's venv (SGLang's server)
    "sglang_fleet.stages.gate.host.gate_grpc": {"grpc", "grpc_health", "smg_grpc_proto",
                                                "google"},  # the release's venv, gRPC mode
    "sglang_fleet.stages.gate.host.gate_grpc_smoke": {"transformers"},
    "sglang_fleet.stages.weights.host.download_model": {"boto3", "botocore",
                                                        "huggingface_hub"},  # the tools venv
}


def modules(folder: str) -> list[str]:
    return [f"{folder}.{p.stem}" for p in sorted(hostcode._local(folder).glob("*.py"))
            if p.stem != "__init__"]


ALL = [m for folder in hostcode.folders() for m in modules(folder)]


def uploaded(root: Path, folder: str) -> Path:
    """The host's PYTHONPATH as ``upload(folder)`` leaves it, recorded and replayed into
    ``root``: only what the upload puts there."""
    recorded = RecordedFiles(root)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(hostcode, "files", recorded)
        hostcode.upload(folder)
    return root


class RecordedFiles:
    """pyinfra's ``files`` as ``upload`` uses it, writing what it would put on the host under
    ``root`` (its PYTHONPATH)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.synced: list[str] = []

    def _here(self, dest: str) -> Path:
        return self.root / Path(dest).relative_to(hostcode.PYTHONPATH)

    def put(self, *, src: str | io.StringIO, dest: str, **kwargs: object) -> str:
        target = self._here(dest)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(src.getvalue() if isinstance(src, io.StringIO)
                          else Path(src).read_text())
        return dest

    def sync(self, *, src: str, dest: str, exclude_dir: list[str], **kwargs: object) -> str:
        assert kwargs["delete"] is True and "__pycache__" in exclude_dir
        self.synced.append(dest)
        for path in Path(src).glob("*.py"):
            self.put(src=str(path), dest=f"{dest}/{path.name}")
        return dest


def host_python(pythonpath: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The system python of a host: standard library only (``-S``: no site-packages), run from
    a directory that holds nothing importable."""
    return subprocess.run([sys.executable, "-S", *args], capture_output=True, text=True,
                          cwd=pythonpath.parent, env={"PATH": os.environ["PATH"],
                                                      "PYTHONPATH": str(pythonpath)})


@pytest.fixture(scope="module")
def pythonpath(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every folder of host programs uploaded, as the deploy leaves a host."""
    root = tmp_path_factory.mktemp("pythonpath") / "pythonpath"
    for folder in hostcode.folders():
        uploaded(root, folder)
    return root


@pytest.mark.parametrize("module", ALL)
def test_each_host_program_imports_the_standard_library_its_folder_and_remote(
        module: str) -> None:
    """A folder is uploaded whole and alone: its modules import the standard library, their
    own folder (relatively), ``sglang_fleet.remote`` (the shared folder, uploaded with each),
    and what the venv that runs them has (VENV_IMPORTS), nothing else of sglang_fleet."""
    folder, _, name = module.rpartition(".")
    tree = ast.parse((hostcode._local(folder) / f"{name}.py").read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level:
            assert node.level == 1, f"{module}: relative import above its folder"
        elif isinstance(node, ast.ImportFrom | ast.Import):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) \
                else [node.module or ""]
            found |= {n for n in names if n.split(".")[0] not in sys.stdlib_module_names}
    allowed = {"sglang_fleet.remote", *(f"sglang_fleet.remote.{m.rpartition('.')[2]}"
                                        for m in modules(hostcode.SHARED))}
    if folder == hostcode.SHARED:
        allowed = set()
    venv = VENV_IMPORTS.get(module, set())
    assert {n for n in found - allowed if n.split(".")[0] not in venv} == set()


@pytest.mark.parametrize("folder", hostcode.folders())
def test_upload_puts_the_folder_whole_with_remote_and_empty_packages_above(
        folder: str, tmp_path: Path) -> None:
    """``upload(folder)`` alone, as a deploy calls it, puts all the host needs to import every
    module of the folder: the folder, ``remote/``, and empty packages above (nothing of the
    controller's sglang_fleet/__init__.py)."""
    root = uploaded(tmp_path / "pythonpath", folder)
    assert (root / "sglang_fleet" / "__init__.py").read_text() == ""
    for module in modules(folder):
        if module in VENV_IMPORTS:
            continue  # imports its venv's packages at the top
        result = host_python(root, "-c", f"import {module}")
        assert result.returncode == 0, (module, result.stderr)


def test_upload_returns_the_watched_programs_operations(tmp_path: Path) -> None:
    recorded = RecordedFiles(tmp_path)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(hostcode, "files", recorded)
        ops = hostcode.upload(hostcode.SHARED, "sglang_fleet.remote.start_server")
    assert [str(op) for op in ops] == [hostcode.module_file("sglang_fleet.remote.start_server")]
    assert recorded.synced == [f"{hostcode.PYTHONPATH}/sglang_fleet/remote"]


def test_every_component_folder_is_a_host_folder() -> None:
    assert hostcode.folders() == (
        "sglang_fleet.remote", "sglang_fleet.stages.compiled.host",
        "sglang_fleet.stages.gate.host", "sglang_fleet.stages.router.host",
        "sglang_fleet.stages.warmup.host", "sglang_fleet.stages.weights.host")


def test_check_server_runs_with_python_m(pythonpath: Path) -> None:
    result = host_python(pythonpath, "-m", "sglang_fleet.stages.gate.host.check_server",
                         "--help")
    assert result.returncode == 0, result.stderr
    assert "--soak-requests" in result.stdout


def test_start_server_says_how_to_use_it(pythonpath: Path) -> None:
    result = host_python(pythonpath, "-m", "sglang_fleet.remote.start_server")
    assert result.returncode == 1
    assert "usage: python -m sglang_fleet.remote.start_server MODULE" in result.stderr


def test_program_names_only_host_programs() -> None:
    assert hostcode.program("/usr/bin/python3", "sglang_fleet.remote.capacity")[:2] == [
        "/usr/bin/env", f"PYTHONPATH={hostcode.PYTHONPATH}"]
    for module in ("sglang_fleet.stages.weights.deploy", "sglang_fleet.remote.nothing",
                   "capacity"):
        with pytest.raises(ValueError, match="is not a host program"):
            hostcode.program("/usr/bin/python3", module)


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
        [sys.executable, "-S", "-m", "sglang_fleet.remote.prune_caches", "--root", str(root),
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
    result = host_python(pythonpath, "-m", "sglang_fleet.remote.prune_caches", "--root",
                         str(tmp_path / "release"), "--keep=0.5.23")
    assert result.returncode == 0 and result.stdout == "", result.stderr
    assert (victim / "0.5.1").is_dir()
