"""The simulator's wheels, built once per source and release into the lab's cache: every
``lab up`` offers them, and building one takes seconds that every test module would pay.

    simwheels.offer("0.5.23", simwheels.source_id(), www / "wheels")
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import time
from pathlib import Path

from sglang_fleet_lab.state import CACHE_DIR, locked

REPO_ROOT = Path(__file__).resolve().parents[4]
SIM = REPO_ROOT / "lab" / "sglang-sim"
# What the wheel is built from: its code and the product's data files it ships
# (lab/sglang-sim/pyproject.toml force-includes them).
SOURCES = (SIM / "pyproject.toml", SIM / "src", REPO_ROOT / "src" / "sglang_fleet" / "data")
# Another checkout's wheels (a clean clone beside this one) are kept while it uses them: the two
# would otherwise remove each other's and build them again on every lab up.
KEEP_SECONDS = 86400


def source_id() -> str:
    """A digest over every file the wheel is built from, names and bytes."""
    digest = hashlib.sha256()
    for top in SOURCES:
        files = [top] if top.is_file() else sorted(
            p for p in top.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
        for path in files:
            digest.update(f"{path.relative_to(REPO_ROOT)}\0".encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def offer(release: str, source: str, into: Path) -> Path:
    """Copy the simulator wheel imitating ``release``, built from ``source`` (``source_id``),
    into ``into``: from the cache, else built into it first. Under the cache's lock: one slot
    builds while the others wait, and no build removes a wheel being copied."""
    ids = CACHE_DIR / f"sim-wheels-{source}"
    home = ids / release
    with locked(CACHE_DIR / ".sim-wheels.lock"):
        cached = sorted(home.glob("*.whl"))
        complete = (home / ".complete").exists() and len(cached) == 1
        wheel = cached[0] if complete else _build(release, source, home)
        os.utime(ids)  # in use: see KEEP_SECONDS
        _remove_unused(ids)
        return Path(shutil.copy2(wheel, into / wheel.name))


def _build(release: str, source: str, home: Path) -> Path:
    shutil.rmtree(home, ignore_errors=True)
    home.mkdir(parents=True)
    subprocess.run(["uv", "build", "-q", "--wheel", "-o", str(home), str(SIM)], check=True,
                   env={**os.environ, "SGLANG_SIM_RELEASE": release})
    if source_id() == source:  # else a file changed during the build: not this source's wheel
        (home / ".complete").touch()
    return next(home.glob("*.whl"))


def _remove_unused(keep: Path) -> None:
    """Wheels of sources no lab up has offered for KEEP_SECONDS."""
    for old in CACHE_DIR.glob("sim-wheels-*"):
        if old != keep and time.time() - old.stat().st_mtime > KEEP_SECONDS:
            shutil.rmtree(old, ignore_errors=True)
