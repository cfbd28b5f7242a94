"""bench/compile_once.py's reading of a roll's output and its table (the bench itself needs the
lab): which starts paid the compile, which were within load + capture + 10 s."""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType

from tests.conftest import ROOT


def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("compile_once", ROOT / "bench" /
                                                  "compile_once.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("compile_once", module)
    spec.loader.exec_module(module)
    return module


def ready(host: str, server: int, seconds: float, after_graphs: float,
          pool: str = "KV+mamba") -> str:
    """A gate's "ready in" line as the roll shows it (a host's servers, gated at once, named)."""
    return (f"[{host}] sglang-{server}.service: ready in {seconds} s: start→weights 2.0 s, "
            f"→{pool} 0.1 s, →graphs 1.6 s, →ready {after_graphs} s, →first generation 0.3 s")


# As the roll shows the gate's lines and the kernels' (lab1 compiled, lab2 received).
OUT = "\n".join([
    "[lab1] kernels: compiles itself: the first host of the roll with its inputs (...)",
    ready("lab1", 0, 125.1, 121.1), ready("lab1", 1, 4.2, 0.6),
    "[lab1] shared the kernels compiled for 0123: 4 files, 0 MB packed, on the controller",
    "[lab2] kernels: received from lab1: 4 kernels placed, 0 there already (0 MB in 1.4 s)",
    ready("lab2", 1, 4.3, 0.6, pool="KV"), ready("lab2", 0, 19.0, 15.3), ""])


def test_starts_are_read_with_their_host_and_server() -> None:
    found = bench().starts(OUT)
    assert [(s.host, s.server) for s in found] == [("lab1", 0), ("lab1", 1), ("lab2", 1),
                                                   ("lab2", 0)]
    assert found[0].ready == 125.1 and round(found[2].load_capture, 1) == 3.7
    assert [s.paid(120) for s in found] == [True, False, False, False]
    assert [s.within() for s in found] == [False, True, True, False]


def test_the_table_counts_the_compiles_and_the_starts_beyond_the_goal() -> None:
    module = bench()
    text = module.table(module.starts(OUT), 120, module.kernels(OUT), 300)
    assert "servers started: 4; paid the 120 s compile: 1 (goal 1)" in text
    assert "the other starts within load + capture + 10 s: 2 of 3; the slowest 15.3 s" in text
    assert "lab2: kernels: received from lab1" in text
    assert "lab1: shared the kernels compiled for 0123" in text
