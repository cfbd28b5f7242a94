"""What a roll did to each host, and the roll's report: a table of hosts (result, seconds,
seconds out of the routers, notes) and the fleet as it serves once the roll is over.

    print(table([Outcome("b200-01", "converged", 212.0, out_seconds=41.6)]))
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from sglang_fleet.errors import InputError
from sglang_fleet.report import status


@dataclass
class Outcome:
    """What happened to one host."""

    host: str
    result: str = "untouched"
    seconds: float = 0.0
    out_seconds: float | None = None  # out of the routers: from leaving until seen healthy again
    still_out: bool = False  # the roll ended with the host out of the routers
    notes: list[str] = field(default_factory=list)
    # What failed first on this host: the SSH error when it did not answer, else the router's
    # or its deploy's ("" when nothing failed)
    cause: str = ""
    # --batch-instances: each wave of its servers that left and came back (URLs, seconds out)
    waves: list[tuple[list[str], float]] = field(default_factory=list)

    def out_text(self) -> str:
        """The seconds out of the routers for the table: the longest any of its servers was
        out (the host whole, or its longest wave); "-" for a host never taken out.

            Outcome("h1", out_seconds=41.63).out_text()   # '41.6'
        """
        spans = [s for _, s in self.waves] + \
            ([self.out_seconds] if self.out_seconds is not None else [])
        if not spans:
            return "-"
        return f"{max(spans):.1f}" + (" still" if self.still_out else "")

    def wave_lines(self) -> list[str]:
        """One line per wave of its servers that left the routers on its own.

            Outcome("h1", waves=[(["http://h1:30000"], 12.3)]).wave_lines()
            # ['wave 1 out of the router 12.3 s: http://h1:30000']
        """
        return [f"wave {i} out of the router {seconds:.1f} s: {', '.join(urls)}"
                for i, (urls, seconds) in enumerate(self.waves, 1)]


def hosts_text(names: list[str], sep: str = ", ") -> str:
    """The hosts named, or the first and last when there are many (a roll of 100+ hosts).

        hosts_text([f"h{i:03}" for i in range(1, 121)])   # 'h001, h002, h003, …, h120 (120 hosts)'
    """
    return sep.join(names) if len(names) <= 12 else \
        f"{sep.join(names[:3])}{sep}…{sep}{names[-1]} ({len(names)} hosts)"


def table(outcomes: Iterable[Outcome]) -> str:
    """One row per host, its cause of failure and notes (waves, drains, kernels) under it."""
    rows = [f"{'host':<16}{'result':<44}{'seconds':>8}{'out of router (s)':>20}"]
    for outcome in outcomes:
        rows.append(f"{outcome.host:<16}{outcome.result:<44}{outcome.seconds:>8.0f}"
                    f"{outcome.out_text():>20}")
        cause = [f"cause: {outcome.cause}"] if outcome.cause else []
        rows += [f"{'':<16}{note}" for note in cause + outcome.wave_lines() + outcome.notes]
    return "\n".join(rows)


def fleet_lines(read_fleet: Callable[[], status.Fleet]) -> list[str]:
    """The fleet's capacity and job time as it serves once the roll is over (what each
    server's last passed gate measured, read as ``status`` reads it)."""
    try:
        return read_fleet().lines()
    except InputError as err:  # checked before the roll; said, should it change since
        return ["fleet: not read: " + "; ".join(f"{p.source}: {p.key}: {p.message}"
                                               for p in err.problems)]
