"""What ``sglang-fleet status`` prints of its rows: a table that fits the terminal (host, state
and health always; the rest folded under a row when it does not fit, see ``layout``) and the
verdict: each unreachable host, server not serving and fatal GPU finding on a line of its
own, or one line saying what was found healthy. The verdict is the command's exit status.

    print(table(fleet.rows)); print("\\n".join(verdict(fleet.rows)))
    problems(fleet.rows)    # ['gpu2: unreachable: SSH: Could not connect ...'] -> exit 1
"""

from __future__ import annotations

from sglang_fleet.remote.terminal import printable
from sglang_fleet.report import layout
from sglang_fleet.report.status import SERVING, Row, problems

# In the order they join the table while it fits (the first three always).
COLUMNS = ("host", "unit", "state", "health", "router", "run", "queue", "tok/s", "accept", "cap",
           "gate tok/s", "GPU used/free GiB", "restarts", "since", "release", "model", "algo",
           "notes")
ESSENTIAL = ("host", "state", "health")


def _num(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def cells(row: Row) -> list[str]:
    """The row's cells, in the order of ``COLUMNS``."""
    if row.kind == "router":
        named = {"host": row.host, "unit": "router", "health": row.health,
                 "router": f"workers {row.router or '-'}", "notes": row.error}
        return [named.get(column, "") for column in COLUMNS]
    mem = "-" if row.gpu_used_mib is None else \
        f"{row.gpu_used_mib / 1024:.0f}/{(row.gpu_free_mib or 0) / 1024:.0f}"
    crash = [f"last crash: {row.last_crash}"] if row.last_crash else []
    notes = "; ".join([*([row.group] if row.group else []), *([row.error] if row.error else []),
                       *crash, *row.gpu_health,
                       *([f"not measured: {row.not_measured}"] if row.not_measured else [])])
    return [row.host, row.unit, row.state, row.health, row.router or "-", _num(row.running),
            _num(row.queued), _num(row.tokens_per_s), _num(row.accept_length, 2),
            _num(row.capacity), _num(row.measured_tokens_per_s), mem, _num(row.restarts),
            " ".join(row.since.split()[1:3]), row.release, row.model, row.algorithm, notes]


def table(rows: list[Row], width: int | None = None) -> str:
    """The rows in ``width`` columns (the terminal's by default): a server's empty cells as
    ``-`` (not known), a router's left empty (they do not apply to it); what the hosts said
    with its control characters shown as codes (``terminal``)."""
    return layout.fit(COLUMNS, [[printable(c) or ("" if r.kind == "router" else "-")
                                 for c in cells(r)] for r in rows],
                      essential=ESSENTIAL, width=width, shared_label="every server")


def verdict(rows: list[Row]) -> list[str]:
    """``unhealthy: ...`` for each problem, or the one line of what was checked and found
    healthy."""
    found = problems(rows)
    if found:
        return [printable(f"unhealthy: {problem}") for problem in found]
    servers = [r for r in rows if r.kind != "router"]  # rank 0s and group members
    routers = len(rows) - len(servers)
    return [f"healthy: {len({r.host for r in servers})} hosts answered over SSH; "
            f"{len(servers)} servers {SERVING}, /health 200, no fatal GPU finding"
            + (f"; {routers} routers answered" if routers else "")]
