"""The controller's side of sharing compiled kernels in a roll: files in the roll's directory
(root's, 0700; files 0600) through which its hosts exchange them: what a host shared (an offer
and its archive), what each host said it needs while it was prepared (wants), and a note per
host for the roll's table.

    offer(roll_dir, {"digest": digest, "host": "b200-01", "files": 40, "sha256": ...})
    offers(roll_dir)             # what hosts shared so far, in order
    notes(roll_dir, "b200-02")   # ['kernels: received from b200-01 (41 MB, 3.2 s)']
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from sglang_fleet.fleet.roll_directory import RollDirectory, read_object

STAGE = "caches"  # in the roll's directory: archives, offers, notes


def stage(roll_dir: RollDirectory) -> Path:
    """The roll directory's staging directory for kernels (root's, 0700)."""
    where = roll_dir.directory / STAGE
    where.mkdir(mode=0o700, exist_ok=True)
    return where


def offers(roll_dir: RollDirectory) -> list[dict[str, Any]]:
    """What hosts shared so far (``<digest>.json``), in the order they shared it."""
    paths = sorted(stage(roll_dir).glob("*.json"), key=lambda p: p.stat().st_mtime)
    return [offer for path in paths if (offer := read_object(path)) is not None]


def claim(roll_dir: RollDirectory, digest: str) -> bool:
    """This run shares ``digest`` (and no other run of the roll does)."""
    try:
        os.close(os.open(stage(roll_dir) / f"{digest}.claim",
                         os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except FileExistsError:
        return False
    return True


def archive(roll_dir: RollDirectory, digest: str) -> Path:
    """Where the archive of the kernels shared for ``digest`` is kept."""
    return stage(roll_dir) / f"{digest}.tar.gz"


def _write(path: Path, data: dict[str, Any]) -> None:
    part = path.with_name(f".{path.name}.part")
    with os.fdopen(os.open(part, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as out:
        json.dump(data, out)
    part.replace(path)


def offer(roll_dir: RollDirectory, data: dict[str, Any]) -> None:
    """Publish what this host shares (or why it could not) for the hosts after it."""
    _write(stage(roll_dir) / f"{data['digest']}.json", data)


def want(roll_dir: RollDirectory, name: str, digest: str, needs: bool) -> None:
    """What a host said while it was prepared: its digest, and whether it lacks the kernels."""
    _write(stage(roll_dir) / f"{name}.wants", {"digest": digest, "needs": needs})


def wants(roll_dir: RollDirectory) -> dict[str, dict[str, Any]]:
    """What the hosts said while they were prepared, by host."""
    return {path.name.removesuffix(".wants"): said for path in stage(roll_dir).glob("*.wants")
            if (said := read_object(path)) is not None}


def note(roll_dir: RollDirectory, name: str, text: str) -> None:
    """A line for the roll's table about this host's kernels."""
    _write(stage(roll_dir) / f"{name}.note", {"note": text})


def notes(roll_dir: RollDirectory, name: str) -> list[str]:
    """The roll's: what was noted about ``name``'s kernels.

        notes(roll_dir, "b200-02")   # ['kernels: received from b200-01 (41 MB, 3.2 s)']
    """
    found = read_object(stage(roll_dir) / f"{name}.note") or {}
    return [f"kernels: {found['note']}"] if "note" in found else []
