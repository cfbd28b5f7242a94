"""Differential tests against SGLang's own argument parser, release by release.

The oracle (scripts/sglang_oracle.py) installs each release without dependencies into a CPU-only
environment (cached under ~/.cache/sglang-fleet/oracle) and runs ``ServerArgs.add_cli_args``'s
real parser. It needs ``uv`` and the package index; the first run builds a ~2 GB environment.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from typing import Any

import pytest

from sglang_fleet.config import flags, profile, releases
from sglang_fleet.config.render import render
from tests.conftest import PROFILES, ROOT

pytestmark = pytest.mark.oracle

BASE = ["--model-path", "/m"]
# Command lines whose fate changes between releases: removed, renamed, ambiguous, mistyped.
PROBES = [
    [*BASE, "--mamba-scheduler-strategy", "extra_buffer"],
    [*BASE, "--mamba-radix-cache-strategy", "extra_buffer"],
    [*BASE, "--mamba-radix-cache-strategy", "extra_buffer_lazy"],
    [*BASE, "--cuda-graph-max-bs", "8"],
    [*BASE, "--disable-piecewise-cuda-graph"],
    [*BASE, "--speculative-algo", "NEXTN"],
    [*BASE, "--speculative-algorithm", "MTP"],
    [*BASE, "--tp-size", "two"],
    [*BASE, "--mem-fraction-static", "0.9", "--enable-metrics", "--no-such-flag"],
    [*BASE, "--reasoning-parser", "qwen3", "--tool-call-parser", "qwen3_coder"],
    # what a rank 1 of a multi-node group renders (config/multinode.py), IPv6 rank 0 too
    [*BASE, "--tp-size", "16", "--nnodes", "2", "--dist-timeout", "900", "--node-rank", "1",
     "--dist-init-addr", "10.0.0.11:20000"],
    [*BASE, "--nnodes", "2", "--node-rank", "0", "--dist-init-addr", "[fd00::11]:20000"],
]


def real_parser(version: str, argvs: list[list[str]]) -> list[dict[str, Any]]:
    if shutil.which("uv") is None:
        pytest.fail("the SGLang parser oracle needs uv on PATH (pip install uv); "
                    ".ci/run installs it")
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "sglang_oracle.py"), "parse", version],
        input=json.dumps(argvs), capture_output=True, text=True, timeout=1800)
    if result.returncode:
        pytest.fail(f"the oracle could not run SGLang {version}'s parser:\n{result.stderr[-2000:]}")
    answers: list[dict[str, Any]] = json.loads(result.stdout)
    return answers


def table_parser(version: str, argv: list[str]) -> dict[str, Any]:
    try:
        return {"ok": True, "args": flags.load(version).parse(argv)}
    except flags.ArgvError as exc:
        return {"ok": False, "error": f"sglang.launch_server: error: {exc}"}


@pytest.mark.parametrize("version", releases.supported())
def test_rendered_argv_parses_with_the_real_parser(version: str) -> None:
    launches = [render(profile.load(p).for_gpus(8, "a test host"), version) for p in PROFILES]
    answers = real_parser(version, [list(launch.argv[3:]) for launch in launches] + PROBES)
    table = flags.load(version)
    for path, launch, answer in zip(PROFILES, launches, answers, strict=False):
        assert answer["ok"], f"{path.name}: SGLang {version} rejects it: {answer['error']}"
        emitted = {table.flags[w].dest for w in launch.argv[3:] if w in table.flags}
        for dest in emitted:
            assert answer["args"][dest] == launch.args[dest], (path.name, dest)
    for argv, real in zip(PROBES, answers[len(launches):], strict=True):
        ours = table_parser(version, argv)
        assert ours["ok"] == real["ok"], (argv, real, ours)
        if not real["ok"]:
            assert ours["error"] == real["error"]
    rank1, rank0 = answers[-2:]  # the group's flags: parsed, as the table reads them
    assert rank1["ok"] and rank0["ok"], (rank1, rank0)
    assert (rank1["args"]["node_rank"], rank1["args"]["dist_init_addr"]) == (1, "10.0.0.11:20000")
    assert rank0["args"]["dist_init_addr"] == "[fd00::11]:20000"
