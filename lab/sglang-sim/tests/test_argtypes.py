"""The simulator's argparse ``type=`` functions and the product's (config/argtypes.py): each side
copies SGLang's own, so neither is built from the other; this holds them to the same answers,
so the product never checks a flag one way and the lab's servers parse it another."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sglang_sim import args

from sglang_fleet.config import argtypes

# Every branch of every function: SI and IEC suffixes, decimals, blanks, None, JSON of each kind.
VALUES = ["42", " 7 ", "1k", "25.6k", "1Ki", "1.5Ki", "2Gi", "1.5", "x", "", "None", "[1, 2]",
          "{}", '{"breakable": 8}', '"s"', "nope", "tc_piecewise", "full"]


def answers(f: Callable[[str], Any]) -> list[tuple[str, Any]]:
    """What ``f`` makes of each value: the value, or the error's kind and message."""
    out: list[tuple[str, Any]] = []
    for value in VALUES:
        try:
            out.append(("value", f(value)))
        except Exception as e:
            out.append((type(e).__name__, str(e)))
    return out


def test_the_simulator_parses_flag_values_as_the_product_does() -> None:
    assert set(args._TYPES) == set(argtypes.BY_NAME)
    for name, product in argtypes.BY_NAME.items():
        sim = args._TYPES[name]
        assert sim.__name__ == product.__name__ == name  # argparse names it in its message
        assert answers(sim) == answers(product), name
