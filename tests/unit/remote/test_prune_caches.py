"""The cache prune (remote/prune_caches.py) on trees the service user shapes: any depth, with
links anywhere in them, removed through descriptors without following one."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from sglang_fleet.remote import prune_caches

DEPTH = 1_200  # past Python's recursion limit (1,000) and a shell's usual 1,024 descriptors


def deep_tree(top: Path, victim: Path) -> None:
    """``top``/d/d/.../d, ``DEPTH`` levels, made one level at a time as the service user could
    (the whole path is longer than a path may be), with a file and a link to ``victim`` at the
    bottom and a file beside it."""
    top.mkdir()
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(DEPTH):
        os.mkdir("d", dir_fd=fd)
        fd, parent = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd), fd
        os.close(parent)
    os.symlink(victim, "victim", dir_fd=fd)
    os.close(os.open("kernel.so", os.O_WRONLY | os.O_CREAT, dir_fd=fd))
    os.mkdir("beside", dir_fd=fd)
    os.close(fd)


@pytest.fixture
def root(tmp_path: Path) -> Iterator[Path]:
    """The caches' directory, gone after the test whatever the prune left: pytest's own clean-up
    of its temporary directories (shutil.rmtree) recurses, and a deep tree left behind would
    fail every later pytest run of this user."""
    yield tmp_path / "release"
    subprocess.run(["rm", "-rf", "--", str(tmp_path / "release")], check=True)


def test_a_1200_deep_directory_is_removed_and_no_link_in_it_followed(tmp_path: Path,
                                                                     root: Path) -> None:
    victim = tmp_path / "victim"
    (victim / "inside").mkdir(parents=True)
    (victim / "inside" / "keep").write_text("root's")
    root.mkdir()
    deep_tree(root / "0.5.21", victim)
    (root / "0.5.23").mkdir()
    assert prune_caches.prune(str(root), {"0.5.23"}) == ["0.5.21"]
    assert [p.name for p in root.iterdir()] == ["0.5.23"]
    assert (victim / "inside" / "keep").read_text() == "root's"


def test_a_directory_moved_out_while_it_is_removed_stops_the_prune_there(
        tmp_path: Path, root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The service user moves a directory out of the cache while the prune is inside it: the
    way back up (``..``) is no longer the directory come down from, so the prune stops with an
    error instead of removing what is beside the directory's new place."""
    (root / "0.5.21" / "a" / "b").mkdir(parents=True)
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "keep").mkdir(parents=True)
    listed, b = prune_caches._names, (root / "0.5.21" / "a" / "b").stat().st_ino

    def moving(fd: int) -> list[str]:  # as b is listed, a goes elsewhere
        if os.fstat(fd).st_ino == b:
            (root / "0.5.21" / "a").rename(elsewhere / "a")
        return listed(fd)

    monkeypatch.setattr(prune_caches, "_names", moving)
    with pytest.raises(OSError, match=r"0\.5\.21: a was moved while it was being removed"):
        prune_caches.prune(str(root), set())
    assert sorted(p.name for p in elsewhere.iterdir()) == ["a", "keep"]
