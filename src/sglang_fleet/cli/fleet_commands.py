"""``sglang-fleet roll`` and ``status``: a fleet of an inventory, rolled onto a new release
through its router, or read.

    sglang-fleet roll inventories/b200.py --batch 1
    sglang-fleet status inventories/b200.py --json
"""

from __future__ import annotations

import argparse
import json


def cmd_roll(args: argparse.Namespace) -> int:
    """Rolling redeploy through the router (see sglang_fleet.rollout.roll)."""
    from sglang_fleet.rollout import roll

    return roll.main(args.inventory, args.data, args.batch, args.drain_timeout,
                     args.health_timeout, args.batch_instances)


def cmd_status(args: argparse.Namespace) -> int:
    """One row per server instance and router of an inventory (see sglang_fleet.report.status)."""
    from sglang_fleet.report import status

    fleet = status.collect(args.inventory)
    if args.json:
        print(json.dumps(fleet.as_json(), indent=2))
    else:
        print("\n".join([status.table(fleet.rows), "", *fleet.lines()]))
    return 0


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The fleet commands' parsers, in the order ``--help`` lists them."""
    p = sub.add_parser("roll", help="rolling redeploy through the router, stopping at the "
                       "first failure and putting that host's last good release back")
    p.add_argument("inventory", help="a pyinfra inventory, e.g. inventories/b200.py")
    p.add_argument("--batch", type=int, default=1, help="hosts at a time (default 1)")
    p.add_argument("--batch-instances", type=int, default=None, metavar="K",
                   help="a host's servers restarted K at a time (after the first, alone), "
                   "only those out of the router, so the host keeps serving (default: the "
                   "host leaves the router whole)")
    p.add_argument("--data", action="append", default=[], metavar="KEY=VALUE",
                   help="pyinfra data for the deploy, e.g. sglang.memory.page_size=64")
    p.add_argument("--drain-timeout", type=float, default=600,
                   help="seconds to wait for a host's requests in flight (default 600)")
    p.add_argument("--health-timeout", type=float, default=300,
                   help="seconds for the router to see a host healthy again (default 300)")
    p.set_defaults(func=cmd_roll)

    p = sub.add_parser("status", help="one row per server and router of an inventory: unit, "
                       "release, health, load, GPU memory and health, router (read-only)")
    p.add_argument("inventory", help="a pyinfra inventory, e.g. inventories/b200.py")
    p.add_argument("--json", action="store_true", help="print the rows as JSON")
    p.set_defaults(func=cmd_status)
