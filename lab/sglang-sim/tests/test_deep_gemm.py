"""DeepGEMM's JIT precompile: paid on a cold cache, not on a warm one, keyed by release, GPU and
model, filled by compile_deep_gemm; its lines are SGLang's own."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import MODEL, REPO, Launcher, free_port
from sglang_sim import deep_gemm
from sglang_sim.model import load as load_model
from test_fidelity import _message, _strings

ENTERING = "Entering DeepGEMM JIT Pre-Compile session."
TRYING = "Try DeepGEMM JIT Compiling for <GEMM_NT_F8F8BF16>"
SHAPES = len(deep_gemm.gemms(load_model(str(MODEL)), 1))


def entries(root: Path) -> dict[str, float]:
    """Compiled kernels in a DeepGEMM cache: name → modification time."""
    return {p.name: p.stat().st_mtime for p in (root / "cache").glob("kernel.*")}


def progress_seconds(log: str) -> list[int]:
    """The elapsed seconds of each "DeepGEMM warmup" progress bar (tqdm's [mm:ss<...])."""
    return [int(m) * 60 + int(s) for m, s in
            re.findall(r"DeepGEMM warmup: 100%\|.*\| \d+/\d+ \[(\d\d):(\d\d)<00:00", log)]


def jit_env(root: Path, seconds: str = "0", **more: str) -> dict[str, str]:
    return {"SGLANG_SIM_JIT_SECONDS": seconds, "SGLANG_DG_CACHE_DIR": str(root), **more}


def test_cold_start_pays_the_compile_and_a_warm_start_does_not(sims: Launcher,
                                                               tmp_path: Path) -> None:
    root = tmp_path / "dg"
    cold = sims.start(env=jit_env(root, str(2 * SHAPES)))  # 2 s per GEMM shape
    cold.stop()
    compiled = entries(root)
    assert len(compiled) == SHAPES
    assert ENTERING in cold.output() and cold.output().count(TRYING) == SHAPES
    assert progress_seconds(cold.output()) == [2] * SHAPES
    warm = sims.start(env=jit_env(root, str(2 * SHAPES)))
    warm.stop()
    assert entries(root) == compiled  # nothing compiled again
    assert warm.output().count(TRYING) == SHAPES  # SGLang logs the session either way
    assert progress_seconds(warm.output()) == [0] * SHAPES


def test_another_release_gpu_or_model_is_cold_again(sims: Launcher, tmp_path: Path) -> None:
    root = tmp_path / "dg"
    sims.start(env=jit_env(root)).stop()
    seen = set(entries(root))
    assert len(seen) == SHAPES
    sims.start(env=jit_env(root, SGLANG_SIM_VERSION="0.5.19")).stop()
    assert len(set(entries(root)) - seen) == SHAPES
    seen = set(entries(root))
    h200 = tmp_path / "h200"
    h200.mkdir()
    (h200 / "nvidia-smi").write_text("#!/bin/sh\nfor i in 0 1 2 3 4 5 6 7; do "
                                     "echo \"$i, NVIDIA H200, 143771\"; done\n")
    (h200 / "nvidia-smi").chmod(0o755)
    sims.start(env=jit_env(root, PATH=f"{h200}:{os.environ['PATH']}")).stop()
    assert len(set(entries(root)) - seen) == SHAPES
    seen = set(entries(root))
    other = tmp_path / "model"
    other.mkdir()
    config = json.loads((MODEL / "config.json").read_text())
    config["text_config"]["intermediate_size"] = 13824
    (other / "config.json").write_text(json.dumps(config))
    sims.start(env=jit_env(root), model=other).stop()
    assert len(set(entries(root)) - seen) == 2  # gate/up and down change with the MLP width


def test_no_cost_and_no_lines_without_deepgemm(sims: Launcher, tmp_path: Path) -> None:
    sim = sims.start(env={"SGLANG_DG_CACHE_DIR": str(tmp_path / "dg")})
    sim.stop()
    assert TRYING not in sim.output() and not (tmp_path / "dg").exists()


@pytest.mark.parametrize(("release", "env", "expected"), [
    ("0.5.17", {}, "{home}/.cache/deep_gemm"),
    ("0.5.17", {"SGLANG_CACHE_DIR": "/c"}, "{home}/.cache/deep_gemm"),
    ("0.5.18", {}, "{home}/.cache/sglang/deep_gemm"),
    ("0.5.23", {"SGLANG_CACHE_DIR": "/c"}, "/c/deep_gemm"),
    ("0.5.23", {"SGLANG_CACHE_DIR": "/c", "SGLANG_DG_CACHE_DIR": "/d"}, "/d"),
    ("0.5.10", {"SGLANG_DG_CACHE_DIR": "/d"}, "/d"),
])
def test_cache_directory_is_the_releases(release: str, env: dict[str, str],
                                         expected: str) -> None:
    home = os.path.expanduser("~")
    assert deep_gemm.cache_dir(release, env) == Path(expected.format(home=home))


def compile_deep_gemm(root: Path, gpu_bin: Path, seconds: str,
                      *flags: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PATH": f"{gpu_bin}:{os.environ['PATH']}",
           "SGLANG_SIM_LOAD_SECONDS": "0.1", **jit_env(root, seconds)}
    return subprocess.run(
        [sys.executable, "-m", "sglang_sim.compile_deep_gemm", "--model-path", str(MODEL),
         "--port", str(free_port()), *flags], capture_output=True, text=True, env=env,
        timeout=120)


def test_compile_deep_gemm_fills_the_cache_a_later_start_uses(sims: Launcher, gpu_bin: Path,
                                                              tmp_path: Path) -> None:
    root = tmp_path / "dg"
    result = compile_deep_gemm(root, gpu_bin, str(SHAPES), "--tp", "1")
    assert result.returncode == 0, result.stderr
    assert "DeepGEMM Kernels compilation finished successfully." in result.stdout
    # In the precompile stage SGLang drops the session warning and the "1 sec" hint.
    assert ENTERING not in result.stderr and "It only takes" not in result.stderr
    assert result.stderr.count(TRYING) == SHAPES
    compiled = entries(root)
    assert len(compiled) == SHAPES
    sim = sims.start(env=jit_env(root, str(2 * SHAPES)))
    sim.stop()
    assert entries(root) == compiled
    assert progress_seconds(sim.output()) == [0] * SHAPES


def test_compile_deep_gemm_timeout_keeps_what_it_compiled(gpu_bin: Path, tmp_path: Path) -> None:
    root = tmp_path / "dg"
    result = compile_deep_gemm(root, gpu_bin, str(1.2 * SHAPES), "--timeout", "1")
    assert result.returncode == 1
    assert "TimeoutError: DeepGEMM Kernels compilation timeout." in result.stderr
    assert len(entries(root)) == SHAPES


@pytest.fixture(scope="module")
def sglang_source() -> Path:
    from sglang_sim import args as sim_args

    release = sim_args.default_version()
    result = subprocess.run([sys.executable, str(REPO / "scripts" / "sglang_oracle.py"),
                             "source", release], capture_output=True, text=True, timeout=1800)
    if result.returncode:
        pytest.fail(f"cannot unpack SGLang {release}'s source:\n{result.stderr[-2000:]}")
    return Path(result.stdout.strip()) / "sglang"


def test_lines_are_sglangs(sims: Launcher, gpu_bin: Path, tmp_path: Path,
                           sglang_source: Path) -> None:
    sim = sims.start(env=jit_env(tmp_path / "dg"))
    sim.stop()
    wrapper = sglang_source / "srt" / "layers" / "deep_gemm_wrapper" / "compile_utils.py"
    regexes = [rx for _, rx in _strings(wrapper)]
    ours = [_message(line) for line in sim.output().splitlines()
            if "DeepGEMM" in line or "Required memory for warmup" in line]
    ours = [m for m in ours if not m.startswith("DeepGEMM warmup: ")]  # tqdm's, not a log line
    assert len(ours) == 1 + 2 * SHAPES
    for line in ours:
        assert any(re.fullmatch(rx, line, re.S) for rx in regexes), line
    script = [text for text, _ in _strings(sglang_source / "compile_deep_gemm.py")]
    printed = compile_deep_gemm(tmp_path / "dg2", gpu_bin, "0").stdout
    for line in ("Disable CUDA Graph and Torch Compile to save time...",
                 "DeepGEMM Kernels compilation finished successfully.",
                 "Generate warm up request for compiling DeepGEMM..."):
        assert line in printed and any(line in text for text in script), line


@pytest.mark.parametrize(("release", "compiles"), [("0.5.18", 2), ("0.5.19", 1)])
def test_two_servers_starting_at_once_compile_twice_before_0_5_19_once_after(
        release: str, compiles: int, tmp_path: Path) -> None:
    """Two servers sharing the cache, starting together: DeepGEMM takes no lock (each compiles
    into a temporary directory and renames it; the loser throws its copy away), so up to
    0.5.18 both pay the compile; from 0.5.19 SGLang's _local_rank_compile_lock makes the
    second wait for each kernel group and find it compiled."""
    import logging
    import threading
    from argparse import Namespace

    env = jit_env(tmp_path, "2")
    shape = load_model(str(MODEL))
    counts: list[int] = []
    together = threading.Barrier(2)

    def start() -> None:
        together.wait()
        counts.append(deep_gemm.warmup(Namespace(tp_size=1, chunked_prefill_size=8192),
                                       release, shape, "NVIDIA B200", 100.0,
                                       logging.getLogger(f"sim-{release}"), env))

    servers = [threading.Thread(target=start) for _ in range(2)]
    for server in servers:
        server.start()
    for server in servers:
        server.join()
    # every kernel group compiled by one of them (1 each), or by both (2 each)
    assert sum(counts) == SHAPES * compiles, counts
    assert len(entries(tmp_path)) == SHAPES
    assert not list((tmp_path / "cache").glob(".tmp-*"))  # the loser's copies are gone
