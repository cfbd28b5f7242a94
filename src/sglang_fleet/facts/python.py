"""What a Python interpreter on the host has: the modules a host program needs, and which
distribution gives it DeepGEMM.

    host.get_fact(DeepGemm, python=release.python_bin)   # 'sgl-deep-gemm==0.2.3.post2'
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


# The distributions that install the module ``deep_gemm`` (sgl-deep-gemm from 0.5.12, bundled in
# sglang-kernel 0.4.1 by 0.5.10), read from the venv's metadata without importing it (no GPU).
_DEEP_GEMM = ("import importlib.metadata as m\n"
              "names = sorted(set(m.packages_distributions().get('deep_gemm', [])))\n"
              "print('DEEPGEMM', ' '.join(f'{n}=={m.version(n)}' for n in names) or 'none')")
_DIST = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*==[A-Za-z0-9][A-Za-z0-9.+!_-]*")


def parse_deep_gemm(lines: list[str]) -> str | None:
    """The ``DEEPGEMM`` line: ``name==version`` words (or ``none``), None when unreadable.

    >>> parse_deep_gemm(["DEEPGEMM sgl-deep-gemm==0.2.3.post2"])
    'sgl-deep-gemm==0.2.3.post2'
    """
    for line in lines:
        words = line.split()
        if words[:1] == ["DEEPGEMM"] and len(words) > 1:
            dists = words[1:]
            if dists == ["none"] or all(_DIST.fullmatch(d) for d in dists):
                return " ".join(dists)
    return None


class DeepGemm(FactBase[str | None]):
    """What installs DeepGEMM into ``python``'s environment (``sgl-deep-gemm==0.2.3.post2``,
    ``none``), None when the interpreter does not answer."""

    def command(self, python: str) -> str:
        return f"{shlex.quote(python)} -c {shlex.quote(_DEEP_GEMM)} 2>/dev/null || true"

    def process(self, output: list[str]) -> str | None:
        return parse_deep_gemm(output)
