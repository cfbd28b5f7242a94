#!/usr/bin/env python3
"""Write ``src/sglang_fleet/data/host-tools.lock.txt``: the staging tools' venv on hosts (boto3,
huggingface_hub) with every package's exact version and hashes, for the Pythons hosts have
(3.10: Ubuntu 22.04, 3.11: Debian 12, 3.12: Ubuntu 24.04) on any architecture.

    uv run python scripts/host_tools_lock.py

Versions this repository's uv.lock holds are kept (constraints), so hosts run what the tests
ran; the rest is the newest PyPI has. The weights stage installs it with ``uv pip sync
--require-hashes --no-build``: a package PyPI (or a mirror) swapped, or one without a wheel,
stops the install instead of reaching a host as root.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "src/sglang_fleet/data/host-tools.lock.txt"
TOP = ["boto3", "huggingface_hub"]  # what weights/host/download_model.py imports
HEADER = """\
# The staging tools' venv on hosts (/opt/sglang/tools): installed by the weights stage with
# `uv pip sync --require-hashes --no-build`. Do not edit: regenerate with
#     uv run python scripts/host_tools_lock.py
"""


def constraints() -> str:
    """package==version for every package of uv.lock that comes from a registry, where uv.lock
    applies (its requires-python: an older host Python takes the newest that supports it)."""
    lock = tomllib.loads((ROOT / "uv.lock").read_text())
    where = lock["requires-python"].removeprefix(">=")
    return "".join(f"{p['name']}=={p['version']} ; python_full_version >= '{where}'\n"
                   for p in lock["package"]
                   if "version" in p and "registry" in p.get("source", {}))


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        top, pins = Path(tmp, "host-tools.in"), Path(tmp, "constraints.txt")
        top.write_text("".join(f"{name}\n" for name in TOP))
        pins.write_text(constraints())
        done = subprocess.run(
            ["uv", "pip", "compile", "--quiet", "--universal", "--python-version", "3.10",
             "--generate-hashes", "--no-header", "--no-annotate", "-c", str(pins), str(top)],
            capture_output=True, text=True)
    if done.returncode:
        print(done.stderr, file=sys.stderr, end="")
        return 1
    OUT.write_text(HEADER + done.stdout)
    count = sum(1 for line in done.stdout.splitlines() if line[:1].isalnum())
    print(f"{OUT.relative_to(ROOT)}: {count} pins")
    return 0


if __name__ == "__main__":
    sys.exit(main())
