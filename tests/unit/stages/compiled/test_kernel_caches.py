"""The cache environment per release (caches.py), and its claims checked against the real wheels.

The oracle tests read each release's own source from the oracle environment
(scripts/sglang_oracle.py source RELEASE) and the kernel libraries' wheels at the versions
caches.py cites (installed without dependencies under ~/.cache/sglang-fleet/oracle/wheels), so a
variable a release does not read, or a file:line that does not name the variable, fails.
"""

from __future__ import annotations

import fcntl
import re
import shutil
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

from sglang_fleet.config import releases
from sglang_fleet.config.render import Launch
from sglang_fleet.paths import CACHE
from sglang_fleet.stages.compiled import kernel_caches as caches
from sglang_fleet.stages.compiled.kernel_caches import (
    CACHES,
    PER_RELEASE,
    SHARED,
    Where,
    cache_env,
    caches_for,
    precompile_module,
)
from sglang_fleet.stages.service.deploy import environment
from tests.conftest import ROOT

ORACLE = Path.home() / ".cache" / "sglang-fleet" / "oracle"


def by_variable(name: str) -> caches.Cache:
    return next(c for c in CACHES if c.variable == name)


@pytest.mark.parametrize("version", releases.supported())
def test_every_cache_is_under_the_service_cache(version: str) -> None:
    for name, path in cache_env(version).items():
        assert path.startswith(f"{CACHE}/"), (name, path)


def test_shared_caches_are_shared_and_the_others_are_per_release() -> None:
    old, new = cache_env("0.5.19"), cache_env("0.5.23")
    for c in CACHES:
        if c.variable in old and c.variable in new:
            same = old[c.variable] == new[c.variable]
            assert same == (c.scope == SHARED), c.variable
    assert new["SGLANG_CACHE_DIR"] == f"{CACHE}/release/0.5.23/sglang"
    assert new["SGLANG_DG_CACHE_DIR"] == f"{CACHE}/deep_gemm"


def test_variables_follow_the_release() -> None:
    assert "SGLANG_JIT_CACHE_DIR" not in cache_env("0.5.17")
    assert "SGLANG_JIT_CACHE_DIR" in cache_env("0.5.18")
    assert "TILELANG_CACHE_DIR" not in cache_env("0.5.11")
    assert "TILELANG_CACHE_DIR" in cache_env("0.5.12.post1")
    assert "FLASH_ATTENTION_CUTE_DSL_CACHE_DIR" in cache_env("0.5.19")
    assert "FLASH_ATTENTION_CUTE_DSL_CACHE_DIR" not in cache_env("0.5.20")
    assert "SGLANG_CUTE_AOT_CACHE_DIR" in cache_env("0.5.23")


@pytest.mark.parametrize("bad", ["../../etc", "0.5.23/../x", "", "0.5.23 x"])
def test_a_version_that_is_not_one_cannot_name_a_directory(bad: str) -> None:
    with pytest.raises(ValueError, match="cannot name a cache directory"):
        cache_env(bad)


def test_the_unit_environment_points_the_caches_and_the_profile_still_wins() -> None:
    launch = Launch(version="0.5.13", argv=("python", "-m", "sglang.launch_server"),
                    env={"TRITON_CACHE_DIR": "/srv/triton"})
    text = environment(launch, {})
    assert f"SGLANG_DG_CACHE_DIR='{CACHE}/deep_gemm'" in text
    assert f"TORCH_EXTENSIONS_DIR='{CACHE}/release/0.5.13/torch_extensions'" in text
    assert "TRITON_CACHE_DIR='/srv/triton'" in text
    assert "SGLANG_JIT_CACHE_DIR" not in text  # 0.5.13 has no such variable


# --- claims against the real wheels ------------------------------------------------------------

def _uv() -> str:
    uv = shutil.which("uv")
    if uv is None:
        pytest.fail("the oracle needs uv on PATH (pip install uv); .ci/run installs it")
    return uv


@cache
def sglang_source(version: str) -> Path:
    """The directory holding the release's wheel contents (staged by the oracle)."""
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "sglang_oracle.py"),
                             "source", version], capture_output=True, text=True, timeout=1800)
    if result.returncode:
        pytest.fail(f"the oracle could not stage SGLang {version}:\n{result.stderr[-2000:]}")
    return Path(result.stdout.strip())


