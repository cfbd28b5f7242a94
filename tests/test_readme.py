"""The README's host-data table names every key the product reads from pyinfra's data, and
nothing else."""

from __future__ import annotations

import re

from tests.conftest import ROOT

SRC = ROOT / "src" / "sglang_fleet"
# Modules that read other mappings with .get (configs, JSON, lab state), not host data.
NOT_HOST_DATA = {"model_config.py", "flags.py", "releases.py", "profile.py", "schema.py",
                 "capacity.py", "status.py"}
# Packages that read no host data: the host programs, the generate client, the command line.
NOT_HOST_DATA_PACKAGES = {"remote", "generate", "cli"}
PYINFRA_OWN = {"ssh_hostname"}  # pyinfra's connector data, read for an address
READS = (
    re.compile(r"""data\.get\(\s*["']([a-z0-9_]+)["']"""),
    re.compile(r"""_int\(data, source, "([a-z0-9_]+)\""""),
    re.compile(r"""^[A-Z_]+_KEY = "([a-z0-9_]+)"$""", re.M),
    re.compile(r"""for key, default in \(\("([a-z0-9_]+)",[^)]*\),\s*\("([a-z0-9_]+)\"""", re.M),
)
TUPLES = re.compile(r"""^[A-Z_]+_KEYS = \(([^)]*)\)""", re.M)


def keys_read() -> set[str]:
    found: set[str] = set()
    for path in SRC.rglob("*.py"):  # the package's modules and its subpackages'
        if path.name in NOT_HOST_DATA or path.relative_to(SRC).parts[0] in NOT_HOST_DATA_PACKAGES:
            continue
        text = path.read_text()
        for pattern in READS:
            for match in pattern.finditer(text):
                found.update(g for g in match.groups() if g)
        for match in TUPLES.finditer(text):
            found.update(re.findall(r'"([a-z0-9_]+)"', match.group(1)))
    found.add("routers")  # the group, read through host.groups
    return found - PYINFRA_OWN


def keys_documented() -> set[str]:
    text = (ROOT / "README.md").read_text()
    section = text.split("\n## Host data\n", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|")[1] for line in section.splitlines() if line.startswith("| `")]
    return {k for row in rows for k in re.findall(r"`([a-z0-9_]+)`", row)}


def test_every_host_data_key_is_in_the_readme_table() -> None:
    read, documented = keys_read(), keys_documented()
    assert len(read) > 30, read  # the scan found the keys at all
    assert read - documented == set(), "read by the code, missing from the README table"
    assert documented - read == set(), "in the README table, read by no code"
