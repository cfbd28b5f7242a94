"""The staging tools' lock (src/sglang_fleet/data/host-tools.lock.txt): every package of the
venv that runs as root on hosts pinned to one version and its hashes, the versions the tests
run with."""

from __future__ import annotations

import re
import tomllib
from importlib import metadata

from packaging.markers import Marker
from packaging.requirements import Requirement

from sglang_fleet.stages.weights import deploy as weights
from tests.conftest import ROOT

PIN = re.compile(r"^([A-Za-z0-9._-]+)==([A-Za-z0-9.+!_-]+)(?: ; (.+?))? \\$")
HASH = re.compile(r"^    --hash=sha256:[0-9a-f]{64}(?: \\)?$")
# The hosts: Ubuntu 22.04 (3.10), Debian 12 (3.11), Ubuntu 24.04 (3.12), x86_64 and aarch64.
HOSTS = [{"python_version": v, "python_full_version": f"{v}.0", "platform_machine": m,
          "sys_platform": "linux", "platform_system": "Linux", "os_name": "posix",
          "implementation_name": "cpython", "platform_python_implementation": "CPython"}
         for v in ("3.10", "3.11", "3.12") for m in ("x86_64", "aarch64")]


def pins() -> list[tuple[str, str, str | None, int]]:
    """(name, version, marker, number of hashes) for each requirement of the lock."""
    found: list[tuple[str, str, str | None, int]] = []
    for line in weights.TOOLS_LOCK.read_text().splitlines():
        if not line or line.startswith("#"):
            continue
        if line.startswith("    "):
            assert HASH.match(line), line
            name, version, marker, hashes = found[-1]
            found[-1] = (name, version, marker, hashes + 1)
            continue
        match = PIN.match(line)
        assert match, f"not NAME==VERSION [; marker] \\: {line!r}"
        found.append((match[1].lower().replace("_", "-"), match[2], match[3], 0))
    return found


def on_host(env: dict[str, str]) -> dict[str, str]:
    return {name: version for name, version, marker, _ in pins()
            if marker is None or Marker(marker).evaluate(env)}


def test_every_package_is_pinned_with_hashes() -> None:
    found = pins()
    assert found and all(hashes >= 1 for *_, hashes in found), found
    for env in HOSTS:
        assert {"boto3", "huggingface-hub", "botocore", "s3transfer"} <= set(on_host(env))


def test_the_lock_holds_every_dependency_on_every_host() -> None:
    """Each locked package's own requirements are locked too (--require-hashes refuses a
    missing one on the host, and only there)."""
    checked = 0
    for env in HOSTS:
        locked = on_host(env)
        for name in locked:
            for text in _requires(name, locked[name]):
                req = Requirement(text)
                if req.marker and not req.marker.evaluate({**env, "extra": ""}):
                    continue
                key = req.name.lower().replace("_", "-")
                assert key in locked, f"{name} needs {req} on {env['python_version']} " \
                                      f"{env['platform_machine']}: not in the lock"
                assert req.specifier.contains(locked[key], prereleases=True), (name, req)
                checked += 1
    assert checked > 10  # boto3, botocore, s3transfer, ... were read


def test_versions_the_repository_locks_are_the_hosts_versions() -> None:
    repo = {p["name"]: p["version"] for p in tomllib.loads((ROOT / "uv.lock").read_text())
            ["package"] if "version" in p}
    for env in HOSTS[2:4]:  # 3.11, as uv.lock (requires-python >= 3.11)
        for name, version in on_host(env).items():
            if name in repo:
                assert version == repo[name], (name, version, repo[name])


def _requires(name: str, version: str) -> list[str]:
    """A locked package's requirements, from this venv when it holds that version (boto3 and
    its dependencies; the hub's closure is checked by `uv pip compile` itself)."""
    try:
        if metadata.version(name) == version:
            return metadata.requires(name) or []
    except metadata.PackageNotFoundError:
        pass
    return []
