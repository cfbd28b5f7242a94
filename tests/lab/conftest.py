"""Lab tests boot hosts with systemd-nspawn: they need root, and say so when they lack it.

Each test worker runs its lab modules in a lab slot of its own (tests/conftest.py: lab_slot),
so every address and path a lab test uses comes from here, read from the slot's state: never
127.0.0.x written out.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from sglang_fleet_lab import hosts, state
from tests.conftest import ROOT

LAB = state.Lab()  # this worker's slot: its addresses and state directory, before any lab up
SITE = LAB.site_address  # the lab's site: 127.0.0.2 in slot 0, 127.0.k.2 in slot k
SSH_DIR = LAB.dir / "ssh"  # the lab's SSH key and known hosts, and its API keys
KEY_FILE = LAB.key_file("api")
ADMIN_KEY_FILE = LAB.key_file("admin")


def address(host: str) -> str:
    """A lab host's address by name: ``lab1`` is 127.0.0.11 in slot 0, 127.0.k.11 in slot k."""
    return state.host_address(int(host.removeprefix("lab")))


def url(host: str, port: int) -> str:
    """http://<host's address>:<port>."""
    return f"http://{address(host)}:{port}"


ROUTER = url("lab1", 30080)  # the lab inventory's router: on the first host


def run(*argv: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def pyinfra(*argv: str) -> subprocess.CompletedProcess[str]:
    return run("pyinfra", "-y", "inventories/lab.py", *argv)


def ssh(host: str, command: str) -> subprocess.CompletedProcess[str]:
    """``sglang-fleet lab ssh HOST COMMAND``, called in this process: the same SSH call, without
    the 2 s that starting the command line costs (an SSH call itself takes about 0.25 s)."""
    lab = state.load()
    found = hosts.find(lab, host)
    assert found is not None, f"no lab host {host!r} in slot {lab.slot}"
    return hosts.ssh(found, lab, command, capture=True)


def compile_seconds(host: str, unit: str, since: float) -> list[int]:
    """The seconds of each DeepGEMM warm-up pass ``unit`` logged since ``since`` (tqdm's
    "[MM:SS<" of compile_utils' "DeepGEMM warmup" bar, one per GEMM shape): a compile pays
    SGLANG_SIM_JIT_SECONDS over the shapes, a warm cache about nothing."""
    out = ssh(host, f"journalctl -u {unit} --since @{since:.0f} -o cat --no-pager "
                    "| grep 'DeepGEMM warmup: 100%' || true").stdout
    return [int(m) * 60 + int(s) for m, s in re.findall(r"\[(\d\d):(\d\d)<", out)]


def mounted_here() -> list[str]:
    """The mounts under this slot's state directory (other slots' labs may run beside it)."""
    prefix = f"{LAB.dir}/"
    return [line for line in Path("/proc/mounts").read_text().splitlines()
            if line.split()[1].startswith(prefix)]


def booted_lab(*flags: str) -> Iterator[None]:
    """A fresh lab for one test module (``sglang-fleet lab up FLAGS``), taken down after it."""
    if os.geteuid() != 0:
        pytest.fail("the lab needs root (systemd-nspawn, overlay mounts): run the tests as root")
    result = run("sglang-fleet", "lab", "up", *flags, timeout=900)
    assert result.returncode == 0, result.stdout + result.stderr
    yield
    run("sglang-fleet", "lab", "down")


def connects(host: str, to: str, port: int, user: str = "root", source: str = "") -> str:
    """What a TCP connection from ``host`` (as ``user``, from ``source``) to ``to:port`` meets:
    'open', 'refused' (a reset) or 'dropped' (no answer in 3 s)."""
    code = ("import socket, sys\n"
            "s = socket.socket(); s.settimeout(3)\n"
            f"s.bind(({source!r}, 0))\n"
            "try:\n"
            f"    s.connect(({to!r}, {port})); print('open')\n"
            "except ConnectionRefusedError: print('refused')\n"
            "except (TimeoutError, socket.timeout): print('dropped')\n")
    result = ssh(host, f"runuser -u {user} -- python3 -c {shlex.quote(code)}")
    return (result.stdout.strip().splitlines() or [result.stderr.strip()])[-1]
