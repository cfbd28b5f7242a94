"""A roll's sizes given as a count or a percentage of the fleet (``--batch 10%``,
``--max-unavailable 5%``, ``--tolerate 2%``), and the journal that lets a stopped roll resume
where it stopped (``--resume``).

    amount("--batch", "10%", 120)          # 12
    amount("--tolerate", "2%", 120, 0, up=False)   # 2
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sglang_fleet.errors import InputError

_AMOUNT = re.compile(r"(\d{1,6})(%?)")


def amount(option: str, text: str | int, total: int, minimum: int = 1,
           up: bool = True) -> int:
    """``text`` (N, or P% of ``total``) as a count, at least ``minimum``; a percentage rounds
    ``up`` (a batch: never empty) or down (a budget: never more than asked).

        amount("--batch", "25%", 6)                    # 2
        amount("--max-unavailable", "25%", 6, up=False)   # 1
        amount("--batch", "3", 6)                      # 3
    """
    found = _AMOUNT.fullmatch(str(text).strip())
    if not found or (found[2] and not 0 < int(found[1]) <= 100):
        raise InputError.one(option, "", f"{str(text)[:40]!r} is neither a count nor a "
                             "percentage from 1% to 100%", f"e.g. {option} 2 or {option} 10%")
    number = int(found[1])
    if found[2]:
        exact = number * total / 100
        number = math.ceil(exact) if up else math.floor(exact)
        return max(number, minimum)
    if number < minimum:
        raise InputError.one(option, "", f"must be at least {minimum}, got {text}",
                             f"e.g. {option} {max(minimum, 1)}")
    return number


def state_dir() -> Path:
    """Where roll journals live: ``$XDG_STATE_HOME/sglang-fleet/rolls`` (the controller's)."""
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "sglang-fleet" / "rolls"


@dataclass
class Journal:
    """What a roll of one inventory with one ``--data`` has converged so far, written after
    every batch (whole or not at all, 0600): ``--resume`` skips those hosts.

        journal = Journal.of("inventories/b200.py", ["sglang.memory.page_size=64"])
        journal.converged(["b200-01"])
        Journal.of("inventories/b200.py", ["sglang.memory.page_size=64"]).load().done
        # ['b200-01']
    """

    path: Path
    inventory: str
    pairs: list[str]  # its --data
    done: list[str] = field(default_factory=list)  # converged, in the order they were
    skipped: dict[str, str] = field(default_factory=dict)  # host -> why it was skipped
    started: float = field(default_factory=time.time)
    ended: str = ""  # "", "complete" or "stopped: CAUSE"

    @classmethod
    def of(cls, inventory: str, data: Sequence[str]) -> Journal:
        """The journal of rolls of ``inventory`` with ``data`` (the same ``--data`` in the
        same order: another change is another roll)."""
        where = str(Path(inventory).resolve())
        key = hashlib.sha256(json.dumps([where, list(data)]).encode()).hexdigest()[:16]
        return cls(state_dir() / f"{Path(inventory).stem}-{key}.json", where, list(data))

    def load(self) -> Journal:
        """This roll's journal as the last roll left it; an InputError when there is none to
        resume (no roll of this inventory with this ``--data``, or it completed)."""
        try:
            record: dict[str, Any] = json.loads(self.path.read_text())
        except (OSError, ValueError):
            raise InputError.one("--resume", str(self.path), "no stopped roll of "
                                 f"{self.inventory} with --data {' '.join(self.pairs) or '(none)'}"
                                 " to resume", "run the roll without --resume (the same "
                                 "--data, in the same order, names the same roll)") from None
        if record.get("ended") == "complete":
            raise InputError.one("--resume", str(self.path), "the last roll of this inventory "
                                 "and --data completed: nothing to resume",
                                 "run the roll without --resume to roll it again")
        self.done = [str(n) for n in record.get("done", [])]
        self.started = float(record.get("started", self.started))
        return self

    def converged(self, names: Sequence[str]) -> None:
        self.done += [n for n in names if n not in self.done]
        for name in names:
            self.skipped.pop(name, None)
        self.save()

    def skip(self, reasons: dict[str, str]) -> None:
        self.skipped.update(reasons)
        self.save()

    def end(self, how: str) -> None:
        self.ended = how
        self.save()

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        part = self.path.with_suffix(".part")
        fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            json.dump({"inventory": self.inventory, "data": self.pairs, "done": self.done,
                       "skipped": self.skipped, "started": self.started,
                       "ended": self.ended}, out)
        part.replace(self.path)
