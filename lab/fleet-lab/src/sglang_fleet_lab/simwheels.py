"""The simulator's wheels, built once per source and release into the lab's cache: every
``lab up`` offers them, and building one takes seconds that every test module would pay.

    wheel = simwheels.wheel("0.5.23", simwheels.source_id())
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
from pathlib import Path

from sglang_fleet_lab.state import CACHE_DIR

REPO_ROOT = Path(__file__).resolve().parents[4]
SIM = REPO_ROOT / "lab" / "sglang-sim"
# What the wheel is built from: its code and the product's data files it ships
# (lab/sglang-sim/pyproject.toml force-includes them).
SOURCES = (SIM / "pyproject.toml", SIM / "src", REPO_ROOT / "src" / "sglang_fleet" / "data")


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


def wheel(release: str, source: str) -> Path:
    """The simulator wheel imitating ``release``, built from ``source`` (``source_id``):
    from the cache, else built into it (one slot builds while the others wait)."""
    home = CACHE_DIR / f"sim-wheels-{source}" / release
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    with (CACHE_DIR / ".sim-wheels.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        built = sorted(home.glob("*.whl"))
        if (home / ".complete").exists() and len(built) == 1:
            return built[0]
        shutil.rmtree(home, ignore_errors=True)
        home.mkdir(parents=True)
        subprocess.run(["uv", "build", "-q", "--wheel", "-o", str(home), str(SIM)], check=True,
                       env={**os.environ, "SGLANG_SIM_RELEASE": release})
        (home / ".complete").touch()
        for old in CACHE_DIR.glob("sim-wheels-*"):  # built from sources no checkout has now
            if old.name != f"sim-wheels-{source}":
                shutil.rmtree(old, ignore_errors=True)
        return next(home.glob("*.whl"))
