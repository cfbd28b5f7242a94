"""The gate of several servers of one host at once (standard library only): ``check_server``
for each in a process of its own, so a host's gate takes as long as its slowest server's.

    /usr/bin/env PYTHONPATH=/opt/sglang/tools/pythonpath python3 \\
        -m sglang_fleet.stages.gate.host.check_servers \\
        --servers '[["--unit", "sglang-0.service", ...],
                                                         ["--unit", "sglang-1.service", ...]]'

Prints, for each server in the order given, check_server's lines, then
``CHECKED {"unit": U, "exit": N}``; exits 0 when every server passed.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

from sglang_fleet.remote.terminal import printable

from . import check_server

DONE_MARK = "CHECKED"  # stages/gate/program.py splits the output at these lines


def servers(raw: str) -> list[list[str]]:
    """``--servers``: a JSON list of check_server argument lists, each with its ``--unit``.

        servers('[["--unit", "sglang-0.service", "--url", "http://127.0.0.1:30000"]]')
    """
    try:
        found = json.loads(raw)
    except ValueError:
        found = None
    if not isinstance(found, list) or not found or not all(
            isinstance(argv, list) and all(isinstance(a, str) for a in argv) and "--unit" in argv
            and argv.index("--unit") + 1 < len(argv) for argv in found):
        raise ValueError("--servers must be a JSON list of argument lists, each with --unit U")
    return found


def check(argv: list[str]) -> tuple[int, str]:
    """One server's check_server, in a process of its own: its exit status and output."""
    done = subprocess.run([sys.executable, "-m", check_server.__name__, *argv],
                          stdout=subprocess.PIPE, text=True, check=False)
    return done.returncode, done.stdout


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--servers", required=True, help="JSON: a list of check_server argv lists")
    args = ap.parse_args()
    try:
        todo = servers(args.servers)
    except ValueError as err:
        print(f"error: {err}")
        return 2
    with ThreadPoolExecutor(max_workers=len(todo)) as pool:
        done = list(pool.map(check, todo))
    for argv, (code, out) in zip(todo, done, strict=True):
        out = printable(out, lines=True)  # quotes servers and journals, whoever printed it
        sys.stdout.write(out if out.endswith("\n") or not out else out + "\n")
        unit = argv[argv.index("--unit") + 1]
        print(f"{DONE_MARK} " + json.dumps({"unit": unit, "exit": code}))
    return 0 if all(code == 0 for code, _ in done) else 1


if __name__ == "__main__":
    sys.exit(main())
