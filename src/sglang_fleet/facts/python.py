"""Whether a Python interpreter on the host imports what a host program needs (a venv complete).

    if not host.get_fact(PythonImports, python="/opt/sglang/tools/bin/python",
                         modules=["boto3", "huggingface_hub"]):
        ...  # install them
"""

from __future__ import annotations

import re
import shlex

from pyinfra.api.facts import FactBase

_MODULE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


class PythonImports(FactBase[bool]):
    """True when ``python`` runs and imports every module of ``modules``; False otherwise (no
    such interpreter, a module missing or broken)."""

    def command(self, python: str, modules: list[str]) -> str:
        bad = [m for m in modules if not _MODULE.fullmatch(m)]
        if bad:
            raise ValueError(f"not a module name: {bad[0]!r}")
        code = "import " + ", ".join(modules)
        return (f"{shlex.quote(python)} -c {shlex.quote(code)} >/dev/null 2>&1 "
                "&& echo yes || echo no")

    def process(self, output: list[str]) -> bool:
        return [line.strip() for line in output][-1:] == ["yes"]
