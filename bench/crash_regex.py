"""The crash cause of one hostile journal line (a server's word of N letters before the
cause), with crash.py's patterns and with the ones it had before they were made linear: the
old ones tried ``\\w+`` from every letter, the square of the line's length.

    uv run python bench/crash_regex.py [--lengths 6000,12000,24000] [--new-only 1000000]
"""

from __future__ import annotations

import argparse
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager

from sglang_fleet.remote import crash

OLD = {"HIT": re.compile(r"(\w+) hit an exception: ?(.*)$"),
       "WATCHDOG_HANG": re.compile(r"\w+ watchdog timeout \(")}


@contextmanager
def old_patterns() -> Iterator[None]:
    new = {name: getattr(crash, name) for name in OLD}
    for name, pattern in OLD.items():
        setattr(crash, name, pattern)
    try:
        yield
    finally:
        for name, pattern in new.items():
            setattr(crash, name, pattern)


def seconds(length: int) -> float:
    line = "a" * length + " Scheduler hit an exception: RuntimeError: boom"
    start = time.perf_counter()
    assert crash.cause([line]) == "Scheduler hit an exception: RuntimeError: boom"
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lengths", default="6000,12000,24000",
                        help="line lengths timed with both (the old: minutes past 50,000)")
    parser.add_argument("--new-only", default="1000000", help="lengths timed with the new")
    args = parser.parse_args()
    print(f"{'letters':>10}  {'before (s)':>10}  {'now (s)':>8}")
    for length in (int(n) for n in args.lengths.split(",")):
        with old_patterns():
            before = seconds(length)
        print(f"{length:>10,}  {before:>10.3f}  {seconds(length):>8.4f}")
    for length in (int(n) for n in args.new_only.split(",") if n):
        print(f"{length:>10,}  {'-':>10}  {seconds(length):>8.4f}")


if __name__ == "__main__":
    main()
