"""The shipped inventories load, and every host's profile renders and passes preflight, without
reaching any host (the example's addresses look real: see tests/noconnect.py)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests import noconnect
from tests.conftest import ROOT


def test_b200_inventory_renders_for_every_host(tmp_path: Path) -> None:
    script = """
from pyinfra.api import Config, State
from pyinfra.api.inventory import Inventory
from pyinfra.context import ctx_state
from pyinfra_cli.inventory import make_inventory
from sglang_fleet import hostconfig as hostdata
from sglang_fleet.config import preflight
from sglang_fleet.config.render import render
ctx_state.set(State(Inventory(([], {})), Config()))  # loading an inventory needs a state
inventory = make_inventory("inventories/b200.py")
for host in inventory:
    profile = hostdata.profile_for(host)
    launch = render(profile)
    assert not preflight.check(profile, launch, preflight.resolve_architecture(profile))
    print(host.name, profile.model.source, profile.memory.max_mamba_cache_size,
          host.data.allow_reboot)
"""
    log = tmp_path / "connections"
    result = subprocess.run(["python", "-c", script], cwd=ROOT, capture_output=True, text=True,
                            env=noconnect.env(log))
    assert result.returncode == 0, result.stderr
    # The example never lets a deploy reboot a host unasked (group_data/b200.py says when to).
    assert result.stdout.splitlines() == ["b200-01 s3://models/qwen3.6-27b 240 False",
                                          "b200-02 s3://models/qwen3.6-27b 240 False"]
    assert noconnect.attempts(log) == []
