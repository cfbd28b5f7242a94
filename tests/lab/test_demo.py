"""The README's first command: ``uv run sglang-fleet demo`` boots two lab hosts, deploys, puts
the router in front and makes a smoke generation against each server and through the router;
``sglang-fleet lab down`` ends it.

Needs root (systemd-nspawn, overlay mounts); CI runs as root.
"""

from __future__ import annotations

import json
import os

import pytest

from tests.lab.conftest import run

pytestmark = pytest.mark.lab


def test_the_demo_serves_through_the_router_and_lab_down_ends_it() -> None:
    if os.geteuid() != 0:
        pytest.fail("the lab needs root (systemd-nspawn, overlay mounts): run the tests as root")
    try:
        result = run("sglang-fleet", "demo", timeout=1800)
        assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
        table = result.stdout.split("\nserver", 1)[1]
        for row in ("lab1", "lab2", "router"):
            assert f"\n{row} " in table, table
        assert "next: sglang-fleet roll inventories/lab.py" in result.stdout
    finally:
        assert run("sglang-fleet", "lab", "down").returncode == 0
    hosts = json.loads(run("sglang-fleet", "lab", "status", "--json").stdout)
    assert [h for h in hosts if h["running"]] == []