@cache
def sglang_text(version: str) -> str:
    """Every Python file of the release, concatenated (to search for a variable's name)."""
    package = sglang_source(version) / "sglang"
    return "\n".join(p.read_text(errors="replace") for p in sorted(package.rglob("*.py")))


def requirements(version: str) -> set[str]:
    meta = next(sglang_source(version).glob("sglang-*.dist-info/METADATA")).read_text()
    names = re.findall(r"^Requires-Dist: ([A-Za-z0-9_.-]+)", meta, re.M)
    return {n.lower().replace("-", "_") for n in names}


@cache
def wheel_root(dist: str, version: str) -> Path:
    """Where ``dist==version`` lies unpacked: the oracle environment when it holds that version,
    else a no-dependency install under the oracle's wheels directory."""
    if dist == "sglang":
        return sglang_source(version)
    site = next(ORACLE.glob("env/lib/python3*/site-packages"), None)
    norm = dist.replace("-", "_").lower()
    if site and any(d.name.lower().startswith(f"{norm}-{version}")
                    for d in site.glob("*.dist-info")):
        return site
    target = ORACLE / "wheels" / f"{norm}-{version}"
    ORACLE.mkdir(parents=True, exist_ok=True)
    with open(ORACLE / ".lock", "w") as held:  # the oracle script's lock: workers share it
        fcntl.flock(held, fcntl.LOCK_EX)
        if not (target / ".complete").exists():
            python = next(ORACLE.glob("env/bin/python"), Path(sys.executable))
            result = subprocess.run([_uv(), "pip", "install", "-q", "--no-deps", "--python",
                                     str(python), "--target", str(target), f"{dist}=={version}"],
                                    capture_output=True, text=True, timeout=1800)
            if result.returncode:
                pytest.fail(f"could not fetch {dist}=={version}: {result.stderr[-1500:]}")
            (target / ".complete").touch()
    return target


CITED = [(c.variable, w) for c in CACHES for w in c.read_by]


@pytest.mark.oracle
@pytest.mark.parametrize(("variable", "where"), CITED,
                         ids=[f"{v}@{w.dist}-{w.version}:{w.path}:{w.line}" for v, w in CITED])
def test_each_cited_line_names_its_variable(variable: str, where: Where) -> None:
    path = wheel_root(where.dist, where.version) / where.path
    if where.line == 0:  # a compiled library: the name is among its bytes
        assert (where.needle or variable).encode() in path.read_bytes(), (path, where.needle)
        return
    lines = path.read_text().splitlines()
    assert variable in lines[where.line - 1], f"{path}:{where.line}: {lines[where.line - 1]!r}"


@pytest.mark.oracle
@pytest.mark.parametrize("version", releases.supported())
def test_each_release_reads_the_variables_its_env_names(version: str) -> None:
    """SGLang's own variables occur in the release's source exactly when the env names them;
    a library's variable is named only when the release requires that library."""
    named = {c.variable for c in caches_for(version)}
    needs = requirements(version)
    for c in CACHES:
        if c.installed_by == "driver":  # the CUDA driver reads it, whatever the release
            assert c.variable in named
        elif c.installed_by:
            wanted = c.installed_by.replace("-", "_").lower() in needs
            assert (c.variable in named) == wanted, (c.variable, c.installed_by, version)
        else:
            present = re.search(rf"\b{c.variable}\b", sglang_text(version)) is not None
            assert (c.variable in named) == present, (c.variable, version, present)
    ships = (sglang_source(version) / "sglang" / "compile_deep_gemm.py").is_file()
    assert (precompile_module(version) is not None) == ships, version


@pytest.mark.oracle
def test_deep_gemm_cache_defaults_as_recorded() -> None:
    """The default each release replaces: ~/.cache/deep_gemm up to 0.5.17, then under
    SGLANG_CACHE_DIR (the README's table says so)."""
    dg = by_variable("SGLANG_DG_CACHE_DIR")
    for where in (w for w in dg.read_by if w.dist == "sglang" and w.path.endswith("environ.py")):
        line = (sglang_source(where.version) / where.path).read_text().splitlines()[where.line - 1]
        old = not releases.at_least(where.version, "0.5.18")
        assert ('"~/.cache/deep_gemm"' in line) == old, line
        assert ('_default_cache_subdir("deep_gemm")' in line) == (not old), line
    assert {c.scope for c in CACHES} == {SHARED, PER_RELEASE}
