"""Restart waves inside a host: which of its servers (re)start together.

The first server that restarts starts alone: on a new release it compiles the kernels into the
host's shared caches, and the others start from what it wrote once it is ready. Then the rest:
all at once, or ``per_wave`` at a time with ``--batch-instances``.

    >>> plan(["sglang-0.service", "sglang-1.service", "sglang-2.service"],
    ...      restarting={"sglang-0.service", "sglang-1.service", "sglang-2.service"})
    [['sglang-0.service'], ['sglang-1.service', 'sglang-2.service']]

The service stage learns which servers restart only as it runs, so it keeps a ``Waves``.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field


def wave_of(index: int, per_wave: int | None) -> int:
    """The wave of the ``index``-th server to restart (0-based): the first alone, then
    ``per_wave`` at a time (``None``: all the rest together).

        >>> [wave_of(i, 2) for i in range(6)], [wave_of(i, None) for i in range(4)]
        ([0, 1, 1, 2, 2, 3], [0, 1, 1, 1])
    """
    if index == 0:
        return 0
    return 1 if per_wave is None else 1 + (index - 1) // per_wave


@dataclass
class Waves:
    """The host's restarts as they happen (after an error, later servers stay as they are).

        waves = Waves(per_wave=2); waves.start("sglang-0.service")
        waves.due()            # ['sglang-0.service']: wait for it before the next starts
    """

    per_wave: int | None = None
    started: list[str] = field(default_factory=list)
    confirmed: int = 0  # started units known ready
    error: str | None = None

    def going(self) -> bool:
        """Whether later servers may still change (no wave failed)."""
        return self.error is None

    def start(self, unit: str) -> None:
        self.started.append(unit)

    def due(self, final: bool = False) -> list[str]:
        """The started units to wait for now: the open wave once it is whole (the next start
        would begin another wave), or whatever is open at the end (``final``)."""
        pending = self.started[self.confirmed:]
        last = len(self.started) - 1
        whole = bool(pending) and wave_of(last, self.per_wave) != wave_of(last + 1,
                                                                          self.per_wave)
        return pending if pending and (final or whole) else []

    def ready(self, units: Sequence[str]) -> None:
        self.confirmed += len(units)


def retired(installed: Sequence[str], keep: Collection[str]) -> list[str]:
    """The installed server units the profile no longer runs (they leave for good, first).

        >>> retired(["sglang-0.service", "sglang-1.service"], keep=["sglang-0.service"])
        ['sglang-1.service']
    """
    return [unit for unit in installed if unit not in keep]


def plan(units: Sequence[str], restarting: Collection[str],
         per_wave: int | None = None) -> list[list[str]]:
    """The waves of ``units`` (in launch order) when ``restarting`` must (re)start.

        >>> plan(["a", "b", "c", "d"], restarting={"b", "c", "d"}, per_wave=1)
        [['b'], ['c'], ['d']]
    """
    waves, found = Waves(per_wave), []
    for unit in units:
        if unit in restarting:
            waves.start(unit)
            due = waves.due()
            waves.ready(due)
            found += [due] if due else []
    rest = waves.due(final=True)
    return found + ([rest] if rest else [])
