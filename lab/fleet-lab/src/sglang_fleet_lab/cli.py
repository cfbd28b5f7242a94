"""The lab's commands, ``sglang-fleet lab up|down|status|ssh`` and ``sglang-fleet demo``.

The product's ``sglang-fleet`` hands these two commands here, importing this package only
when one of them runs; it reports bad input and bugs as for its own commands.

    main(["lab", "status", "--json"])
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path


def cmd_lab_up(args: argparse.Namespace) -> int:
    from sglang_fleet_lab import manage

    if args.hosts < 1 or args.hosts > 200 or args.gpus < 1:
        print("sglang-fleet lab up: --hosts must be 1..200 and --gpus at least 1",
              file=sys.stderr)
        return 2
    if args.sudo_user and not re.fullmatch(r"[a-z_][a-z0-9_-]{0,30}", args.sudo_user):
        print(f"sglang-fleet lab up: --sudo-user {args.sudo_user!r} is not a user name "
              "(lower-case letters, digits, _ and -)", file=sys.stderr)
        return 2
    manage.up(args.hosts, args.gpus, args.hgx, args.sudo_user or "")
    return 0


def cmd_lab_down(args: argparse.Namespace) -> int:
    from sglang_fleet_lab import manage

    manage.down()
    return 0


def cmd_lab_status(args: argparse.Namespace) -> int:
    from sglang_fleet_lab import manage

    hosts = manage.status()
    if args.json:
        print(json.dumps(hosts, indent=2))
    elif not hosts:
        print("no lab (sglang-fleet lab up)")
    for h in [] if args.json else hosts:
        state = h["state"]  # running, stopped, or running without nspawn
        print(f"{h['name']:<8}{h['address']:<14}{h['gpus']} GPU{'s' if h['gpus'] > 1 else ''}"
              f"{' HGX' if h['hgx'] else ''}  {state}")
    return 0


def cmd_lab_ssh(args: argparse.Namespace) -> int:
    from sglang_fleet_lab import hosts, state  # not manage: the lab's site imports pyinfra

    lab = state.load()
    host = hosts.find(lab, args.host)
    if host is None:
        known = ", ".join(h.name for h in lab.hosts) or "none (run: sglang-fleet lab up)"
        print(f"sglang-fleet lab: no host {args.host!r}; hosts: {known}", file=sys.stderr)
        return 1
    return hosts.ssh(host, lab, " ".join(args.command) or None, tty=not args.command).returncode


def cmd_demo(args: argparse.Namespace) -> int:
    """Lab up, the whole deploy, then a smoke generation against every host."""
    from sglang_fleet.config import profile
    from sglang_fleet.stages.gate.host import check_server
    from sglang_fleet_lab import manage, state
    from sglang_fleet_lab.site import REPO_ROOT

    lab = manage.up(args.hosts, args.gpus, False)
    # pyinfra of this environment, found without PATH: sglang-fleet may run from another venv's
    # bin directory; the inventory and deploys are the checkout's, so pyinfra runs there.
    pyinfra = str(Path(sys.executable).with_name("pyinfra"))
    for deploy in ("deploys/sglang.py", "deploys/router.py"):
        if subprocess.run([pyinfra, "-y", "inventories/lab.py", deploy],
                          cwd=REPO_ROOT).returncode:
            print(f"demo: {deploy} failed (see above)", file=sys.stderr)
            return 1
    key = lab.api_key()
    model = profile.load("qwen3.6-27b-mtp").model.served_name
    hosts = state.load().hosts
    targets = [(h.name, f"http://{h.address}:30000") for h in hosts]
    targets.append(("router", f"http://{hosts[0].address}:30080"))
    print(f"\n{'server':<8}{'answer':<24}{'TTFT':>8}{'tok/s':>8}{'accept':>8}")
    for name, url in targets:
        s = check_server.smoke(url, key, model)
        accept = f"{s['accept_length']:.2f}" if s["accept_length"] else "-"
        print(f"{name:<8}{s['answer'][:22]!r:<24}{s['ttft_s'] * 1000:>6.0f}ms"
              f"{s['tokens_per_s']:>8.0f}{accept:>8}")
    print("\nnext: sglang-fleet roll inventories/lab.py --data "
          "sglang.memory.max_running_requests=40; "
          "sglang-fleet lab down")
    return 0


def _add_lab(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    lab = sub.add_parser("lab", help="simulated B200 hosts on this machine (needs root)")
    lab_sub = lab.add_subparsers(dest="lab_command", required=True)
    p = lab_sub.add_parser("up", help="boot fresh lab hosts and the site around them")
    p.add_argument("--hosts", type=int, default=3, help="how many hosts (default 3)")
    p.add_argument("--gpus", type=int, default=8, help="B200s per host (default 8)")
    p.add_argument("--hgx", action="store_true", help="hosts are HGX boards (NVSwitch fabric)")
    p.add_argument("--sudo-user", metavar="NAME",
                   help="refuse root's SSH login; NAME logs in by key and has passwordless sudo")
    p.set_defaults(func=cmd_lab_up)
    p = lab_sub.add_parser("down", help="stop every host and service, unmount everything")
    p.set_defaults(func=cmd_lab_down)
    p = lab_sub.add_parser("status", help="the lab's hosts")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_lab_status)
    p = lab_sub.add_parser("ssh", help="a shell (or a command) on a lab host")
    p.add_argument("host")
    p.add_argument("command", nargs=argparse.REMAINDER)
    p.set_defaults(func=cmd_lab_ssh)


def parser() -> argparse.ArgumentParser:
    """The parser of ``sglang-fleet lab …`` and ``sglang-fleet demo``.

        parser().parse_args(["lab", "up", "--hosts", "2"]).hosts == 2
    """
    top = argparse.ArgumentParser(prog="sglang-fleet")
    sub = top.add_subparsers(dest="command", required=True)
    _add_lab(sub)
    p = sub.add_parser("demo", help="lab up, deploy, router, smoke: the whole product on lab hosts")
    p.add_argument("--hosts", type=int, default=2)
    p.add_argument("--gpus", type=int, default=8)
    p.set_defaults(func=cmd_demo)
    return top


def main(argv: Sequence[str]) -> int:
    """Run one lab command (``argv`` starts with ``lab`` or ``demo``); its exit status.

        main(["lab", "status"])  # prints the lab's hosts, returns 0
    """
    args = parser().parse_args(argv)
    code: int = args.func(args)
    return code
