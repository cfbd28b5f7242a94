"""``sglang-fleet roll`` and ``status``: a fleet of an inventory, rolled onto a new release
through its router, or read.

    sglang-fleet roll inventories/b200.py --batch 1
    sglang-fleet status inventories/b200.py --json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from sglang_fleet.cli import output, usage
from sglang_fleet.errors import InputError

# status: a host unreachable over SSH, or a server not serving (beside 1 for an input problem:
# either way the fleet was not found as it should be).
UNHEALTHY = 1

if TYPE_CHECKING:
    from sglang_fleet.report.status import Fleet
    from sglang_fleet.roll.roll import Roll


def cmd_roll(args: argparse.Namespace) -> int:
    """Rolling redeploy through the router (see sglang_fleet.roll.roll)."""
    from sglang_fleet.roll import command

    options = {"batch": args.batch, "drain_timeout": args.drain_timeout,
               "health_timeout": args.health_timeout, "batch_instances": args.batch_instances,
               "max_unavailable": args.max_unavailable, "tolerate": args.tolerate,
               "resume": args.resume, "parallel": args.parallel}
    if not args.json:
        return command.main(args.inventory, args.data, **options)
    made = command.make(args.inventory, args.data, **options)
    ok, document = roll_as_json(made)
    print(json.dumps(document, indent=2))
    return 0 if ok else 1


def roll_as_json(made: Roll) -> tuple[bool, dict[str, Any]]:
    """The roll as ``command.main`` runs it, its lines on stderr, and what it did as one JSON
    object (``errors`` empty: an input problem stops a roll before it starts)."""
    from sglang_fleet.roll import command
    from sglang_fleet.roll.outcome import fleet_lines
    from sglang_fleet.roll.planning import data_warning

    warning = data_warning(made.plan.data)
    fleet: Fleet | None = None
    with contextlib.redirect_stdout(sys.stderr):
        ok = command.run(made, warning)
        print(made.report(), flush=True)
        try:
            fleet = made.read_fleet()
            unread = None
        except InputError as err:
            unread = err
        print("\n".join(fleet.lines() if fleet is not None
                        else fleet_lines(lambda: _raise(unread))))
    return ok, {
        "ok": ok,
        "cause": made.cause(),  # the first failure's, with its host ("" when none)
        "skipped": made.skipped,  # host -> why (unreachable, its preparation failed)
        "hosts": [asdict(outcome) for outcome in made.outcomes.values()],
        "fleet": fleet.as_json()[-1] if fleet is not None
        else {"kind": "fleet", "not_read": output.as_json(unread.problems if unread else [])},
        "warnings": [{"source": "--data", "key": "", "problem": warning.removeprefix(
            "warning: "), "fix": ""}] if warning else [],
        "errors": []}


def _raise(error: InputError | None) -> Fleet:
    assert error is not None
    raise error


def cmd_status(args: argparse.Namespace) -> int:
    """One row per server instance and router of an inventory (see sglang_fleet.report.status),
    then the verdict: UNHEALTHY (1) when a host is unreachable or a server is not serving."""
    from sglang_fleet.fleet.inventory import parse_data
    from sglang_fleet.report import layout, status, status_view

    fleet = status.collect(args.inventory, parse_data(args.data))
    if args.json:
        print(json.dumps(fleet.as_json(), indent=2))
    else:
        print("\n".join([status_view.table(fleet.rows), "", *layout.wrap(
            [*fleet.lines(), *status_view.verdict(fleet.rows)])]))
    return UNHEALTHY if fleet.problems() else 0


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The fleet commands' parsers, in the order ``--help`` lists them."""
    inventory_help = "a pyinfra inventory, e.g. inventories/b200.py"
    p = usage.command(
        sub, "roll", help="rolling redeploy through the router, stopping at the first failure "
        "and putting that host's last good release back",
        description="Redeploy the serving hosts of an inventory --batch at a time through "
        "its router: each batch leaves the router only for its restart and gate, and goes "
        "back before the next one leaves. The first failure stops the roll and puts that "
        "batch's last good release back; later hosts are not touched. Every host's change is "
        "checked, and every host must answer over SSH, before the first one is touched; the "
        "roll says host K of N as it goes, and a failure's first cause. Exit status: 0 every "
        "host converged, 1 an input problem or a failure, 2 a usage error. With --json, the "
        "runs' output goes to stderr and stdout is one JSON object (or the errors: "
        "{\"errors\": [...]}).",
        examples=["sglang-fleet roll inventories/b200.py",
                  "sglang-fleet roll inventories/b200.py --batch 2 "
                  "--data sglang.memory.max_running_requests=48",
                  "sglang-fleet roll inventories/b200.py --batch-instances 2 --json",
                  "sglang-fleet roll inventories/b200.py --batch 10% --max-unavailable 12% "
                  "--tolerate 2%",
                  "sglang-fleet roll inventories/b200.py --batch 10% --resume"],
        exit_codes=["0  every host converged",
                    "1  a host failed (its first cause named: the host unreachable over SSH, "
                    "the router, its deploy) or an input problem",
                    "2  a usage error"])
    usage.files(p.add_argument("inventory", help=inventory_help))
    p.add_argument("--batch", type=usage.share(1, "--batch 10%"), default="1",
                   metavar="N|P%", help="hosts at a time, a multi-node group counting as one: a "
                   "number, or a percentage of them rounded up (default 1)")
    p.add_argument("--max-unavailable", type=usage.share(1, "--max-unavailable 10%"),
                   default=None, metavar="N|P%", help="hosts that may be out of service at "
                   "once: the batch's and those already unhealthy in a router; a batch that "
                   "would go past it stops the roll (default: the batch's own, so every other "
                   "host must be serving)")
    p.add_argument("--tolerate", type=usage.share(0, "--tolerate 2%"), default="0",
                   metavar="N|P%", help="hosts that may fail their preparation or not answer "
                   "over SSH at the start: skipped and reported, serving as they were, and left "
                   "for --resume (a percentage rounds down; default 0: any such host stops the "
                   "roll)")
    p.add_argument("--resume", action="store_true", help="go on where the last roll of this "
                   "inventory with the same --data stopped: the hosts it converged are not "
                   "rolled again (its journal is under $XDG_STATE_HOME/sglang-fleet/rolls)")
    p.add_argument("--parallel", type=usage.count(1, "--parallel 50"), default=None,
                   metavar="N", help="hosts each pyinfra run works on at once (default: "
                   "pyinfra's, 20 per CPU of this machine, within its open-files limit)")
    p.add_argument("--batch-instances", type=usage.count(1, "--batch-instances 2"),
                   default=None, metavar="K",
                   help="a host's servers restarted K at a time (after the first, alone), "
                   "only those out of the router, so the host keeps serving (default: the "
                   "host leaves the router whole)")
    p.add_argument("--data", action="append", default=[], metavar="KEY=VALUE",
                   type=usage.data_pair,
                   help="pyinfra data for the deploy, e.g. sglang.memory.page_size=64")
    p.add_argument("--drain-timeout", type=usage.seconds(0, 86400, "--drain-timeout 600"),
                   default=600, help="seconds to wait for a host's requests in flight "
                   "(0 to 86400, default 600)")
    p.add_argument("--health-timeout", type=usage.seconds(0, 86400, "--health-timeout 300"),
                   default=300, help="seconds for the router to see a host healthy again "
                   "(0 to 86400, default 300)")
    p.add_argument("--json", action="store_true", help="print what the roll did as JSON "
                   "(the runs' output goes to stderr)")
    p.set_defaults(func=cmd_roll)

    p = usage.command(
        sub, "status", help="one row per server and router of an inventory: unit, "
        "release, health, load, GPU memory and health, router (read-only)",
        description="Read every host of an inventory at once (SSH, as the deploy connects) "
        "and its servers and routers (HTTP): one row per server instance and router, fitted "
        "to the terminal (COLUMNS), then the fleet's capacity, throughput and job time, and "
        "the verdict: each unreachable host (its SSH error), server not active or not "
        "answering /health, fatal GPU finding and router not answering, or 'healthy'. "
        "Changes nothing. Exit status: 0 healthy, 1 unhealthy (any of those) or an input "
        "problem (the inventory or its data), 2 a usage error. With --json: the rows as a "
        "list of objects, the last of kind fleet with healthy, problems and unreachable (or "
        "the errors: {\"errors\": [...]}); the same exit status.",
        examples=["sglang-fleet status inventories/b200.py",
                  "sglang-fleet status inventories/b200.py --json",
                  "COLUMNS=200 sglang-fleet status inventories/b200.py",
                  "sglang-fleet status inventories/b200.py --data "
                  "sglang.server.router_connection=grpc"],
        exit_codes=["0  every host answered, every server active with /health 200, no fatal "
                    "GPU finding, every router answered",
                    "1  unhealthy: a host unreachable over SSH, a server not serving, a fatal "
                    "GPU finding or a router not answering; or an input problem",
                    "2  a usage error"])
    usage.files(p.add_argument("inventory", help=inventory_help))
    p.add_argument("--json", action="store_true", help="print the rows as JSON")
    p.add_argument("--data", action="append", default=[], metavar="KEY=VALUE",
                   type=usage.data_pair,
                   help="pyinfra data the deploy was given, e.g. sglang.parallel.instances=4 "
                   "(the servers are read as it set them up)")
    p.set_defaults(func=cmd_status)
