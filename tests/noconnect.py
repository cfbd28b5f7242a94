"""No test reaches the example inventory's hosts (``inventories/b200.py`` names real-looking
private addresses, 10.0.0.11 and 10.0.0.12): what a test may do with it, and the guards.

- In the test process: ``refuse_example_hosts`` (installed by ``tests/conftest.py``) refuses a
  connection to any address the example inventory names, before a packet leaves.
- In a process a test starts: ``env(log)`` as its environment refuses every connection outside
  this machine (``noconnect_site/sitecustomize.py``) and records each in ``log``;
  ``attempts(log)`` reads them back (a test asserts there were none).
- ``tests/examples/test_examples.py`` scans tests/, bench/, scripts/ and lab/: a function (or
  module) that names the example inventory starts no process without ``env=noconnect.env(...)``.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE_INVENTORY = ROOT / "inventories" / "b200.py"
SITE = Path(__file__).resolve().parent / "noconnect_site"
# Where the example's hosts and routers are reached: SSH addresses and URLs.
_ADDRESS = re.compile(r"""(?:ssh_hostname["']\s*:\s*["']|https?://)([0-9A-Za-z.:-]+?)["':/]""")


def example_addresses() -> set[str]:
    """The addresses the example inventory and its group data name."""
    text = EXAMPLE_INVENTORY.read_text() + (ROOT / "inventories" / "group_data" /
                                            "b200.py").read_text()
    return set(_ADDRESS.findall(text))


def refuse_example_hosts() -> None:
    """For the whole test process: a connection to an example host raises at once."""
    refused = example_addresses()

    def hook(event: str, args: tuple[Any, ...]) -> None:
        if event == "socket.connect" and isinstance(args[1], tuple) and args[1] and \
                str(args[1][0]) in refused:
            raise ConnectionRefusedError(f"noconnect: refused a connection to {args[1]!r}, a "
                                         "host of the example inventory inventories/b200.py")

    sys.addaudithook(hook)


def env(log: Path, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a process that must not leave this machine (``log`` collects what
    it tried)."""
    environ = dict(os.environ if base is None else base)
    path = environ.get("PYTHONPATH")
    environ["PYTHONPATH"] = f"{SITE}{os.pathsep}{path}" if path else str(SITE)
    environ["SGLANG_FLEET_NOCONNECT_LOG"] = str(log)
    return environ


def attempts(log: Path) -> list[str]:
    """The connections a guarded process tried (and was refused)."""
    return log.read_text().splitlines() if log.exists() else []
