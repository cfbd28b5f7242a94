"""A job's identity: the content of its input, one digest per shard of input lines.

The digest covers a shard's lines byte for byte, as they are read (one pass, no seek: an S3
stream or a pipe works), so a resumed job knows whether each finished shard was made from the
lines it now reads, whatever path or URL names the input.

    reading = Reading(index=3, first_line=3000)
    reading.add(b'{"messages": [...]}\\n')
    reading.hexdigest() == entry["input_blake2b"]
"""

from __future__ import annotations

import hashlib
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from sglang_fleet_generate.errors import GenerateError

DIGEST_KEY = "input_blake2b"
REDO_FLAG = "--redo-changed"


def new_digest() -> Any:
    # 16 bytes: collisions are out of reach, and blake2b is the cheapest hashlib digest per byte
    return hashlib.blake2b(digest_size=16)


@dataclass
class Reading:
    """The lines of one shard's range while they are read. A finished shard's lines are held
    in a spool file under --redo-changed, so they can still be sent once its digest differs."""

    index: int
    first_line: int  # from 0
    digest: Any = field(default_factory=new_digest)
    nbytes: int = 0
    held: IO[bytes] | None = None
    marked: list[int] = field(default_factory=list)  # id keys first seen here, undone on redo
    conflict: str | None = None

    def add(self, raw: bytes) -> None:
        self.digest.update(raw)
        self.nbytes += len(raw)
        if self.held is not None:
            self.held.write(raw)

    def hold(self, spool: Path) -> None:
        self.held = tempfile.TemporaryFile(dir=spool)  # noqa: SIM115 (closed by close())

    def held_lines(self) -> list[bytes]:
        """The lines held, in order (one shard's: --shard-size lines at most)."""
        if self.held is None:
            return []
        self.held.seek(0)
        return self.held.readlines()

    def close(self) -> None:
        if self.held is not None:
            self.held.close()

    def hexdigest(self) -> str:
        return str(self.digest.hexdigest())


def line_range(index: int, size: int) -> str:
    """Example: line_range(2, 1000) == "lines 2001-3000"."""
    return f"lines {index * size + 1}-{(index + 1) * size}"


def changed(entry: dict[str, Any], reading: Reading) -> str | None:
    """What differs between a finished shard and the lines read now for its range (None:
    nothing)."""
    name = entry["name"]
    if DIGEST_KEY not in entry:
        return f"{name} has no input digest (written by an older sglang-fleet)"
    if reading.nbytes == 0:
        return f"the input ends before these lines, which {name} was made from"
    if reading.hexdigest() != entry[DIGEST_KEY]:
        return (f"{name} was made from other lines (input digest {entry[DIGEST_KEY][:16]}, "
                f"now {reading.hexdigest()[:16]}): this is not the job's input")
    return reading.conflict


def refuse_changed(source: str, index: int, size: int, why: str, fix: str) -> GenerateError:
    """The error for the first changed shard: ``SOURCE: lines A-B (shard N): why`` and a fix."""
    return GenerateError(f"{source}: {line_range(index, size)} (shard {index}): {why}\n"
                         f"    fix: {fix}")


def conflict(lineno: int, ident: str, name: str) -> str:
    """A finished shard's record whose id a line earlier in the input now also has: keeping
    both would write the id twice."""
    return (f"line {lineno + 1} has id {ident!r}, which a line earlier in the input now also "
            f"has, yet {name} holds this line's record")
