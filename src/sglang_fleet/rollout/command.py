"""``sglang-fleet roll``: the roll the command line asks for (its plan, bounds and journal),
run, and its report: the table, the fleet, and how to go on when it stopped.

    sys.exit(main("inventories/b200.py", [], batch="10%", max_unavailable="10%"))
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from functools import partial
from typing import Any

from sglang_fleet.errors import InputError
from sglang_fleet.rollout.outcome import hosts_text
from sglang_fleet.rollout.planning import data_warning, plan
from sglang_fleet.rollout.roll import Roll, say
from sglang_fleet.rollout.router_api import RouterError
from sglang_fleet.rollout.runs import pyinfra
from sglang_fleet.rollout.scale import Journal, amount


def _seconds(option: str, value: float) -> None:
    if not math.isfinite(value) or not 0 <= value <= 86400:
        raise InputError.one(option, "", f"must be seconds from 0 to 86400, got {value}",
                             f"e.g. {option} 600")


def make(inventory: str, data: Sequence[str], batch: int | str = 1,
         drain_timeout: float = 600, health_timeout: float = 300,
         batch_instances: int | None = None, max_unavailable: str | None = None,
         tolerate: str = "0", resume: bool = False, parallel: int | None = None) -> Roll:
    """The roll the CLI asks for: its plan (with ``resume``, without the hosts the stopped
    roll of the same inventory and ``--data`` converged), its bounds, its journal.

        make("inventories/b200.py", [], batch="10%", max_unavailable="10%", tolerate="2%")
    """
    _seconds("--drain-timeout", drain_timeout)
    _seconds("--health-timeout", health_timeout)
    journal = Journal.of(inventory, data)
    if resume:
        journal.load()
    found = plan(inventory, data, batch, batch_instances, done=journal.done)
    hosts = len(found.unit_of)
    budget = None if max_unavailable is None else amount("--max-unavailable",
                                                         max_unavailable, hosts)
    largest = max((len(b) for b in found.batches), default=0)
    if budget is not None and budget < largest:
        raise InputError.one("--max-unavailable", "", f"{max_unavailable} allows {budget} "
                             f"host{'s' if budget != 1 else ''} out at once, fewer than a batch "
                             f"({largest} hosts)", f"give at least {largest}, or a smaller "
                             "--batch")
    return Roll(found, drain_timeout, health_timeout,
                run=partial(pyinfra, parallel=parallel) if parallel else pyinfra,
                max_unavailable=budget, tolerate=amount("--tolerate", tolerate, hosts, 0),
                journal=journal)


def resume_hint(roll: Roll) -> str:
    """How to go on where the roll stopped (its journal kept what converged)."""
    data = "".join(f" --data {d}" for d in roll.plan.data)
    return f"sglang-fleet roll {roll.plan.inventory}{data} --resume"


def main(inventory: str, data: Sequence[str], **options: Any) -> int:
    roll = make(inventory, data, **options)
    warning = data_warning(data)
    if warning:
        say(warning)
    try:
        ok = roll()
    except RouterError as err:
        say(f"stopped: {err}")
        ok = False
    print(roll.report(), flush=True)  # before the fleet is read: it takes a moment
    print("\n".join(roll.fleet_lines()))
    if warning:
        print(f"roll: {warning}", file=sys.stderr)
    if roll.skipped and all(o.result.startswith(("converged", "skipped"))
                            for o in roll.outcomes.values()):
        print(f"roll: every host converged but {len(roll.skipped)} skipped "
              f"({hosts_text(list(roll.skipped))}: causes above); once they answer, "
              f"{resume_hint(roll)} rolls them", file=sys.stderr)
    elif not ok:
        cause = roll.cause()
        print(f"roll: stopped at the first failure{' (' + cause + ')' if cause else ''}; "
              f"hosts after it were not touched; {resume_hint(roll)} goes on from there",
              file=sys.stderr)
    return 0 if ok else 1
