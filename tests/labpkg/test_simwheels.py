"""The simulator's wheels, kept in the lab's cache: built once per source and release, and
built again when any file they are built from changes."""

from __future__ import annotations

import os
import time
import tomllib
import zipfile
from pathlib import Path

import pytest

from sglang_fleet_lab import simwheels


def test_the_source_id_follows_every_file_it_is_built_from(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    code, data = tmp_path / "src", tmp_path / "data"
    (code / "pkg").mkdir(parents=True)
    data.mkdir()
    (code / "pkg" / "a.py").write_text("x = 1\n")
    (data / "flags.json").write_text("{}")
    monkeypatch.setattr(simwheels, "REPO_ROOT", tmp_path)
    monkeypatch.setattr(simwheels, "SOURCES", (code, data))
    first = simwheels.source_id()
    (code / "pkg" / "__pycache__").mkdir()
    (code / "pkg" / "__pycache__" / "a.pyc").write_bytes(b"\0")
    assert simwheels.source_id() == first  # bytecode is not a source
    (data / "flags.json").write_text('{"--tp": 1}')
    assert simwheels.source_id() != first
    (data / "flags.json").write_text("{}")
    (code / "pkg" / "a.py").rename(code / "pkg" / "b.py")
    assert simwheels.source_id() != first  # a name is part of it


def test_every_file_the_wheel_includes_is_a_source() -> None:
    """A file lab/sglang-sim/pyproject.toml adds to the wheel from outside the simulator's
    tree is hashed too, else a change to it would leave a stale wheel in the cache."""
    project = tomllib.loads((simwheels.SIM / "pyproject.toml").read_text())
    included = project["tool"]["hatch"]["build"]["targets"]["wheel"]["force-include"]
    assert included
    for relative in included:
        path = (simwheels.SIM / relative).resolve()
        assert any(path == top or top in path.parents for top in simwheels.SOURCES), relative


def offered(release: str, source: str, tmp: Path) -> Path:
    into = tmp / "www" / source
    into.mkdir(parents=True, exist_ok=True)
    return simwheels.offer(release, source, into)


def test_a_wheel_is_built_once_per_source_and_release(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path / "cache"
    monkeypatch.setattr(simwheels, "CACHE_DIR", cache)
    monkeypatch.setattr(simwheels, "source_id", lambda: "s1")
    wheel = offered("0.5.12", "s1", tmp_path)
    assert wheel.name == "sglang_sim-0.5.12-py3-none-any.whl"
    assert wheel.parent == tmp_path / "www" / "s1"
    with zipfile.ZipFile(wheel) as whl:
        assert "sglang_sim/releases.json" in whl.namelist()
    cached = cache / "sim-wheels-s1" / "0.5.12"
    built = (cached / wheel.name).stat().st_mtime_ns
    offered("0.5.12", "s1", tmp_path)
    assert (cached / wheel.name).stat().st_mtime_ns == built  # from the cache
    (cached / ".complete").unlink()  # a build cut short is built again
    offered("0.5.12", "s1", tmp_path)
    assert (cached / wheel.name).stat().st_mtime_ns != built
    offered("0.5.12", "s2", tmp_path)  # its source changed during the build: not kept
    assert not (cache / "sim-wheels-s2" / "0.5.12" / ".complete").exists()
    assert sorted(p.name for p in cache.glob("sim-wheels-*")) == ["sim-wheels-s1", "sim-wheels-s2"]
    stale = time.time() - simwheels.KEEP_SECONDS - 60  # s1 unused for a day: its wheels go
    os.utime(cache / "sim-wheels-s1", (stale, stale))
    offered("0.5.12", "s2", tmp_path)
    assert [p.name for p in cache.glob("sim-wheels-*")] == ["sim-wheels-s2"]
