"""The tests' simulator launcher (tests/conftest.py ``start_sim``): a port another process
took between ``free_port`` and the simulator's bind is given up for another, not mistaken for
the simulator because something answers on it."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests import conftest
from tests.conftest import Origin, start_sim, wait_for_health


def test_a_port_taken_before_the_bind_is_given_up_for_a_free_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    squatter = Origin({"/health": (200, {}, b"")})
    taken = int(squatter.url.rsplit(":", 1)[1])
    ports = iter([taken])
    free = conftest.free_port
    monkeypatch.setattr(conftest, "free_port", lambda: next(ports, None) or free())
    env = conftest.one_gpu_env(tmp_path)
    try:
        sim = start_sim(tmp_path, env=env)
        try:
            assert sim.url != squatter.url
            assert b"address already in use" in (tmp_path / f"sim-{taken}.log").read_bytes()
            wait_for_health(sim.url)  # bound, then ready after its warm-up
            assert httpx.get(sim.url + "/health", timeout=10).status_code == 200
        finally:
            sim.proc.kill()
            sim.proc.wait()
        with pytest.raises(AssertionError, match="address already in use"):
            start_sim(tmp_path, env=env, port=taken)  # a port asked for is not changed
    finally:
        squatter.close()
