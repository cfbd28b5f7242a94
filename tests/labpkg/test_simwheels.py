"""The simulator's wheels, kept in the lab's cache: built once per source and release, and
built again when any file they are built from changes."""

from __future__ import annotations

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


def test_a_wheel_is_built_once_per_source_and_release(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(simwheels, "CACHE_DIR", tmp_path)
    wheel = simwheels.wheel("0.5.12", "s1")
    assert wheel.name == "sglang_sim-0.5.12-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as whl:
        assert "sglang_sim/releases.json" in whl.namelist()
    built = wheel.stat().st_mtime_ns
    assert simwheels.wheel("0.5.12", "s1").stat().st_mtime_ns == built  # from the cache
    (wheel.parent / ".complete").unlink()  # a build cut short is built again
    assert simwheels.wheel("0.5.12", "s1").stat().st_mtime_ns != built
    simwheels.wheel("0.5.12", "s2")  # a new source: the old one's wheels go
    assert [p.name for p in tmp_path.glob("sim-wheels-*")] == ["sim-wheels-s2"]
