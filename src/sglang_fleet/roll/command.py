"""``sglang-fleet roll``: the roll the command line asks for (its plan, bounds and journal),
run, and its report: the table, the fleet, and how to go on when it stopped.

    sys.exit(main("inventories/b200.py", [], batch="10%", max_unavailable="10%"))
"""

from __future__ import annotations

import math
import shlex
import sys
from collections.abc import Sequence
from functools import partial
from typing import Any

from sglang_fleet.errors import InputError
from sglang_fleet.fleet.router_api import RouterError
from sglang_fleet.roll.outcome import hosts_text
from sglang_fleet.roll.planning import data_warning, plan
from sglang_fleet.roll.roll import Roll, say
from sglang_fleet.roll.runs import pyinfra
from sglang_fleet.roll.scale import Journal, amount


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
                                                         max_unavailable, hosts, up=False)
    largest = max((len(b) for b in found.batches), default=0)
    if budget is not None and budget < largest:
        raise InputError.one("--max-unavailable", "", f"{max_unavailable} allows {budget} "
                             f"host{'s' if budget != 1 else ''} out at once, fewer than a batch "
                             f"({largest} hosts)", f"give at least {largest}, or a smaller "
                             "--batch")
    tolerated = amount("--tolerate", tolerate, hosts, 0, up=False)
    if tolerated == 0 and tolerate.strip() not in ("0", ""):
        say(f"warning: --tolerate {tolerate} of {hosts} hosts is none: any unreachable host or "
            "failed preparation stops the roll (give a count, e.g. --tolerate 1)")
    try:
        journal.save()  # here, so that a journal it cannot write stops it before any change
    except OSError as err:
        raise InputError.one(str(journal.path), "", f"cannot write the roll's journal: "
                             f"{err.strerror or err}", "set XDG_STATE_HOME to a directory "
                             "root can write (the journal lets --resume go on)") from None
    return Roll(found, drain_timeout, health_timeout,
                run=partial(pyinfra, parallel=parallel, tolerant=tolerated > 0),
                max_unavailable=budget, tolerate=tolerated, journal=journal)


# Options a resumed roll repeats, with the value that needs no repeating.
_REPEATED = {"batch": "1", "max_unavailable": None, "tolerate": "0", "parallel": None,
             "batch_instances": None, "drain_timeout": 600, "health_timeout": 300}


def resume_hint(roll: Roll, options: dict[str, Any]) -> str:
    """The command that goes on where the roll stopped (its journal kept what converged):
    the same inventory, ``--data`` and options, quoted for a shell.

        resume_hint(roll, {"batch": "10%"})
        # 'sglang-fleet roll inventories/b200.py --batch 10% --resume'
    """
    argv = ["sglang-fleet", "roll", roll.plan.inventory,
            *(a for d in roll.plan.data for a in ("--data", d))]
    for key, default in _REPEATED.items():
        value = options.get(key, default)
        if value is not None and str(value) != str(default):
            argv += [f"--{key.replace('_', '-')}", f"{value:g}" if isinstance(value, float)
                     else str(value)]
    return shlex.join([*argv, "--resume"])


def run(roll: Roll, warning: str | None) -> bool:
    """The roll, its ``--data`` warning (``planning.data_warning``) said first; a router that
    fails mid-way stops it.

        ok = run(roll, data_warning(roll.plan.data))
    """
    if warning:
        say(warning)
    try:
        return roll()
    except RouterError as err:
        say(f"stopped: {err}")
        return False


def main(inventory: str, data: Sequence[str], **options: Any) -> int:
    roll = make(inventory, data, **options)
    warning = data_warning(data)
    ok = run(roll, warning)
    print(roll.report(), flush=True)  # before the fleet is read: it takes a moment
    print("\n".join(roll.fleet_lines()))
    if warning:
        print(f"roll: {warning}", file=sys.stderr)
    if roll.skipped and all(o.result.startswith(("converged", "skipped"))
                            for o in roll.outcomes.values()):
        print(f"roll: every host converged but {len(roll.skipped)} skipped "
              f"({hosts_text(list(roll.skipped))}: causes above); once they answer, "
              f"{resume_hint(roll, options)} rolls them", file=sys.stderr)
    elif not ok:
        cause = roll.cause()
        print(f"roll: stopped at the first failure{' (' + cause + ')' if cause else ''}; "
              f"hosts after it were not touched; {resume_hint(roll, options)} goes on from "
              "there",
              file=sys.stderr)
    return 0 if ok else 1
