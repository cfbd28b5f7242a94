"""Lab tests boot hosts with systemd-nspawn: they need root, and say so when they lack it."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator

import pytest

from tests.conftest import ROOT


def run(*argv: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def pyinfra(*argv: str) -> subprocess.CompletedProcess[str]:
    return run("pyinfra", "-y", "inventories/lab.py", *argv)


def ssh(host: str, command: str) -> subprocess.CompletedProcess[str]:
    return run("sglang-fleet", "lab", "ssh", host, command)


def booted_lab(*flags: str) -> Iterator[None]:
    """A fresh lab for one test module (``sglang-fleet lab up FLAGS``), taken down after it."""
    if os.geteuid() != 0:
        pytest.fail("the lab needs root (systemd-nspawn, overlay mounts): run the tests as root")
    result = run("sglang-fleet", "lab", "up", *flags, timeout=900)
    assert result.returncode == 0, result.stdout + result.stderr
    yield
    run("sglang-fleet", "lab", "down")
