"""Compile once per fleet on three lab hosts behind the router: a roll to a release whose cold
DeepGEMM compile costs 20 s, two GPUs per host, each serving (the shipped profile's instances: auto:
no spare GPU to warm on). The first host compiles, the other two
receive its kernels through the controller before they restart and compile nothing; the files
end the service user's, every host records the same digest, and no archive or staging is left.

    sudo flock /tmp/sglang-lab.lock uv run pytest -n0 tests/lab/test_compile_once.py
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import pytest

from sglang_fleet import paths
from sglang_fleet.config import releases
from tests.lab.conftest import booted_lab, pyinfra, run, ssh

pytestmark = pytest.mark.lab
HOSTS = ("lab1", "lab2", "lab3")
GPUS = 2  # servers per host (instances: auto): a first that could compile, one after it
JIT = 20  # seconds of a cold compile: far above a warm start's load and capture (about 4 s)
KERNELS = f"{paths.CACHE}/deep_gemm/cache"


@pytest.fixture(scope="module")
def fleet() -> Iterator[None]:
    """Three hosts serving the pinned release (no DeepGEMM kernels yet) behind the router."""
    for _ in booted_lab("--hosts", "3", "--gpus", str(GPUS)):
        for deploy in ("deploys/sglang.py", "deploys/router.py"):
            result = pyinfra(deploy)
            assert result.returncode == 0, (result.stdout + result.stderr)[-5000:]
        yield


def roll(*data: str) -> tuple[int, str]:
    args = [a for d in data for a in ("--data", d)]
    result = run("sglang-fleet", "roll", "inventories/lab.py", *args, timeout=1800)
    return result.returncode, result.stdout + result.stderr


def ready(out: str, host: str) -> list[float]:
    """Each server's time to ready, from its gate's lines (named: a host's servers are checked
    at once)."""
    return [float(s) for s in
            re.findall(rf"\[{host}\] sglang-\d\.service: ready in ([\d.]+) s", out)]


def records(host: str, version: str) -> list[dict[str, object]]:
    """The host's records of what the kernels of ``version``'s release were compiled for."""
    listed = ssh(host, f"for f in {paths.COMPILED}/*-{version}-*.json; do cat $f; echo; done")
    return [json.loads(line) for line in listed.stdout.splitlines() if line.strip()]


def test_the_first_host_compiles_and_the_others_receive_its_kernels(fleet: None) -> None:
    other = releases.supported()[-2]
    code, out = roll(f"sglang.engine.version={other}",
                     f"sglang.env.SGLANG_SIM_JIT_SECONDS=\"{JIT}\"")
    assert code == 0, out[-5000:]
    assert "[lab1] kernels: compiles itself: the first host of the roll" in out, out[-5000:]
    assert max(ready(out, "lab1")) >= JIT  # lab1 paid the compile
    assert re.search(r"\[lab1\] shared the kernels compiled for [0-9a-f]{24}: \d+ files", out)
    kernels = ssh("lab1", f"ls {KERNELS}").stdout.split()
    assert kernels and all(k.startswith("kernel.") for k in kernels)
    for host in ("lab2", "lab3"):
        assert re.search(rf"\[{host}\] kernels: received from lab1: {len(kernels)} kernels "
                         "placed, 0 there already", out), out[-5000:]
        assert len(ready(out, host)) == GPUS and max(ready(out, host)) < JIT / 2  # no compile
        assert ssh(host, f"ls {KERNELS}").stdout.split() == kernels
        assert ssh(host, f"find {paths.CACHE}/deep_gemm ! -user {paths.USER}").stdout == ""
    table = out[out.rindex("out of router (s)"):]  # the roll's table: what each host did
    assert len(re.findall(r"^\s+kernels: received from lab1", table, re.M)) == 2, table
    digests = {host: [r["digest"] for r in records(host, other)] for host in HOSTS}
    assert len({tuple(d) for d in digests.values()}) == 1 and len(digests["lab1"]) == 1
    assert [r["source"] for r in records("lab2", other)] == ["received from lab1"]
    for host in HOSTS:  # nothing on its way is left behind
        assert ssh(host, f"ls -A {paths.CACHE_COPY}").stdout == ""
        assert ssh(host, f"ls -A {paths.CACHE} | grep -c '^.incoming' || true").stdout \
            .strip() == "0"


def test_a_roll_onto_kernels_every_host_has_copies_nothing(fleet: None) -> None:
    other = releases.supported()[-2]
    code, out = roll(f"sglang.engine.version={other}",
                     f"sglang.env.SGLANG_SIM_JIT_SECONDS=\"{JIT}\"",
                     "sglang.memory.max_running_requests=40")  # a restart, the same kernels
    assert code == 0, out[-5000:]
    assert "received from" not in out and "shared the kernels" not in out
    for host in ("lab2", "lab3"):
        assert f"[{host}] kernels: its cache holds the kernels compiled for" in out
        assert max(ready(out, host)) < JIT / 2
